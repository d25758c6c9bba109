/* SPDX-License-Identifier: MIT */
/*
 * The RQ head a receive completion carries (shm_layout.h CqEntry::rq_head)
 * and what ibv_poll_cq() does with it (lib/cq.h cq_watch_rq()): the watcher
 * of the completion's QP learns the highest head polled, nobody else
 * learns anything, and a CQ that reports timestamps (where that word is the
 * time) watches no QP.
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
		a.cqe = 64;
		a.wc_flags = wc_flags;
		Result<Cq> r = create_cq(*env.ctx, a, wc_flags != 0);
		REQUIRE(r);
		made.push_back(r.get());
		return *r.get();
	}
};

/* A receive completion of QP `qpn` as a sender's direct path writes it. */
void recv_completion(Cq &cq, uint32_t qpn, uint64_t rq_head, uint64_t wr_id = 0)
{
	PlainCompletion c{wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, 8, 0, qpn, 0, 0, false};
	c.rq_head = rq_head;
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

} // namespace

TEST_CASE("RQ head: the watcher of a QP learns the highest head its CQ polled", "[rqhead]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	std::shared_ptr<RqHeadSeen> w = cq_watch_rq(cq, 77);
	REQUIRE(w);
	CHECK(w->head.load() == 0);

	recv_completion(cq, 77, 5, 1);
	recv_completion(cq, 78, 9, 2); /* another QP's: not ours */
	recv_completion(cq, 77, 0, 3); /* no head given */
	CHECK(w->head.load() == 0);    /* nothing before the poll */
	CHECK(poll_all(cq) == std::vector<uint64_t>{1, 2, 3});
	CHECK(w->head.load() == 5);

	/* Heads only grow: an older one (a completion overtaken by a later
	 * producer's) leaves it. */
	recv_completion(cq, 77, 7, 4);
	recv_completion(cq, 77, 6, 5);
	CHECK(poll_all(cq) == std::vector<uint64_t>{4, 5});
	CHECK(w->head.load() == 7);
}

TEST_CASE("RQ head: watching drops an earlier QP's completions of that number", "[rqhead]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	/* Left by a destroyed QP 77 (its number handed out again): their heads
	 * are another RQ's. The other QPs' completions stay, in order. */
	recv_completion(cq, 77, 40, 1);
	recv_completion(cq, 78, 3, 2);
	recv_completion(cq, 77, 41, 3);
	std::shared_ptr<RqHeadSeen> w = cq_watch_rq(cq, 77);
	REQUIRE(w);
	CHECK(poll_all(cq) == std::vector<uint64_t>{2});
	CHECK(w->head.load() == 0);
}

TEST_CASE("RQ head: a CQ watches a few QPs, and takes a slot again once its QP is gone",
	  "[rqhead]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	std::vector<std::shared_ptr<RqHeadSeen>> ws;
	for (uint32_t q = 100; q < 100 + cq.rq_heads.size(); q++) {
		ws.push_back(cq_watch_rq(cq, q));
		REQUIRE(ws.back());
	}
	CHECK_FALSE(cq_watch_rq(cq, 200)); /* full: QP 200 reads its RQ's head */

	ws[1].reset(); /* QP 101 went */
	std::shared_ptr<RqHeadSeen> w = cq_watch_rq(cq, 200);
	REQUIRE(w);
	recv_completion(cq, 101, 50, 1); /* nobody's any more */
	recv_completion(cq, 200, 4, 2);
	recv_completion(cq, 103, 8, 3); /* the last slot is still looked at */
	CHECK(poll_all(cq) == std::vector<uint64_t>{1, 2, 3});
	CHECK(w->head.load() == 4);
	CHECK(ws[3]->head.load() == 8);
}

TEST_CASE("RQ head: a completion of the general path gives none, whatever its timestamp",
	  "[rqhead]")
{
	Cqs cqs;
	Cq &cq = cqs.cq();
	std::shared_ptr<RqHeadSeen> w = cq_watch_rq(cq, 77);
	REQUIRE(w);
	/* As shmverbs_inject_completion() delivers one: stamped. */
	Completion c{};
	c.wc.wr_id = 1;
	c.wc.opcode = IBV_WC_RECV;
	c.wc.qp_num = 77;
	c.timestamp_ns = 123456789;
	REQUIRE(deliver_completion(cq, c) == 0);
	CHECK(poll_all(cq) == std::vector<uint64_t>{1});
	CHECK(w->head.load() == 0);
}

TEST_CASE("RQ head: a CQ that reports timestamps watches no QP", "[rqhead]")
{
	Cqs cqs;
	Cq &cq = cqs.cq(uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
	CHECK_FALSE(cq_watch_rq(cq, 77));
}
