/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels through the public verbs API:
 * rounding, every argument error, channel fd semantics, arming, completion
 * events, destruction order and concurrency.
 */
#include "cqsrq_helpers.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

using namespace cqsrq_test;
using namespace std::chrono_literals;

namespace {

struct ibv_cq_ex *create_cq_ex(struct ibv_context *ctx, uint64_t wc_flags, uint32_t cqe = 16,
			       struct ibv_comp_channel *channel = nullptr)
{
	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = cqe;
	attr.wc_flags = wc_flags;
	attr.channel = channel;
	return ibv_create_cq_ex(ctx, &attr);
}

/* A blocking ibv_get_cq_event() on another thread. */
struct EventWaiter {
	struct ibv_comp_channel *ch;
	std::future<std::pair<int, struct ibv_cq *>> result;

	explicit EventWaiter(struct ibv_comp_channel *channel) : ch(channel)
	{
		result = std::async(std::launch::async, [this] {
			struct ibv_cq *cq = nullptr;
			void *cq_ctx = nullptr;
			int rc = ibv_get_cq_event(ch, &cq, &cq_ctx);
			return std::make_pair(rc, cq);
		});
	}
	bool woke_within(std::chrono::milliseconds t)
	{
		return result.wait_for(t) == std::future_status::ready;
	}
};

} // namespace

TEST_CASE("CQ sizes round as libmlx5: 2^ceil(log2(cqe+1)) - 1", "[cq]")
{
	Device d;
	const std::pair<int, int> table[] = {
		{1, 1}, {2, 3}, {3, 3}, {4, 7}, {100, 127}, {127, 127}, {128, 255},
		{1000, 1023}, {4194303, 4194303},
	};
	for (auto [asked, granted] : table) {
		CAPTURE(asked);
		struct ibv_cq *cq = ibv_create_cq(d.ctx, asked, nullptr, nullptr, 0);
		REQUIRE(cq);
		CHECK(cq->cqe == granted);
		CHECK(cq->context == d.ctx);
		CHECK(ibv_destroy_cq(cq) == 0);

		struct ibv_cq_ex *ex = create_cq_ex(d.ctx, IBV_WC_STANDARD_FLAGS, asked);
		REQUIRE(ex);
		CHECK(ex->cqe == granted);
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ex)) == 0);
	}
}

