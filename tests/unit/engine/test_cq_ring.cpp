/* SPDX-License-Identifier: MIT */
/*
 * The CQ ring protocol (lib/cq.h, shm_layout.h CqRing): a producer that
 * died holding a slot never stalls the consumer; a live one does; `prod`
 * is only a hint (stale, moved back, behind cons), the slots decide;
 * concurrent producers lose, duplicate and reorder nothing.
 */
#include <catch2/catch.hpp>

#include "cq.h"
#include "dead_pid.h"

#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

using namespace shmverbs;

namespace {

/* The ring is allocated with aligned new[]; it must be released with the
 * matching aligned delete[] (the default deleter would use the unaligned one). */
struct AlignedDelete {
	void operator()(char *p) const { ::operator delete[](p, std::align_val_t(64)); }
};

struct RingMem {
	uint32_t capacity;
	std::unique_ptr<char[], AlignedDelete> mem;
	shm::CqRing *ring;
	ClaimWatch watch; /* the consumer's */

	explicit RingMem(uint32_t cap) : capacity(cap)
	{
		size_t bytes = shm::cq_slots_offset + sizeof(shm::CqEntry) * cap;
		mem.reset(new (std::align_val_t(64)) char[bytes]());
		ring = new (mem.get()) shm::CqRing();
		cq_ring_init(*ring, cap);
		ring->limit.store(cap - 1);
	}
	shm::CqEntry &slot(uint64_t i)
	{
		auto *s = reinterpret_cast<shm::CqEntry *>(mem.get() + shm::cq_slots_offset);
		return s[i & (capacity - 1)];
	}
	int produce(uint64_t wr_id)
	{
		Completion c{};
		c.wc.wr_id = wr_id;
		CqTarget t = target();
		return cq_ring_produce(t, c, CqChannel::none());
	}
	/* What a producer leaves when it dies right after its claim (and,
	 * with move_prod false, before it noted it in prod). */
	void claim_as(uint32_t pid, bool move_prod = true)
	{
		uint64_t p = ring->prod.load();
		slot(p).state.store(shm::cq_slot_claimed | shm::cq_slot_tag(p, __builtin_ctz(capacity)) | pid);
		if (move_prod)
			ring->prod.store(p + 1);
	}
	/* A producer's view of the ring, as of a peer whose mapping is the
	 * ring's memory. */
	CqTarget target() const
	{
		return {ring, 0, 0, int64_t(shm::cq_slots_offset + sizeof(shm::CqEntry) * capacity)};
	}
	bool consume(Completion &c) { return cq_ring_consume(*ring, c, watch); }
	/* consume(), polling for up to a second (a dead producer's claim is
	 * skipped once it has been seen for a while: lib/cq.cpp). */
	bool consume_within(Completion &c)
	{
		for (int i = 0; i < 1000; i++) {
			if (consume(c))
				return true;
			usleep(1000);
		}
		return false;
	}
	/* The wr_ids of every completion ready now, in order. */
	std::vector<uint64_t> drain()
	{
		std::vector<uint64_t> got;
		Completion c;
		while (consume(c))
			got.push_back(c.wc.wr_id);
		return got;
	}
	/* drain(), after polling past any dead producer's claim. */
	std::vector<uint64_t> drain_within()
	{
		std::vector<uint64_t> got;
		Completion c;
		while (consume_within(c))
			got.push_back(c.wc.wr_id);
		return got;
	}
};

/* A producer that died and that nobody has reaped yet: a zombie, until the
 * returned pid is waited for. */
pid_t zombie_pid()
{
	pid_t pid = fork();
	if (pid == 0)
		_exit(0);
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
	for (int i = 0; i < 5000; i++) {
		char buf[256] = {};
		if (FILE *f = std::fopen(path, "re")) {
			size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
			std::fclose(f);
			buf[n] = 0;
			const char *paren = std::strrchr(buf, ')');
			if (paren && paren[1] == ' ' && paren[2] == 'Z')
				return pid;
		}
		usleep(1000);
	}
	return pid;
}

} // namespace

TEST_CASE("CQ ring: a slot claimed by a producer that died unreaped (zombie) is skipped",
	  "[cqring]")
{
	/* The parent of the dead producer may be the very process polling: it
	 * must not wait for its own waitpid(). */
	RingMem r(8);
	pid_t zombie = zombie_pid();
	r.claim_as(uint32_t(zombie));
	REQUIRE(r.produce(2) == 0);
	Completion c;
	bool got = r.consume_within(c);
	waitpid(zombie, nullptr, 0);
	REQUIRE(got);
	CHECK(c.wc.wr_id == 2);
}

