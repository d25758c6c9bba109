/* SPDX-License-Identifier: MIT */
/*
 * A receive queue's room as its CQs count it (lib/cq.h RqRoom,
 * cq_track_rq()): a WQE gives its place back when a poll hands out its
 * completion (ibv_poll_cq or a start_poll batch) or a clean drops it, as
 * libmlx5 moves a receive queue's tail; nothing before the poll, nothing
 * for send completions or other QPs' completions, in CQs that report
 * timestamps too, for any number of QPs on one CQ.
 */
#include <catch2/catch.hpp>

#include "cq_produce.h"
#include "qp_fixture.h"

#include <memory>
#include <vector>

using namespace shmverbs;

namespace {

/* Real CQs (with their rings) on the fixture's context. */
struct Cqs {
	qptest::Env env;
	std::vector<Cq *> made;

	~Cqs()
	{
		for (Cq *cq : made)
			destroy_cq(*cq);
	}
	Cq &cq(uint64_t wc_flags = 0)
	{
		struct ibv_cq_init_attr_ex a{};
		a.cqe = 256;
		a.wc_flags = wc_flags;
		Result<Cq> r = create_cq(*env.ctx, a, wc_flags != 0);
		REQUIRE(r);
		made.push_back(r.get());
		return *r.get();
	}
};

/* A completion of QP `qpn` as a sender's direct path writes it. */
void completion(Cq &cq, uint32_t qpn, uint64_t wr_id, enum ibv_wc_opcode opcode = IBV_WC_RECV,
		enum ibv_wc_status status = IBV_WC_SUCCESS)
{
	PlainCompletion c{wr_id, status, opcode, 8, 0, qpn, 0, 0, false};
	CqTarget target = own_cq_target(*cq.ring);
	REQUIRE(cq_ring_produce(target, c, CqChannel::none(), nullptr) == 0);
}

std::vector<uint64_t> poll_all(Cq &cq)
{
	std::vector<uint64_t> ids;
	struct ibv_wc wc[8];
	for (int n; (n = poll_cq(cq, 8, wc)) > 0;)
		for (int i = 0; i < n; i++)
			ids.push_back(wc[i].wr_id);
	return ids;
}

std::shared_ptr<RqRoom> track(Cq &cq, uint32_t qpn, uint64_t start = 0, bool shared = false)
{
	auto room = std::make_shared<RqRoom>(start, shared);
	cq_track_rq(cq, qpn, room);
	return room;
}

} // namespace

TEST_CASE("RQ room: a polled receive completion gives its WQE's place back", "[rqroom]")
{
	Cqs cqs;
	Cq &cq = cqs.cq(IBV_WC_STANDARD_FLAGS); /* extended: start_poll too */
	struct ibv_cq_ex *ex = &cq.ibv.cq_ex;
	auto room = track(cq, 77, 10);

	completion(cq, 77, 1);
	completion(cq, 78, 2); /* another QP's: not ours */
	completion(cq, 77, 3, IBV_WC_RECV_RDMA_WITH_IMM);
	completion(cq, 77, 4, IBV_WC_RDMA_WRITE); /* a send completion */
	completion(cq, 77, 5, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR); /* flushed: polled all the same */
	CHECK(room->freed.load() == 10); /* nothing before the poll */
	CHECK(poll_all(cq) == std::vector<uint64_t>{1, 2, 3, 4, 5});
	CHECK(room->freed.load() == 13);

	/* Through a start_poll batch too. */
	completion(cq, 77, 6);
	completion(cq, 77, 7);
	struct ibv_poll_cq_attr pa{};
	REQUIRE(ibv_start_poll(ex, &pa) == 0);
	CHECK(room->freed.load() == 14);
	REQUIRE(ibv_next_poll(ex) == 0);
	CHECK(room->freed.load() == 15);
	ibv_end_poll(ex);

	/* No longer tracked: nothing more. */
	cq_track_rq(cq, 77, nullptr);
	completion(cq, 77, 8);
	CHECK(poll_all(cq) == std::vector<uint64_t>{8});
	CHECK(room->freed.load() == 15);
}

TEST_CASE("RQ room: tracking drops an earlier QP's completions of that number", "[rqroom]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	/* Left by a destroyed QP 77 (its number handed out again): they are
	 * another queue's. The other QPs' completions stay, in order. */
	completion(cq, 77, 1);
	completion(cq, 78, 2);
	completion(cq, 77, 3);
	auto room = track(cq, 77);
	CHECK(poll_all(cq) == std::vector<uint64_t>{2});
	CHECK(room->freed.load() == 0);
}

TEST_CASE("RQ room: a clean gives back the receive WQEs of what it drops", "[rqroom]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	auto room = track(cq, 77);
	completion(cq, 77, 1);
	completion(cq, 77, 2, IBV_WC_SEND);
	completion(cq, 78, 3);
	completion(cq, 77, 4);
	CHECK(cq_clean(cq, 77) == 3);
	CHECK(room->freed.load() == 2); /* mlx5_cq_clean frees an SRQ's WQEs so */
	CHECK(poll_all(cq) == std::vector<uint64_t>{3});
}

TEST_CASE("RQ room: every QP of a CQ is counted, an SRQ's from several CQs", "[rqroom]")
{
	Cqs cqs;
	Cq &a = cqs.cq(), &b = cqs.cq();
	std::vector<std::shared_ptr<RqRoom>> rooms;
	for (uint32_t q = 0; q < 100; q++)
		rooms.push_back(track(a, 1000 + q));
	for (int round = 0; round < 2; round++)
		for (uint32_t q = 0; q < 100; q += 1 + q % 3)
			completion(a, 1000 + q, q);
	poll_all(a);
	std::vector<uint64_t> expected(100, 0);
	for (uint32_t q = 0; q < 100; q += 1 + q % 3)
		expected[q] = 2;
	for (uint32_t q = 0; q < 100; q++) {
		CAPTURE(q);
		CHECK(rooms[q]->freed.load() == expected[q]);
	}

	/* One SRQ's room, two QPs on two CQs. */
	auto srq = std::make_shared<RqRoom>(0, true);
	cq_track_rq(a, 7, srq);
	cq_track_rq(b, 8, srq);
	completion(a, 7, 1);
	completion(b, 8, 2);
	completion(b, 8, 3);
	poll_all(a);
	poll_all(b);
	CHECK(srq->freed.load() == 3);
}

TEST_CASE("RQ room: a CQ that reports timestamps counts too", "[rqroom]")
{
	Cqs cqs;
	Cq &cq = cqs.cq(uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
	auto room = track(cq, 77);
	completion(cq, 77, 1);
	CHECK(poll_all(cq) == std::vector<uint64_t>{1});
	CHECK(room->freed.load() == 1);
}