TEST_CASE("ibv_create_cq argument errors", "[cq]")
{
	Device d;
	struct ibv_device_attr attr;
	REQUIRE(ibv_query_device(d.ctx, &attr) == 0);
	REQUIRE(attr.max_cqe == 4194303);
	struct {
		int cqe;
		int comp_vector;
		int err;
	} const table[] = {
		{0, 0, EINVAL},
		{-1, 0, EINVAL},
		{attr.max_cqe + 1, 0, EINVAL},
		{16, d.ctx->num_comp_vectors, EINVAL},
		{16, -1, EINVAL},
	};
	for (auto t : table) {
		CAPTURE(t.cqe, t.comp_vector);
		errno = 0;
		CHECK(ibv_create_cq(d.ctx, t.cqe, nullptr, nullptr, t.comp_vector) == nullptr);
		CHECK(errno == t.err);
	}
	errno = 0;
	CHECK(ibv_create_cq(nullptr, 16, nullptr, nullptr, 0) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("a completion vector per online CPU, as mlx5_core's EQs", "[cq]")
{
	Device d;
	const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	REQUIRE(cpus >= 1);
	CHECK(d.ctx->num_comp_vectors == int(std::min(cpus, 64L)));
	for (int v = 0; v < d.ctx->num_comp_vectors; v++) {
		CAPTURE(v);
		struct ibv_cq *cq = ibv_create_cq(d.ctx, 4, nullptr, nullptr, v);
		REQUIRE(cq);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
}

TEST_CASE("a channel of another context is not an fd of this one (EBADF)", "[cq][channel]")
{
	Device a, b;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(b.ctx);
	REQUIRE(ch);
	errno = 0;
	CHECK(ibv_create_cq(a.ctx, 16, nullptr, ch, 0) == nullptr);
	CHECK(errno == EBADF);
	CHECK(ch->refcnt == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("ibv_create_cq_ex validation as libibverbs + libmlx5", "[cq][cq_ex]")
{
	Device d;
	struct Case {
		const char *what;
		uint32_t cqe;
		uint64_t wc_flags;
		uint32_t comp_mask;
		uint32_t flags;
		int err;
	} const table[] = {
		{"unknown wc_flags bit", 16, 1ull << 40, 0, 0, EOPNOTSUPP},
		{"wc_flags just above the known ones", 16, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK << 1, 0, 0,
		 EOPNOTSUPP},
		{"cqe 0", 0, IBV_WC_STANDARD_FLAGS, 0, 0, EINVAL},
		{"unknown comp_mask bit", 16, 0, 1u << 5, 0, EINVAL},
		{"unknown create flag", 16, 0, IBV_CQ_INIT_ATTR_MASK_FLAGS, 1u << 7, EINVAL},
		{"parent domain without one", 16, 0, IBV_CQ_INIT_ATTR_MASK_PD, 0, EINVAL},
		{"cqe over max_cqe", 4194304, 0, 0, 0, EINVAL},
	};
	for (const Case &t : table) {
		CAPTURE(t.what);
		struct ibv_cq_init_attr_ex attr{};
		attr.cqe = t.cqe;
		attr.wc_flags = t.wc_flags;
		attr.comp_mask = t.comp_mask;
		attr.flags = t.flags;
		errno = 0;
		CHECK(ibv_create_cq_ex(d.ctx, &attr) == nullptr);
		CHECK(errno == t.err);
	}

	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = 16;
	attr.comp_vector = uint32_t(d.ctx->num_comp_vectors);
	errno = 0;
	CHECK(ibv_create_cq_ex(d.ctx, &attr) == nullptr);
	CHECK(errno == EINVAL);

	/* Flags are read only with IBV_CQ_INIT_ATTR_MASK_FLAGS; both known
	 * flags are accepted. */
	attr.comp_vector = 0;
	attr.flags = 0xff;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(d.ctx, &attr);
	REQUIRE(cq);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	cq = ibv_create_cq_ex(d.ctx, &attr);
	REQUIRE(cq);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("ibv_cq_ex has the readers for the wc_flags requested", "[cq][cq_ex]")
{
	Device d;
	SECTION("every supported flag")
	{
		struct ibv_cq_ex *cq = create_cq_ex(d.ctx, IBV_CREATE_CQ_SUP_WC_FLAGS);
		REQUIRE(cq);
		CHECK(cq->start_poll);
		CHECK(cq->next_poll);
		CHECK(cq->end_poll);
		CHECK(cq->read_opcode);
		CHECK(cq->read_vendor_err);
		CHECK(cq->read_wc_flags);
		CHECK(cq->read_byte_len);
		CHECK(cq->read_imm_data);
		CHECK(cq->read_qp_num);
		CHECK(cq->read_src_qp);
		CHECK(cq->read_slid);
		CHECK(cq->read_sl);
		CHECK(cq->read_dlid_path_bits);
		CHECK(cq->read_completion_ts);
		CHECK(cq->read_cvlan);
		CHECK(cq->read_flow_tag);
		CHECK(cq->read_tm_info);
		CHECK(cq->read_completion_wallclock_ns);
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	}
	SECTION("only byte_len: the others stay NULL, as libmlx5 leaves them")
	{
		struct ibv_cq_ex *cq = create_cq_ex(d.ctx, IBV_WC_EX_WITH_BYTE_LEN);
		REQUIRE(cq);
		CHECK(cq->start_poll);
		CHECK(cq->read_opcode);
		CHECK(cq->read_byte_len);
		CHECK(cq->read_imm_data == nullptr);
		CHECK(cq->read_completion_ts == nullptr);
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	}
}

TEST_CASE("an empty CQ polls nothing: ibv_poll_cq 0, ibv_start_poll ENOENT", "[cq][poll]")
{
	Device d;
	struct ibv_cq_ex *cq = create_cq_ex(d.ctx, IBV_WC_STANDARD_FLAGS);
	REQUIRE(cq);
	struct ibv_wc wc[4];
	CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 4, wc) == 0);
	struct ibv_poll_cq_attr pattr{};
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);
	/* The lock was released: polling again works. */
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);
	pattr.comp_mask = 1;
	CHECK(ibv_start_poll(cq, &pattr) == EINVAL);
	CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 0) == 0);
	CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq), 1) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("ibv_cq_ex: the VLAN, flow tag and TM readers, installed only when asked for",
	  "[cq][poll]")
{
	Device d;
	struct ibv_cq_ex *plain = create_cq_ex(d.ctx, IBV_WC_STANDARD_FLAGS);
	REQUIRE(plain);
	/* As libmlx5: a reader not asked for is left unset. */
	CHECK(plain->read_cvlan == nullptr);
	CHECK(plain->read_flow_tag == nullptr);
	CHECK(plain->read_tm_info == nullptr);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(plain)) == 0);

	struct ibv_cq_ex *ex = create_cq_ex(d.ctx, uint64_t(IBV_WC_STANDARD_FLAGS) |
						 IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG |
						 IBV_WC_EX_WITH_TM_INFO);
	REQUIRE(ex);
	REQUIRE(ex->read_cvlan);
	REQUIRE(ex->read_flow_tag);
	REQUIRE(ex->read_tm_info);
	struct ibv_wc wc = make_wc(9);
	REQUIRE(shmverbs_inject_completion(ibv_cq_ex_to_cq(ex), &wc, 0) == 0);
	struct ibv_poll_cq_attr pattr{};
	REQUIRE(ibv_start_poll(ex, &pattr) == 0);
	CHECK(ex->wr_id == 9);
	/* No VLAN-tagged traffic, flow steering or tag matching here: zeros,
	 * and no IBV_WC_WITH_* flag claims otherwise. */
	CHECK(ibv_wc_read_cvlan(ex) == 0);
	CHECK(ibv_wc_read_flow_tag(ex) == 0);
	struct ibv_wc_tm_info tm;
	std::memset(&tm, 0xa5, sizeof(tm));
	ibv_wc_read_tm_info(ex, &tm);
	CHECK(tm.tag == 0);
	CHECK(tm.priv == 0);
	CHECK((ibv_wc_read_wc_flags(ex) & (IBV_WC_IP_CSUM_OK | IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID)) == 0);
	ibv_end_poll(ex);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ex)) == 0);
}