TEST_CASE("CQ ring: a slot claimed by a dead producer is skipped", "[cqring]")
{
	RingMem r(8);
	REQUIRE(r.produce(1) == 0);
	r.claim_as(dead_pid());
	REQUIRE(r.produce(3) == 0);
	Completion c;
	REQUIRE(r.consume(c));
	CHECK(c.wc.wr_id == 1);
	REQUIRE(r.consume_within(c));
	CHECK(c.wc.wr_id == 3);
	CHECK_FALSE(r.consume(c));
}

TEST_CASE("CQ ring: a claim is asked about only once it outlives a live producer's write",
	  "[cqring]")
{
	/* A consumer polling the slot a live producer is filling sees the
	 * claim often; it asks whether the producer died (a system call)
	 * only of a claim that has stayed for a while. A dead producer's
	 * claim is therefore skipped after that while, not at first sight. */
	RingMem r(8);
	r.claim_as(dead_pid());
	REQUIRE(r.produce(2) == 0);
	Completion c;
	CHECK_FALSE(r.consume(c));
	REQUIRE(r.consume_within(c));
	CHECK(c.wc.wr_id == 2);
}

TEST_CASE("CQ ring: a slot claimed by a live producer holds the consumer", "[cqring]")
{
	RingMem r(8);
	r.claim_as(uint32_t(getpid()));
	REQUIRE(r.produce(2) == 0);
	Completion c;
	CHECK_FALSE(r.consume(c));
	/* However long it stays. */
	usleep(100000);
	CHECK_FALSE(r.consume(c));
	usleep(100000);
	CHECK_FALSE(r.consume(c));
}

TEST_CASE("CQ ring: laps reuse slots; a full ring overruns, never waits", "[cqring]")
{
	RingMem r(4);
	Completion c;
	for (uint64_t i = 0; i < 40; i++) {
		REQUIRE(r.produce(i) == 0);
		REQUIRE(r.produce(i + 1000) == 0);
		REQUIRE(r.consume(c));
		CHECK(c.wc.wr_id == i);
		REQUIRE(r.consume(c));
		CHECK(c.wc.wr_id == i + 1000);
	}
	REQUIRE(r.produce(1) == 0);
	REQUIRE(r.produce(2) == 0);
	REQUIRE(r.produce(3) == 0);
	CHECK(r.produce(4) == ENOSPC);
	CHECK(r.ring->overrun.load() == 1);
}

TEST_CASE("CQ ring: a producer dead between its claim and prod is skipped", "[cqring]")
{
	/* prod still names the dead producer's index: the next producer steps
	 * over that claimed slot. */
	RingMem r(8);
	REQUIRE(r.produce(1) == 0);
	r.claim_as(dead_pid(), false);
	REQUIRE(r.produce(3) == 0);
	REQUIRE(r.produce(4) == 0);
	CHECK(r.drain_within() == std::vector<uint64_t>{1, 3, 4});
}

TEST_CASE("CQ ring: prod is a hint; moved back, the next producer appends at the end",
	  "[cqring]")
{
	/* A slower producer's late store of prod may move it back. */
	RingMem r(8);
	for (uint64_t i = 1; i <= 3; i++)
		REQUIRE(r.produce(i) == 0);
	r.ring->prod.store(0);
	REQUIRE(r.produce(4) == 0);
	CHECK(r.ring->prod.load() == 4);
	CHECK(r.drain() == std::vector<uint64_t>{1, 2, 3, 4});
	/* And the consumer never looks at it: a hint left behind says nothing
	 * about what is there to poll. */
	r.ring->prod.store(1);
	Completion c;
	CHECK_FALSE(r.consume(c));
	REQUIRE(r.produce(5) == 0);
	CHECK(r.drain() == std::vector<uint64_t>{5});
}

TEST_CASE("CQ ring: a hint more than a lap behind cons is caught up, not chased", "[cqring]")
{
	/* Its slot holds a later lap's state: the index was taken and
	 * consumed. The producer starts from cons instead. */
	RingMem r(4);
	for (uint64_t i = 0; i < 10; i++) {
		REQUIRE(r.produce(i) == 0);
		REQUIRE(r.drain() == std::vector<uint64_t>{i});
	}
	REQUIRE(r.ring->cons.load() == 10);
	r.ring->prod.store(1);
	REQUIRE(r.produce(100) == 0);
	REQUIRE(r.produce(101) == 0);
	CHECK(r.drain() == std::vector<uint64_t>{100, 101});
	CHECK(r.ring->prod.load() == 12);
	/* The room is still counted from cons: three fit (limit 3), not four. */
	for (uint64_t i = 0; i < 3; i++)
		REQUIRE(r.produce(200 + i) == 0);
	CHECK(r.produce(203) == ENOSPC);
}

