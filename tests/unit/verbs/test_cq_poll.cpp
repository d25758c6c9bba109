/* SPDX-License-Identifier: MIT */
/*
 * The CQ's consumer lock through the public API: several threads polling
 * one CQ (ibv_poll_cq and start_poll..end_poll batches) while several
 * threads produce into it get every completion exactly once and each
 * producer's in order; the thread inside a batch may poll and resize the
 * same CQ (the lock is recursive); a thread waiting for another's batch
 * sleeps instead of spinning and gets the lock as soon as the batch ends;
 * a CQ resized while a completion event of its channel is taken.
 */
#include "cqsrq_helpers.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

using namespace cqsrq_test;
using namespace std::chrono_literals;

namespace {

struct ibv_cq_ex *create_cq_ex(struct ibv_context *ctx, uint32_t cqe)
{
	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = cqe;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	return ibv_create_cq_ex(ctx, &attr);
}

double thread_cpu_ms()
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

/* Runs fn on a detached thread and says whether it returned within `t`:
 * a deadlock fails the test instead of hanging it. */
template <typename Fn>
bool finishes_within(std::chrono::milliseconds t, Fn fn)
{
	auto done = std::make_shared<std::atomic<bool>>(false);
	std::thread([done, fn] {
		fn();
		done->store(true);
	}).detach();
	auto deadline = std::chrono::steady_clock::now() + t;
	while (!done->load() && std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(1ms);
	return done->load();
}

} // namespace

TEST_CASE("CQ: several pollers and producers: every completion once, each producer's in order",
	  "[cq][threads]")
{
	Device d;
	/* 255 entries: the ring goes round many times. */
	struct ibv_cq_ex *cqx = create_cq_ex(d.ctx, 255);
	REQUIRE(cqx);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	constexpr int producers = 3;
	constexpr uint32_t per_producer = 20000;
	constexpr int total = producers * int(per_producer);
	std::atomic<int> produced{0}, polled{0}, refused{0};
	std::atomic<bool> disorder{false};
	std::vector<std::atomic<uint8_t>> seen(total);

	/* What a poller saw of one completion: each poller's stream is a
	 * subsequence of the CQ's order, so a producer's numbers rise in it. */
	auto note = [&](uint64_t wr_id, std::vector<int64_t> &last) {
		int t = int(wr_id >> 32);
		int64_t i = int64_t(wr_id & 0xffffffff);
		if (t >= producers || i <= last[size_t(t)] || i >= int64_t(per_producer)) {
			disorder = true;
			return;
		}
		last[size_t(t)] = i;
		seen[size_t(t) * per_producer + size_t(i)]++;
		polled++;
	};
	/* A lost completion ends the test at the deadline, not in a hang. */
	const auto deadline = std::chrono::steady_clock::now() + 30s;
	auto going = [&] {
		return polled < total && !disorder && !refused &&
		       std::chrono::steady_clock::now() < deadline;
	};
	std::vector<std::thread> threads;
	for (int p = 0; p < 2; p++)
		threads.emplace_back([&] {
			std::vector<int64_t> last(producers, -1);
			struct ibv_wc wc[8];
			while (going()) {
				int n = ibv_poll_cq(cq, 8, wc);
				for (int k = 0; k < n; k++)
					note(wc[k].wr_id, last);
				if (n == 0)
					std::this_thread::yield();
			}
		});
	threads.emplace_back([&] {
		std::vector<int64_t> last(producers, -1);
		struct ibv_poll_cq_attr attr{};
		while (going()) {
			if (ibv_start_poll(cqx, &attr) != 0) {
				std::this_thread::yield();
				continue;
			}
			do
				note(cqx->wr_id, last);
			while (ibv_next_poll(cqx) == 0);
			ibv_end_poll(cqx);
		}
	});
	for (int t = 0; t < producers; t++)
		threads.emplace_back([&, t] {
			for (uint32_t i = 0; i < per_producer && !disorder && !refused; i++) {
				/* Well below 255 unpolled, whatever the others do. */
				while (produced - polled > 200 && going())
					std::this_thread::yield();
				struct ibv_wc wc = make_wc((uint64_t(t) << 32) | i);
				if (shmverbs_inject_completion(cq, &wc, 0) != 0)
					refused++;
				produced++;
			}
		});
	for (auto &t : threads)
		t.join();
	CHECK_FALSE(disorder);
	CHECK(refused == 0);
	CHECK(polled == total);
	int once = 0;
	for (auto &s : seen)
		once += s == 1;
	CHECK(once == total);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("CQ: inside its batch a thread may poll and resize the same CQ", "[cq][threads]")
{
	Device d;
	struct ibv_cq_ex *cqx = create_cq_ex(d.ctx, 15);
	REQUIRE(cqx);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	for (uint64_t i = 1; i <= 4; i++) {
		struct ibv_wc wc = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	}
	uint64_t in_batch = 0;
	int polled = -1, resized = -1;
	struct ibv_wc wc[4];
	REQUIRE(finishes_within(5000ms, [&] {
		struct ibv_poll_cq_attr attr{};
		if (ibv_start_poll(cqx, &attr) != 0)
			return;
		in_batch = cqx->wr_id;
		/* The lock this thread holds is taken again, and released
		 * once per taking. */
		polled = ibv_poll_cq(cq, 2, wc);
		resized = ibv_resize_cq(cq, 7);
		ibv_end_poll(cqx);
	}));
	CHECK(in_batch == 1);
	REQUIRE(polled == 2);
	CHECK(wc[0].wr_id == 2);
	CHECK(wc[1].wr_id == 3);
	CHECK(resized == 0);
	CHECK(cq->cqe == 7);
	/* Released for good: another thread polls what is left. */
	int n = -1;
	REQUIRE(finishes_within(5000ms, [&] { n = ibv_poll_cq(cq, 4, wc); }));
	REQUIRE(n == 1);
	CHECK(wc[0].wr_id == 4);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("CQ: a poller waiting for another thread's batch sleeps, and gets in when it ends",
	  "[cq][threads]")
{
	Device d;
	struct ibv_cq_ex *cqx = create_cq_ex(d.ctx, 15);
	REQUIRE(cqx);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	for (uint64_t i = 1; i <= 3; i++) {
		struct ibv_wc wc = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	}
	constexpr auto hold = 300ms;
	std::atomic<bool> in_batch{false};
	std::chrono::steady_clock::time_point ended;
	std::atomic<int> started{-1};
	std::thread batch([&] {
		struct ibv_poll_cq_attr attr{};
		started = ibv_start_poll(cqx, &attr);
		in_batch = true;
		if (started != 0)
			return;
		std::this_thread::sleep_for(hold);
		ended = std::chrono::steady_clock::now();
		ibv_end_poll(cqx);
	});
	while (!in_batch)
		std::this_thread::yield();
	if (started != 0)
		batch.join();
	REQUIRE(started == 0);
	const auto t0 = std::chrono::steady_clock::now();
	const double cpu0 = thread_cpu_ms();
	struct ibv_wc wc[4];
	int n = ibv_poll_cq(cq, 4, wc);
	const double cpu_ms = thread_cpu_ms() - cpu0;
	const auto t1 = std::chrono::steady_clock::now();
	batch.join();
	/* It waited for the batch (which took completion 1)... */
	REQUIRE(n == 2);
	CHECK(wc[0].wr_id == 2);
	CHECK(wc[1].wr_id == 3);
	const double waited_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
	CHECK(waited_ms >= 200);
	/* ...asleep, not spinning a core away... */
	CHECK(cpu_ms < waited_ms / 4);
	/* ...and was let in at the end, not after a long sleep of its own. */
	CHECK(std::chrono::duration<double, std::milli>(t1 - ended).count() < 100);
	CHECK(ibv_destroy_cq(cq) == 0);
}

/* ibv_get_cq_event() looks at every CQ of its channel (their rings' event
 * counts and oldest slots) while another thread may resize one of them,
 * which moves its slots: the header it reads stays, and the array is one
 * atomic word. (ThreadSanitizer, which CI runs this under, would report a
 * ring read while it is replaced.) */
TEST_CASE("CQ: events are taken while another CQ of the channel is resized", "[cq][threads]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	/* `moving` first in the channel's list: every event looks at it. */
	struct ibv_cq *moving = ibv_create_cq(d.ctx, 1, nullptr, ch, 0);
	struct ibv_cq *busy = ibv_create_cq(d.ctx, 15, nullptr, ch, 0);
	REQUIRE((moving && busy));
	std::atomic<bool> resized{false};
	std::atomic<int> resize_errors{0};
	std::thread resizer([&] {
		/* Each growth past the ring's capacity moves the ring. */
		for (int cqe = 2; cqe <= 4096; cqe *= 2)
			if (ibv_resize_cq(moving, cqe) != 0)
				resize_errors++;
		resized = true;
	});
	int wrong = 0;
	for (uint64_t i = 1; i <= 200 || !resized.load(); i++) {
		REQUIRE(ibv_req_notify_cq(busy, 0) == 0);
		struct ibv_wc wc = make_wc(i);
		REQUIRE(shmverbs_inject_completion(busy, &wc, 0) == 0);
		struct ibv_cq *got = nullptr;
		void *ctx = nullptr;
		REQUIRE(ibv_get_cq_event(ch, &got, &ctx) == 0);
		wrong += got != busy;
		ibv_ack_cq_events(got, 1);
		REQUIRE(ibv_poll_cq(busy, 1, &wc) == 1);
		CHECK(wc.wr_id == i);
	}
	resizer.join();
	CHECK(wrong == 0);
	CHECK(resize_errors == 0);
	CHECK(moving->cqe >= 4096);
	CHECK(ibv_destroy_cq(busy) == 0);
	CHECK(ibv_destroy_cq(moving) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/* A CQ that a QP uses outgrows its slot array again and again while two
 * other threads produce into it (as QPs of any process do; shm_layout.h
 * CqRing, "Resizing"): every completion arrives once, each thread's in
 * order, and the CQ never overruns (each producer keeps at most one
 * unpolled, so 2 < the first cqe of 3). */
TEST_CASE("CQ: grown beyond its ring while other threads complete into it, nothing is lost",
	  "[cq][threads][resize]")
{
	shmv_test::DeviceWithPd d;
	constexpr int producers = 2;
	for (int round = 0; round < 3; round++) {
		struct ibv_cq *cq = ibv_create_cq(d.ctx, 3, nullptr, nullptr, 0);
		REQUIRE(cq);
		struct ibv_qp_init_attr qa{};
		qa.send_cq = cq;
		qa.recv_cq = cq;
		qa.qp_type = IBV_QPT_RC;
		qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
		qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
		struct ibv_qp *qp = ibv_create_qp(d.pd, &qa);
		REQUIRE(qp);
		std::atomic<uint64_t> polled[producers] = {};
		std::atomic<bool> stop{false};
		std::atomic<int> refused{0};
		constexpr uint64_t per_producer = 4000;
		std::vector<std::thread> threads;
		for (int t = 0; t < producers; t++)
			threads.emplace_back([&, t] {
				for (uint64_t i = 0; i < per_producer && !stop; i++) {
					while (i != polled[t].load(std::memory_order_acquire) && !stop)
						std::this_thread::yield();
					struct ibv_wc wc = make_wc((uint64_t(t) << 32) | i);
					if (shmverbs_inject_completion(cq, &wc, 0) != 0) {
						refused++;
						stop = true;
					}
				}
			});
		uint64_t next[producers] = {};
		uint64_t total = 0;
		int resizes = 0, resize_errors = 0;
		bool in_order = true;
		const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
		while (total < producers * per_producer && !stop) {
			/* Each growth past the ring's capacity moves it. */
			if (resizes < 10 && total >= 250 + 700 * uint64_t(resizes)) {
				resize_errors += ibv_resize_cq(cq, cq->cqe * 2 + 1) != 0;
				resizes++;
			}
			struct ibv_wc wc[4];
			const int n = ibv_poll_cq(cq, 4, wc);
			if (n < 0 || std::chrono::steady_clock::now() > deadline)
				break;
			for (int k = 0; k < n; k++) {
				const int t = int(wc[k].wr_id >> 32);
				if (t >= producers || (wc[k].wr_id & 0xffffffff) != next[t]) {
					in_order = false;
					stop = true;
					break;
				}
				polled[t].store(++next[t], std::memory_order_release);
				total++;
			}
			if (!n)
				std::this_thread::yield();
		}
		stop = true;
		for (auto &t : threads)
			t.join();
		CAPTURE(round);
		CHECK(in_order);
		CHECK(refused == 0);
		CHECK(total == producers * per_producer);
		CHECK(resizes == 10);
		CHECK(resize_errors == 0);
		CHECK(cq->cqe == 4095);
		CHECK(ibv_destroy_qp(qp) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
}