TEST_CASE("completions come out in order through both poll APIs", "[cq][poll]")
{
	Device d;
	struct ibv_cq_ex *ex = create_cq_ex(d.ctx, uint64_t(IBV_WC_STANDARD_FLAGS) |
						 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
	REQUIRE(ex);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(ex);
	for (uint64_t i = 1; i <= 5; i++) {
		struct ibv_wc wc = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	}

	struct ibv_wc wc[3];
	REQUIRE(ibv_poll_cq(cq, 3, wc) == 3);
	CHECK(wc[0].wr_id == 1);
	CHECK(wc[1].wr_id == 2);
	CHECK(wc[2].wr_id == 3);
	CHECK(wc[0].byte_len == 64);
	CHECK(wc[0].qp_num == 0x1234);

	struct ibv_poll_cq_attr pattr{};
	REQUIRE(ibv_start_poll(ex, &pattr) == 0);
	CHECK(ex->wr_id == 4);
	CHECK(ex->status == IBV_WC_SUCCESS);
	CHECK(ibv_wc_read_opcode(ex) == IBV_WC_RECV);
	CHECK(ibv_wc_read_byte_len(ex) == 64);
	CHECK(ibv_wc_read_qp_num(ex) == 0x1234);
	CHECK(ibv_wc_read_completion_ts(ex) != 0);
	REQUIRE(ibv_next_poll(ex) == 0);
	CHECK(ex->wr_id == 5);
	CHECK(ibv_next_poll(ex) == ENOENT);
	ibv_end_poll(ex);
	CHECK(ibv_poll_cq(cq, 3, wc) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("ibv_resize_cq rounds, keeps completions and refuses to drop them", "[cq][resize]")
{
	Device d;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0);
	REQUIRE(cq);
	REQUIRE(cq->cqe == 1);

	CHECK(ibv_resize_cq(cq, 100) == 0);
	CHECK(cq->cqe == 127);
	CHECK(ibv_resize_cq(cq, 127) == 0); /* the same size: nothing to do */
	CHECK(cq->cqe == 127);
	CHECK(ibv_resize_cq(cq, 128) == 0);
	CHECK(cq->cqe == 255);

	struct {
		int cqe;
		int err;
	} const bad[] = {{-1, EINVAL}, {0, EINVAL}, {4194304, EINVAL}, {0x7fffffff, EINVAL}};
	for (auto t : bad) {
		CAPTURE(t.cqe);
		CHECK(ibv_resize_cq(cq, t.cqe) == t.err);
		CHECK(cq->cqe == 255);
	}

	for (uint64_t i = 0; i < 10; i++) {
		struct ibv_wc wc = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	}
	CHECK(ibv_resize_cq(cq, 3) == EINVAL); /* 7 entries < 10 outstanding */
	CHECK(cq->cqe == 255);
	CHECK(ibv_resize_cq(cq, 10) == 0);     /* 15 entries hold them */
	CHECK(cq->cqe == 15);
	struct ibv_wc wc[16];
	REQUIRE(ibv_poll_cq(cq, 16, wc) == 10);
	for (int i = 0; i < 10; i++)
		CHECK(wc[i].wr_id == uint64_t(i));
	CHECK(ibv_resize_cq(nullptr, 10) == EINVAL);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("ibv_resize_cq: a ring outgrown moves its unpolled completions in order", "[cq][resize]")
{
	Device d;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 3, nullptr, nullptr, 0);
	REQUIRE(cq);
	REQUIRE(cq->cqe == 3); /* a ring of 4 */
	struct ibv_wc wc[8];
	/* Six taken and polled: the next index is 6, its slot the third, so
	 * that the three left unpolled wrap around the ring's end. */
	for (uint64_t i = 0; i < 6; i++) {
		struct ibv_wc one = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &one, 0) == 0);
		REQUIRE(ibv_poll_cq(cq, 1, wc) == 1);
	}
	for (uint64_t i = 6; i < 9; i++) {
		struct ibv_wc one = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &one, 0) == 0);
	}
	REQUIRE(ibv_resize_cq(cq, 100) == 0);
	CHECK(cq->cqe == 127);
	/* Completions written after the move follow the moved ones. */
	for (uint64_t i = 9; i < 11; i++) {
		struct ibv_wc one = make_wc(i);
		REQUIRE(shmverbs_inject_completion(cq, &one, 0) == 0);
	}
	REQUIRE(ibv_poll_cq(cq, 8, wc) == 5);
	for (int i = 0; i < 5; i++)
		CHECK(wc[i].wr_id == uint64_t(6 + i));
	CHECK(ibv_poll_cq(cq, 8, wc) == 0);
	/* The new ring holds all it promises: 127 more, not one beyond. */
	for (uint64_t i = 0; i < 127; i++) {
		struct ibv_wc one = make_wc(100 + i);
		REQUIRE(shmverbs_inject_completion(cq, &one, 0) == 0);
	}
	struct ibv_wc over = make_wc(999);
	CHECK(shmverbs_inject_completion(cq, &over, 0) == ENOSPC);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("ibv_modify_cq: moderation as mlx5_ib accepts it", "[cq][modify]")
{
	Device d;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
	REQUIRE(cq);
	struct {
		uint32_t mask;
		uint16_t count, period;
		int err;
	} const table[] = {
		{IBV_CQ_ATTR_MODERATE, 16, 10, 0},
		{IBV_CQ_ATTR_MODERATE, 0xffff, 0xfff, 0},
		{IBV_CQ_ATTR_MODERATE, 1, 0x1000, EINVAL},
		{0, 1, 1, EINVAL},
		{IBV_CQ_ATTR_RESERVED, 1, 1, EINVAL},
		{IBV_CQ_ATTR_MODERATE | IBV_CQ_ATTR_RESERVED, 1, 1, EINVAL},
	};
	for (auto t : table) {
		CAPTURE(t.mask, t.count, t.period);
		struct ibv_modify_cq_attr attr{};
		attr.attr_mask = t.mask;
		attr.moderate.cq_count = t.count;
		attr.moderate.cq_period = t.period;
		CHECK(ibv_modify_cq(cq, &attr) == t.err);
	}
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("NULL arguments fail with an error, never a crash", "[cq][channel]")
{
	Device d;
	CHECK(ibv_destroy_cq(nullptr) == EINVAL);
	CHECK(ibv_destroy_comp_channel(nullptr) == EINVAL);
	ibv_ack_cq_events(nullptr, 1);
	errno = 0;
	CHECK(ibv_create_comp_channel(nullptr) == nullptr);
	CHECK(errno == EINVAL);
	struct ibv_cq *cq;
	void *cq_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(nullptr, &cq, &cq_ctx) == -1);
	CHECK(errno == EINVAL);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, nullptr, &cq_ctx) == -1);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq_ex(d.ctx, nullptr) == nullptr);
	CHECK(errno == EINVAL);
	struct ibv_cq *real = ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0);
	REQUIRE(real);
	CHECK(ibv_poll_cq(real, 1, nullptr) < 0);
	CHECK(ibv_poll_cq(real, -1, nullptr) == 0);
	CHECK(ibv_modify_cq(real, nullptr) == EINVAL);
	CHECK(ibv_destroy_cq(real) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("the channel fd is a real fd: poll, epoll, O_NONBLOCK", "[channel]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	CHECK(ch->context == d.ctx);
	CHECK(ch->refcnt == 0);
	REQUIRE(ch->fd >= 0);
	CHECK(fcntl(ch->fd, F_GETFD) & FD_CLOEXEC);
	int cq_tag = 0;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, &cq_tag, ch, 0);
	REQUIRE(cq);
	CHECK(cq->channel == ch);
	CHECK(ch->refcnt == 1);

	/* Nothing pending: not readable, and a non-blocking read fails. */
	CHECK_FALSE(readable(ch->fd, 0));
	int fl = fcntl(ch->fd, F_GETFL);
	REQUIRE(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct ibv_cq *ev_cq = nullptr;
	void *ev_ctx = nullptr;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1);
	CHECK(errno == EAGAIN);

	int ep = epoll_create1(EPOLL_CLOEXEC);
	REQUIRE(ep >= 0);
	struct epoll_event eev{};
	eev.events = EPOLLIN;
	REQUIRE(epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &eev) == 0);
	struct epoll_event got[2];
	CHECK(epoll_wait(ep, got, 2, 0) == 0);

	/* Armed: one completion makes the fd readable and yields one event. */
	REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_wc wc = make_wc(7);
	REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK(readable(ch->fd, 1000));
	CHECK(epoll_wait(ep, got, 2, 1000) == 1);
	REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == cq);
	CHECK(ev_ctx == &cq_tag);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK_FALSE(readable(ch->fd, 0));
	CHECK(epoll_wait(ep, got, 2, 0) == 0);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1);
	CHECK(errno == EAGAIN);

	/* The request is one shot: the next completion raises nothing. */
	REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK_FALSE(readable(ch->fd, 50));

	::close(ep);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ch->refcnt == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("ibv_get_cq_event blocks until a completion reaches an armed CQ", "[channel]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	REQUIRE(cq);
	struct ibv_wc wc = make_wc(1);

	SECTION("armed: the completion wakes the waiter")
	{
		EventWaiter w(ch);
		CHECK_FALSE(w.woke_within(50ms));
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		bool woke = w.woke_within(5000ms);
		CHECK(woke);
		if (!woke) { /* release the thread before failing for good */
			ibv_req_notify_cq(cq, 0);
			shmverbs_inject_completion(cq, &wc, 0);
		}
		auto [rc, got] = w.result.get();
		CHECK(rc == 0);
		CHECK(got == cq);
		ibv_ack_cq_events(cq, 1);
	}
	SECTION("not armed: the completion does not wake it")
	{
		EventWaiter w(ch);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		CHECK_FALSE(w.woke_within(200ms));
		/* Arming covers the next completion, not the one queued. */
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		CHECK_FALSE(w.woke_within(200ms));
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		CHECK(w.woke_within(5000ms));
		auto [rc, got] = w.result.get();
		CHECK(rc == 0);
		CHECK(got == cq);
		ibv_ack_cq_events(cq, 1);
	}
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

namespace {

void on_sigusr1(int) {}

/* SIGUSR1 handled, with or without SA_RESTART, for the scope. */
struct Sigusr1 {
	struct sigaction old{};
	explicit Sigusr1(bool restart)
	{
		struct sigaction sa{};
		sa.sa_handler = on_sigusr1;
		sa.sa_flags = restart ? SA_RESTART : 0;
		sigemptyset(&sa.sa_mask);
		REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
	}
	~Sigusr1() { sigaction(SIGUSR1, &old, nullptr); }
};

/* A blocking call on a thread of its own, which a signal can be sent to. */
struct BlockedCall {
	std::atomic<bool> done{false};
	int rc = 0, err = 0;
	std::thread t;
	explicit BlockedCall(std::function<int()> call)
		: t([this, call] {
			  rc = call();
			  err = errno;
			  done = true;
		  })
	{
	}
	bool returned_within(std::chrono::milliseconds ms)
	{
		const auto end = std::chrono::steady_clock::now() + ms;
		while (!done && std::chrono::steady_clock::now() < end)
			std::this_thread::sleep_for(1ms);
		return done;
	}
	void signal() { REQUIRE(pthread_kill(t.native_handle(), SIGUSR1) == 0); }
	/* One that never returns cannot be joined nor abandoned safely: it
	 * ends the test binary (exit 1) after the failure was reported. */
	~BlockedCall()
	{
		if (!returned_within(5000ms)) {
			std::fprintf(stderr, "a blocked call never returned\n");
			std::_Exit(1);
		}
		t.join();
	}
};

/* ibv_get_cq_event() on `ch`, its CQ in *got if asked for. */
int next_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **got = nullptr)
{
	struct ibv_cq *cq = nullptr;
	void *cq_ctx = nullptr;
	const int rc = ibv_get_cq_event(ch, &cq, &cq_ctx);
	if (got)
		*got = cq;
	return rc;
}

} // namespace