TEST_CASE("CQ ring: concurrent producers over many laps: every completion once, in order",
	  "[cqring][threads]")
{
	/* Three producers race for the claims (and move the hint back and
	 * forth), one consumer; each producer keeps at most 4 completions
	 * unpolled, so 12 < the limit of 15 and nothing overruns. */
	constexpr int producers = 3;
	constexpr uint64_t per_producer = 10000;
	RingMem r(16);
	std::atomic<uint64_t> polled[producers] = {};
	std::atomic<bool> stop{false};
	std::atomic<int> refused{0};
	std::vector<std::thread> threads;
	for (int t = 0; t < producers; t++)
		threads.emplace_back([&, t] {
			for (uint64_t i = 0; i < per_producer && !stop; i++) {
				while (i - polled[t].load(std::memory_order_acquire) >= 4 && !stop)
					std::this_thread::yield();
				Completion c{};
				c.wc.wr_id = (uint64_t(t) << 32) | i;
				CqTarget target = r.target();
				if (cq_ring_produce(target, c, CqChannel::none()) != 0) {
					refused++;
					stop = true;
				}
			}
		});
	uint64_t next[producers] = {};
	bool in_order = true;
	uint64_t total = 0;
	Completion c;
	while (total < producers * per_producer && !stop) {
		if (!r.consume(c)) {
			std::this_thread::yield();
			continue;
		}
		int t = int(c.wc.wr_id >> 32);
		uint64_t i = c.wc.wr_id & 0xffffffff;
		if (t >= producers || i != next[t]) {
			in_order = false;
			break;
		}
		next[t]++;
		total++;
		polled[t].store(next[t], std::memory_order_release);
	}
	stop = true; /* releases the producers if we failed */
	for (auto &t : threads)
		t.join();
	REQUIRE(in_order);
	CHECK(refused == 0);
	CHECK(total == producers * per_producer);
	CHECK_FALSE(r.consume(c));
	CHECK(r.ring->overrun.load() == 0);
}

/*
 * A producer that claimed the oldest slot and is still writing it (in
 * another process, preempted) while a later one publishes and raises the
 * event: the event is handed out once the oldest slot is published, so
 * that the poll after it finds a completion (rc_pingpong -e -t fails on
 * an empty CQ after an event).
 */
TEST_CASE("CQ ring: an event waits for a slot claimed before the completion that raised it",
	  "[cqring][channel]")
{
	using namespace std::chrono_literals;
	RingMem r(8);
	Cq cq{};
	cq.ring = r.ring;
	CompChannel ch{};
	ch.ibv.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	REQUIRE(ch.ibv.fd >= 0);
	ch.cqs.push_back(&cq);
	r.ring->arm.store(shm::cq_arm_next);
	auto get_event = [&] {
		return std::async(std::launch::async, [&] {
			Cq *got = nullptr;
			int rc = get_cq_event(ch, got);
			return std::make_pair(rc, got);
		});
	};

	SECTION("the claim's producer publishes")
	{
		r.claim_as(uint32_t(getpid()));
		Completion c{};
		c.wc.wr_id = 2;
		CqTarget target = r.target();
		REQUIRE(cq_ring_produce(target, c, CqChannel::of(ch.ibv.fd)) == 0);
		auto waiter = get_event();
		CHECK(waiter.wait_for(100ms) == std::future_status::timeout);
		r.slot(0).wr_id = 1;
		r.slot(0).state.store(shm::cq_slot_ready | shm::cq_slot_tag(0, 3));
		REQUIRE(waiter.wait_for(5s) == std::future_status::ready);
		auto [rc, got] = waiter.get();
		CHECK(rc == 0);
		CHECK(got == &cq);
		CHECK(r.drain() == std::vector<uint64_t>{1, 2});
	}
	SECTION("the claim's producer is dead: no wait")
	{
		r.claim_as(dead_pid());
		Completion c{};
		c.wc.wr_id = 2;
		CqTarget target = r.target();
		REQUIRE(cq_ring_produce(target, c, CqChannel::of(ch.ibv.fd)) == 0);
		/* Well before the wait's bound of a second. */
		auto waiter = get_event();
		REQUIRE(waiter.wait_for(500ms) == std::future_status::ready);
		CHECK(waiter.get().first == 0);
		CHECK(r.drain_within() == std::vector<uint64_t>{2});
	}
	::close(ch.ibv.fd);
}
