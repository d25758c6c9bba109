/* SPDX-License-Identifier: MIT */
/*
 * The CQ ring protocol (lib/cq.h, shm_layout.h CqRing): a producer that
 * died holding a slot never stalls the consumer; a live one does.
 */
#include <catch2/catch.hpp>

#include "cq.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

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

	explicit RingMem(uint32_t cap) : capacity(cap)
	{
		size_t bytes = shm::cq_slots_offset + sizeof(shm::CqEntry) * cap;
		mem.reset(new (std::align_val_t(64)) char[bytes]());
		ring = new (mem.get()) shm::CqRing();
		ring->magic = shm::cq_magic;
		ring->capacity = cap;
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
		return cq_ring_produce(*ring, capacity, c, -1);
	}
	/* What a producer leaves when it dies right after its claim. */
	void claim_as(uint32_t pid)
	{
		uint64_t p = ring->prod.load();
		slot(p).state.store(shm::cq_slot_claimed | shm::cq_slot_tag(p, __builtin_ctz(capacity)) | pid);
		ring->prod.store(p + 1);
	}
};

uint32_t dead_pid()
{
	pid_t pid = fork();
	if (pid == 0)
		_exit(0);
	waitpid(pid, nullptr, 0);
	return uint32_t(pid);
}

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
	bool got = false;
	for (int i = 0; i < 200 && !got; i++) {
		got = cq_ring_consume(*r.ring, r.capacity, c);
		if (!got)
			usleep(1000);
	}
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
	REQUIRE(cq_ring_consume(*r.ring, r.capacity, c));
	CHECK(c.wc.wr_id == 1);
	REQUIRE(cq_ring_consume(*r.ring, r.capacity, c));
	CHECK(c.wc.wr_id == 3);
	CHECK_FALSE(cq_ring_consume(*r.ring, r.capacity, c));
}

TEST_CASE("CQ ring: a slot claimed by a live producer holds the consumer", "[cqring]")
{
	RingMem r(8);
	r.claim_as(uint32_t(getpid()));
	REQUIRE(r.produce(2) == 0);
	Completion c;
	CHECK_FALSE(cq_ring_consume(*r.ring, r.capacity, c));
}

TEST_CASE("CQ ring: laps reuse slots; a full ring overruns, never waits", "[cqring]")
{
	RingMem r(4);
	Completion c;
	for (uint64_t i = 0; i < 40; i++) {
		REQUIRE(r.produce(i) == 0);
		REQUIRE(r.produce(i + 1000) == 0);
		REQUIRE(cq_ring_consume(*r.ring, r.capacity, c));
		CHECK(c.wc.wr_id == i);
		REQUIRE(cq_ring_consume(*r.ring, r.capacity, c));
		CHECK(c.wc.wr_id == i + 1000);
	}
	REQUIRE(r.produce(1) == 0);
	REQUIRE(r.produce(2) == 0);
	REQUIRE(r.produce(3) == 0);
	CHECK(r.produce(4) == ENOSPC);
	CHECK(r.ring->overrun.load() == 1);
}
