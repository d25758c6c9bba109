/* SPDX-License-Identifier: MIT */
/*
 * A CQ growing beyond its slot array (lib/cq.cpp resize_cq(), shm_layout.h
 * CqRing "Resizing"): the header stays, the slots move; a claim a live
 * producer has not published yet is waited for, and if it stays unpublished
 * for a second the resize gives up with nothing changed; a dead producer's
 * claim is left behind; a producer holding the old array claims in the new
 * one; a peer's word naming an array outside its mapping is never used.
 */
#include <catch2/catch.hpp>

#include "cq_produce.h"
#include "dead_pid.h"
#include "qp_fixture.h"

#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

using namespace shmverbs;

namespace {

struct OneCq {
	qptest::Env env;
	Cq *cq = nullptr;

	explicit OneCq(uint32_t cqe)
	{
		struct ibv_cq_init_attr_ex a{};
		a.cqe = cqe;
		Result<Cq> r = create_cq(*env.ctx, a, false);
		REQUIRE(r);
		cq = r.get();
	}
	~OneCq() { destroy_cq(*cq); }

	int produce(uint64_t wr_id)
	{
		CqTarget t = own_cq_target(*cq->ring);
		return produce_into(t, wr_id);
	}
	static int produce_into(CqTarget &t, uint64_t wr_id)
	{
		PlainCompletion c{wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, 8, 0, 1, 0, 0, false};
		return cq_ring_produce(t, c, CqChannel::none(), nullptr);
	}
	/* What a producer leaves when it stops right after its claim. */
	void claim_as(uint32_t pid)
	{
		shm::CqRing &ring = *cq->ring;
		const uint64_t word = ring.array.load();
		const uint64_t p = ring.prod.load();
		cq_detail::ring_array(ring, word).at(p)->state.store(
			shm::cq_slot_claimed | shm::cq_slot_tag(p, shm::cq_array_log2(word)) | pid);
		ring.prod.store(p + 1);
	}
	std::vector<uint64_t> poll_all()
	{
		std::vector<uint64_t> ids;
		struct ibv_wc wc[8];
		for (int n; (n = poll_cq(*cq, 8, wc)) > 0;)
			for (int i = 0; i < n; i++)
				ids.push_back(wc[i].wr_id);
		return ids;
	}
	uint32_t capacity() const { return cq_ring_capacity(*cq->ring); }
};

} // namespace