/* Both calls are a read() of a uverbs fd on a device: a signal whose
 * handler has no SA_RESTART ends them with EINTR (harnesses break an
 * event thread out that way), one with SA_RESTART does not. */
TEST_CASE("a signal interrupts ibv_get_cq_event and ibv_get_async_event as read()", "[channel]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 1, nullptr, ch, 0);
	REQUIRE(cq);
	auto get_cq_event = [ch] { return next_cq_event(ch); };
	struct ibv_async_event ev{};
	auto get_async_event = [&] { return ibv_get_async_event(d.ctx, &ev); };
	struct ibv_wc wc = make_wc(1);
	{
		Sigusr1 handler(false);
		for (auto call : {std::function<int()>(get_cq_event), std::function<int()>(get_async_event)}) {
			BlockedCall c(call);
			CHECK_FALSE(c.returned_within(100ms));
			c.signal();
			REQUIRE(c.returned_within(5000ms));
			CHECK(c.rc == -1);
			CHECK(c.err == EINTR);
		}
	}
	{
		Sigusr1 handler(true);
		BlockedCall c(get_cq_event);
		CHECK_FALSE(c.returned_within(100ms));
		c.signal();
		CHECK_FALSE(c.returned_within(200ms));
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		REQUIRE(c.returned_within(5000ms));
		CHECK(c.rc == 0);
		ibv_ack_cq_events(cq, 1);
	}
	{
		Sigusr1 handler(true);
		BlockedCall c(get_async_event);
		CHECK_FALSE(c.returned_within(100ms));
		c.signal();
		CHECK_FALSE(c.returned_within(200ms));
		/* An overrun of the 1-entry CQ (one completion queued) raises
		 * IBV_EVENT_CQ_ERR. */
		CHECK(shmverbs_inject_completion(cq, &wc, 0) == ENOSPC);
		REQUIRE(c.returned_within(5000ms));
		CHECK(c.rc == 0);
		CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
		ibv_ack_async_event(&ev);
	}
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/* Two threads asleep in ibv_get_cq_event() on one channel: each event
 * wakes one of them, which returns it; none is passed back and forth. */
TEST_CASE("two threads asleep on one channel take one event each", "[channel][threads]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	REQUIRE(cq);
	auto get_cq_event = [ch] { return next_cq_event(ch); };
	struct ibv_wc wc = make_wc(1);
	{
		BlockedCall one(get_cq_event), two(get_cq_event);
		CHECK_FALSE(one.returned_within(100ms));
		CHECK_FALSE(two.returned_within(0ms));
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		const auto t0 = std::chrono::steady_clock::now();
		while (!one.done && !two.done && std::chrono::steady_clock::now() - t0 < 5000ms)
			std::this_thread::sleep_for(1ms);
		CHECK(one.done + two.done == 1);
		std::this_thread::sleep_for(100ms);
		CHECK(one.done + two.done == 1); /* the other sleeps on */
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		CHECK(one.returned_within(5000ms));
		CHECK(two.returned_within(5000ms));
		CHECK(one.rc == 0);
		CHECK(two.rc == 0);
	}
	ibv_ack_cq_events(cq, 2);
	struct ibv_wc out[2];
	CHECK(ibv_poll_cq(cq, 2, out) == 2);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/* uverbs queues a channel's completion events in one list: they come out
 * in the order they fired, whichever CQ they are of (a CQ made first
 * never starves the others). */
TEST_CASE("a channel's events come out in the order they fired, across its CQs", "[channel]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *a = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	struct ibv_cq *b = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	REQUIRE((a && b));
	struct ibv_wc wc = make_wc(1);
	auto fire = [&](struct ibv_cq *cq) {
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	};
	auto next_event = [&] {
		struct ibv_cq *got = nullptr;
		REQUIRE(next_cq_event(ch, &got) == 0);
		ibv_ack_cq_events(got, 1);
		return got;
	};
	fire(b);
	fire(a);
	fire(b); /* b's second, after a's */
	CHECK(next_event() == b);
	CHECK(next_event() == a);
	CHECK(next_event() == b);
	struct ibv_wc out[4];
	CHECK(ibv_poll_cq(a, 4, out) == 1);
	CHECK(ibv_poll_cq(b, 4, out) == 2);
	CHECK(ibv_destroy_cq(a) == 0);
	CHECK(ibv_destroy_cq(b) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("solicited-only arming wakes on solicited and failed completions", "[channel]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, nullptr, ch, 0);
	REQUIRE(cq);
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	struct {
		const char *what;
		enum ibv_wc_status status;
		int solicited;
		bool event;
	} const table[] = {
		{"unsolicited success", IBV_WC_SUCCESS, 0, false},
		{"solicited success", IBV_WC_SUCCESS, 1, true},
		{"unsolicited error", IBV_WC_REM_ACCESS_ERR, 0, true},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		struct ibv_wc drain[64];
		while (ibv_poll_cq(cq, 64, drain) > 0) {
		}
		REQUIRE(ibv_req_notify_cq(cq, 1) == 0);
		struct ibv_wc wc = make_wc(1, t.status);
		REQUIRE(shmverbs_inject_completion(cq, &wc, t.solicited) == 0);
		CHECK(readable(ch->fd, t.event ? 1000 : 50) == t.event);
		if (t.event) {
			REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
			ibv_ack_cq_events(ev_cq, 1);
		}
	}
	/* Arming reports the next completion (ibv_req_notify_cq(3)): one that
	 * is already queued, unpolled, raises no event; the next one does. */
	struct ibv_wc wc = make_wc(2);
	REQUIRE(shmverbs_inject_completion(cq, &wc, 1) == 0);
	REQUIRE(ibv_req_notify_cq(cq, 1) == 0);
	CHECK_FALSE(readable(ch->fd, 50));
	REQUIRE(shmverbs_inject_completion(cq, &wc, 1) == 0);
	CHECK(readable(ch->fd, 1000));
	REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/*
 * rdma-core's rc_pingpong -e -t: after each event it re-arms, then polls at
 * most two completions (start_poll, one next_poll) and fails if the next
 * event finds none. A completion that arrives after the re-arm raises the
 * next event, so the drain must leave it to that event.
 */
TEST_CASE("a drain after one event leaves the completion of the next event", "[channel][poll]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq_ex *ex = create_cq_ex(d.ctx, IBV_WC_STANDARD_FLAGS, 16, ch);
	REQUIRE(ex);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(ex);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	auto inject = [&](uint64_t wr_id) {
		struct ibv_wc wc = make_wc(wr_id);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
	};
	auto take_event = [&] {
		REQUIRE(readable(ch->fd, 1000));
		REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
		CHECK(ev_cq == cq);
		ibv_ack_cq_events(ev_cq, 1);
	};
	struct ibv_poll_cq_attr pattr{};

	REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
	inject(1);
	take_event();
	REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
	inject(2); /* after the re-arm: raises the next event */

	SECTION("ibv_start_poll batch")
	{
		REQUIRE(ibv_start_poll(ex, &pattr) == 0);
		CHECK(ex->wr_id == 1);
		CHECK(ibv_next_poll(ex) == ENOENT);
		ibv_end_poll(ex);
		take_event();
		REQUIRE(ibv_start_poll(ex, &pattr) == 0);
		CHECK(ex->wr_id == 2);
		CHECK(ibv_next_poll(ex) == ENOENT);
		ibv_end_poll(ex);
	}
	SECTION("ibv_poll_cq")
	{
		struct ibv_wc wc[4];
		REQUIRE(ibv_poll_cq(cq, 4, wc) == 1);
		CHECK(wc[0].wr_id == 1);
		take_event();
		REQUIRE(ibv_poll_cq(cq, 4, wc) == 1);
		CHECK(wc[0].wr_id == 2);
	}
	SECTION("a poller that never reads the event still gets every completion")
	{
		struct ibv_wc wc[4];
		inject(3); /* disarmed: no event */
		REQUIRE(ibv_poll_cq(cq, 4, wc) == 1);
		CHECK(wc[0].wr_id == 1);
		/* First of its poll call: returned although its event is
		 * unread, with what follows it. */
		REQUIRE(ibv_poll_cq(cq, 4, wc) == 2);
		CHECK(wc[0].wr_id == 2);
		CHECK(wc[1].wr_id == 3);
		take_event(); /* still there, for a completion polled already */
		CHECK(ibv_poll_cq(cq, 4, wc) == 0);
	}
	CHECK_FALSE(readable(ch->fd, 0));
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("ibv_destroy_comp_channel is EBUSY while a CQ uses it", "[channel][destroy]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *a = ibv_create_cq(d.ctx, 4, nullptr, ch, 0);
	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = 4;
	attr.channel = ch;
	struct ibv_cq_ex *b = ibv_create_cq_ex(d.ctx, &attr);
	REQUIRE(a);
	REQUIRE(b);
	CHECK(ch->refcnt == 2);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
	CHECK(ibv_destroy_cq(a) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(b)) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("ibv_destroy_cq waits until its completion events are acknowledged", "[cq][destroy]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	REQUIRE(cq);
	struct ibv_wc wc = make_wc(1);
	for (int i = 0; i < 2; i++) {
		REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
		REQUIRE(shmverbs_inject_completion(cq, &wc, 0) == 0);
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	}
	ibv_ack_cq_events(cq, 1); /* one of two */

	auto destroyed = std::async(std::launch::async, [cq] { return ibv_destroy_cq(cq); });
	CHECK(destroyed.wait_for(100ms) == std::future_status::timeout);
	ibv_ack_cq_events(cq, 1);
	REQUIRE(destroyed.wait_for(5000ms) == std::future_status::ready);
	CHECK(destroyed.get() == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("ibv_destroy_cq drops the events it never delivered", "[cq][destroy]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *gone = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	struct ibv_cq *kept = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
	REQUIRE(gone);
	REQUIRE(kept);
	struct ibv_wc wc = make_wc(1);
	REQUIRE(ibv_req_notify_cq(gone, 0) == 0);
	REQUIRE(shmverbs_inject_completion(gone, &wc, 0) == 0);
	REQUIRE(ibv_req_notify_cq(kept, 0) == 0);
	REQUIRE(shmverbs_inject_completion(kept, &wc, 0) == 0);

	/* No acknowledgement is owed for an event never read. */
	CHECK(ibv_destroy_cq(gone) == 0);
	REQUIRE(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == kept);
	ibv_ack_cq_events(ev_cq, 1);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1);
	CHECK(errno == EAGAIN);
	CHECK_FALSE(readable(ch->fd, 0));
	CHECK(ibv_destroy_cq(kept) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("CQ overrun raises IBV_EVENT_CQ_ERR; destroy waits for its ack", "[cq][overrun]")
{
	Device d;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0);
	REQUIRE(cq);
	REQUIRE(cq->cqe == 1);
	struct ibv_wc wc = make_wc(1);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == ENOSPC);
	REQUIRE(readable(d.ctx->async_fd, 1000));
	struct ibv_async_event ev;
	REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == cq);
	/* Once overrun, the CQ takes no more completions. */
	struct ibv_wc out[2];
	CHECK(ibv_poll_cq(cq, 2, out) == 1);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == ENOSPC);
	CHECK_FALSE(readable(d.ctx->async_fd, 0));

	auto destroyed = std::async(std::launch::async, [cq] { return ibv_destroy_cq(cq); });
	CHECK(destroyed.wait_for(100ms) == std::future_status::timeout);
	ibv_ack_async_event(&ev);
	REQUIRE(destroyed.wait_for(5000ms) == std::future_status::ready);
	CHECK(destroyed.get() == 0);
}

TEST_CASE("an IBV_EVENT_CQ_ERR not read yet dies with its CQ", "[cq][overrun]")
{
	Device d;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0);
	REQUIRE(cq);
	struct ibv_wc wc = make_wc(1);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == ENOSPC);
	REQUIRE(readable(d.ctx->async_fd, 1000));
	/* Not read, so nothing to wait for: destroy returns, and the event
	 * is gone with the CQ (it would name freed memory), its wake-up too. */
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK_FALSE(readable(d.ctx->async_fd, 0));
	REQUIRE(fcntl(d.ctx->async_fd, F_SETFL, fcntl(d.ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(d.ctx, &ev) != 0);
}

TEST_CASE("IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN drops silently", "[cq][overrun]")
{
	Device d;
	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = 1;
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	attr.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	struct ibv_cq_ex *ex = ibv_create_cq_ex(d.ctx, &attr);
	REQUIRE(ex);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(ex);
	struct ibv_wc wc = make_wc(1);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == ENOSPC);
	CHECK_FALSE(readable(d.ctx->async_fd, 50));
	struct ibv_wc out[2];
	CHECK(ibv_poll_cq(cq, 2, out) == 1);
	CHECK(shmverbs_inject_completion(cq, &wc, 0) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("concurrent create/destroy on one context", "[cq][threads]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	std::atomic<int> failures{0};
	std::vector<std::thread> threads;
	for (int t = 0; t < 4; t++)
		threads.emplace_back([&] {
			for (int i = 0; i < 200; i++) {
				struct ibv_cq *cq = ibv_create_cq(d.ctx, 8, nullptr, ch, 0);
				if (!cq || ibv_destroy_cq(cq) != 0)
					failures++;
			}
		});
	for (auto &t : threads)
		t.join();
	CHECK(failures == 0);
	CHECK(ch->refcnt == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("poll and notify from several threads lose no completion", "[cq][threads]")
{
	Device d;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	REQUIRE(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 4096, nullptr, ch, 0);
	REQUIRE(cq);
	constexpr int total = 20000;
	std::atomic<int> polled{0};
	std::atomic<bool> done{false};
	std::vector<std::thread> pollers;
	for (int t = 0; t < 3; t++)
		pollers.emplace_back([&] {
			struct ibv_wc wc[16];
			while (!done) {
				ibv_req_notify_cq(cq, 0);
				int n = ibv_poll_cq(cq, 16, wc);
				if (n > 0)
					polled += n;
			}
		});
	/* The injector stays well below the CQ's 4095 entries. */
	int delivered = 0, refused = 0;
	for (int i = 0; i < total; i++) {
		struct ibv_wc wc = make_wc(uint64_t(i));
		if (shmverbs_inject_completion(cq, &wc, 0) != 0) {
			refused++;
			break;
		}
		delivered++;
		while (delivered - polled > 2048)
			std::this_thread::yield();
	}
	CHECK(refused == 0);
	auto deadline = std::chrono::steady_clock::now() + 5s;
	while (polled < delivered && std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(1ms);
	done = true;
	for (auto &t : pollers)
		t.join();
	CHECK(polled == total);

	/* Drain and acknowledge the events the arming produced. */
	REQUIRE(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	unsigned events = 0;
	while (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0)
		events++;
	CHECK(events > 0);
	ibv_ack_cq_events(cq, events);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/* --- Other profiles (run as their own meson test with SHMVERBS_PROFILE) --- */

TEST_CASE("rxe: CQ sizes 2^k - 1, no ibv_modify_cq", "[.][rxe]")
{
	Device d;
	const std::pair<int, int> table[] = {{1, 1}, {100, 127}, {128, 255}};
	for (auto [asked, granted] : table) {
		CAPTURE(asked);
		struct ibv_cq *cq = ibv_create_cq(d.ctx, asked, nullptr, nullptr, 0);
		REQUIRE(cq);
		CHECK(cq->cqe == granted);
		struct ibv_modify_cq_attr attr{};
		attr.attr_mask = IBV_CQ_ATTR_MODERATE;
		CHECK(ibv_modify_cq(cq, &attr) == EOPNOTSUPP);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
	errno = 0;
	CHECK(ibv_create_cq(d.ctx, 32768, nullptr, nullptr, 0) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("exact: CQ sizes as asked", "[.][exact]")
{
	Device d;
	for (int asked : {1, 100, 128}) {
		CAPTURE(asked);
		struct ibv_cq *cq = ibv_create_cq(d.ctx, asked, nullptr, nullptr, 0);
		REQUIRE(cq);
		CHECK(cq->cqe == asked);
		CHECK(ibv_resize_cq(cq, asked + 1) == 0);
		CHECK(cq->cqe == asked + 1);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
}