TEST_CASE("CQ resize: the slots move, the header stays, a held target follows", "[cqresize]")
{
	OneCq c(3);
	REQUIRE(c.capacity() == 4);
	shm::CqRing *header = c.cq->ring;
	/* A producer's view taken before the move (as a peer keeps one). */
	CqTarget held = own_cq_target(*header);
	REQUIRE(OneCq::produce_into(held, 1) == 0);
	const uint64_t before = held.array;
	REQUIRE(c.produce(2) == 0);
	REQUIRE(resize_cq(*c.cq, 100) == 0);
	CHECK(c.cq->ring == header);
	CHECK(c.capacity() == 128);
	CHECK(header->array.load() != before);
	REQUIRE(OneCq::produce_into(held, 3) == 0);
	CHECK(held.array == header->array.load());
	CHECK(c.poll_all() == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("CQ resize: a claim published late is waited for and keeps its place", "[cqresize]")
{
	OneCq c(3);
	REQUIRE(c.produce(1) == 0);
	c.claim_as(uint32_t(getpid())); /* index 1, being written */
	REQUIRE(c.produce(3) == 0);
	shm::CqRing &ring = *c.cq->ring;
	shm::CqEntry *late = cq_detail::current_array(ring).at(1);
	std::thread writer([&] {
		std::this_thread::sleep_for(std::chrono::milliseconds(50));
		late->wr_id = 2;
		late->status = IBV_WC_SUCCESS;
		late->state.store(shm::cq_slot_ready | shm::cq_slot_tag(1, 2),
				  std::memory_order_release);
	});
	const int rc = resize_cq(*c.cq, 100);
	writer.join();
	REQUIRE(rc == 0);
	CHECK(c.capacity() == 128);
	CHECK(c.poll_all() == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("CQ resize: a dead producer's claim is left behind", "[cqresize]")
{
	OneCq c(7);
	REQUIRE(c.produce(1) == 0);
	c.claim_as(dead_pid());
	REQUIRE(c.produce(2) == 0);
	REQUIRE(resize_cq(*c.cq, 20) == 0);
	CHECK(c.capacity() == 32);
	CHECK(c.poll_all() == std::vector<uint64_t>{1, 2});
	/* The new array holds all it promises from here. */
	for (uint64_t i = 0; i < 31; i++)
		REQUIRE(c.produce(10 + i) == 0);
	CHECK(c.produce(99) == ENOSPC);
}

TEST_CASE("CQ resize: a claim a live producer never publishes: EAGAIN, nothing changed",
	  "[cqresize]")
{
	OneCq c(3);
	REQUIRE(c.produce(1) == 0);
	c.claim_as(uint32_t(getpid()));
	const uint64_t word = c.cq->ring->array.load();
	const auto t0 = std::chrono::steady_clock::now();
	CHECK(resize_cq(*c.cq, 100) == EAGAIN);
	CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(900));
	CHECK(c.cq->ring->array.load() == word);
	CHECK(c.cq->ibv.cq.cqe == 3);
	/* The slots it had closed are free again: the next producer claims. */
	REQUIRE(c.produce(3) == 0);
	shm::CqEntry *held = cq_detail::current_array(*c.cq->ring).at(1);
	held->wr_id = 2;
	held->state.store(shm::cq_slot_ready | shm::cq_slot_tag(1, 2));
	CHECK(c.poll_all() == std::vector<uint64_t>{1, 2, 3});
}

TEST_CASE("CQ resize: a peer's array outside its mapping is never used", "[cqresize]")
{
	OneCq c(3);
	shm::CqRing &ring = *c.cq->ring;
	const uint64_t good = ring.array.load();
	/* A peer's view: its mapping is the header and the first array. */
	CqTarget peer{&ring, 0, 0, int64_t(cq_ring_bytes(4))};
	REQUIRE(OneCq::produce_into(peer, 1) == 0);
	CHECK(peer.array == good);
	for (uint64_t bad : {shm::cq_array_word(shm::cq_slots_offset, 3),   /* too big */
			     shm::cq_array_word(-64, 1),                    /* before it */
			     shm::cq_array_word(shm::cq_slots_offset + 8, 1), /* unaligned */
			     shm::cq_array_word(shm::cq_slots_offset, 0)}) { /* one slot */
		ring.array.store(bad);
		CHECK(OneCq::produce_into(peer, 2) == EFAULT);
		CHECK(peer.array == good);
	}
	ring.array.store(good);
	CHECK(c.poll_all() == std::vector<uint64_t>{1});
}

/* A producer that loaded the array word before a resize and claims only
 * after the consumer went on in the new array: whatever index it tries in
 * the old array (here one whose slot held a copied entry, which would read
 * as taken in an earlier lap: "full") sends it back to the word, never to
 * an overrun. */
TEST_CASE("CQ resize: a producer still holding the old array is sent to the new one",
	  "[cqresize]")
{
	OneCq c(3);
	REQUIRE(c.produce(1) == 0);
	REQUIRE(c.produce(2) == 0);
	shm::CqRing &ring = *c.cq->ring;
	CqTarget stale = own_cq_target(ring);
	REQUIRE(cq_detail::adopt_array(stale, ring.array.load()));
	REQUIRE(resize_cq(*c.cq, 100) == 0);
	for (uint64_t i = 3; i < 13; i++)
		REQUIRE(c.produce(i) == 0);
	CHECK(c.poll_all().size() == 12);
	uint64_t p = ring.prod.load(), tag = 0;
	int err = 0;
	CHECK(cq_detail::claim_slow(ring, stale.array, getpid(), ring.cons.load(), p, tag, nullptr,
				    nullptr, err) == nullptr);
	CHECK(err == EAGAIN);
	/* The whole produce() with that view: into the new array. */
	REQUIRE(OneCq::produce_into(stale, 13) == 0);
	CHECK(stale.array == ring.array.load());
	CHECK(c.poll_all() == std::vector<uint64_t>{13});
	CHECK(ring.overrun.load() == 0);
}

TEST_CASE("CQ resize: an owner that died mid-resize fails its producers at once, loudly",
	  "[cqresize]")
{
	OneCq c(3);
	shm::CqRing &ring = *c.cq->ring;
	REQUIRE(c.produce(1) == 0);
	/* What the owner leaves when it dies after closing the array: every
	 * slot moved, no new array named. */
	const cq_detail::RingArray a = cq_detail::current_array(ring);
	for (uint64_t i = 0; i < a.capacity(); i++)
		a.at(i)->state.store(shm::cq_slot_moved);
	CqTarget peer = own_cq_target(ring);
	REQUIRE(cq_detail::adopt_array(peer, ring.array.load()));
	/* A peer's target with the owner's death notice (its owner-alive
	 * word cleared by the kernel). */
	const int dead_owner = 0;
	peer.owner_alive = &dead_owner;
	const auto t0 = std::chrono::steady_clock::now();
	CHECK(OneCq::produce_into(peer, 2) == ENOSPC);
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
	/* Not lost silently: the CQ overran. */
	CHECK(ring.overrun.load() == 1);
}
