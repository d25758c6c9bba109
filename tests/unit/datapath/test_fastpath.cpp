/* SPDX-License-Identifier: MIT */
/*
 * Completion timing of the fast path: a work request posted from inside an
 * ibv_start_poll() batch of its own CQ completes after that batch
 * (ibv_end_poll), as a device's completion arrives after the doorbell, so
 * that a completion event always finds a completion to poll (rc_pingpong
 * -e -t posts from its poll loop and treats ENOENT after an event as fatal).
 */
#include "loopback.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>

using namespace loopback;

/* The test hook of provider/verbs_qp.cpp: the next WR posted on `qp` is
 * number `next`. */
extern "C" int shmverbs_test_renumber_sq(struct ibv_qp *qp, uint32_t next);

namespace {

bool fired(struct ibv_comp_channel *ch, int ms)
{
	struct pollfd pfd = {ch->fd, POLLIN, 0};
	return poll(&pfd, 1, ms) == 1;
}

int post_signaled(Side &s, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t remote = 0,
		  uint32_t rkey = 0)
{
	struct ibv_send_wr wr{};
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	return Pair::post8(s, op, wr_id, wr);
}

/* One RDMA WRITE of `s` to `raddr` under `rkey`, through ibv_post_send or
 * the ibv_wr_* builders (`ex`). */
int post_write(Side &s, bool ex, uint64_t wr_id, struct ibv_sge sge, uint32_t rkey, uint64_t raddr,
	       unsigned flags = IBV_SEND_SIGNALED)
{
	if (!ex) {
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = flags;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
		return ibv_post_send(s.qp, &wr, &bad);
	}
	ibv_wr_start(s.qpx);
	s.qpx->wr_id = wr_id;
	s.qpx->wr_flags = flags;
	ibv_wr_rdma_write(s.qpx, rkey, raddr);
	if (flags & IBV_SEND_INLINE)
		ibv_wr_set_inline_data(s.qpx, reinterpret_cast<void *>(sge.addr), sge.length);
	else
		ibv_wr_set_sge(s.qpx, sge.lkey, sge.addr, sge.length);
	return ibv_wr_complete(s.qpx);
}

/* On a connected pair: WRITE 1's completion taken by an ibv_start_poll()
 * batch left open, and WRITE 2 posted from inside it (its completion held
 * for ibv_end_poll). */
void batch_holding_write(Pair &p)
{
	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE, 1, p.b.addr(512), p.b.mr->rkey) == 0);
	struct ibv_poll_cq_attr pa{};
	REQUIRE(ibv_start_poll(p.a.cqx, &pa) == 0);
	CHECK(p.a.cqx->wr_id == 1);
	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE, 2, p.b.addr(512), p.b.mr->rkey) == 0);
}

} // namespace

TEST_CASE("fast path: a WR posted inside a start_poll batch of its CQ completes at end_poll",
	  "[fastpath][cqex]")
{
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	o.channel = true;
	Pair p(o);
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 7, 0, 64) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE, 1, p.b.addr(512), p.b.mr->rkey) == 0);
	REQUIRE(ibv_req_notify_cq(p.a.cq, 0) == 0);

	struct ibv_poll_cq_attr pa{};
	REQUIRE(ibv_start_poll(p.a.cqx, &pa) == 0);
	CHECK(p.a.cqx->wr_id == 1);
	/* Posted from inside the batch: not part of it, no event yet. */
	REQUIRE(post_signaled(p.a, IBV_WR_SEND, 2) == 0);
	CHECK(ibv_next_poll(p.a.cqx) == ENOENT);
	CHECK_FALSE(fired(p.a.ch, 0));
	ibv_end_poll(p.a.cqx);

	/* Now it is there, and the armed CQ's event finds it. */
	REQUIRE(fired(p.a.ch, 2000));
	struct ibv_cq *cq = nullptr;
	void *cq_ctx = nullptr;
	REQUIRE(ibv_get_cq_event(p.a.ch, &cq, &cq_ctx) == 0);
	CHECK(cq == p.a.cq);
	ibv_ack_cq_events(cq, 1);
	REQUIRE(ibv_start_poll(p.a.cqx, &pa) == 0);
	CHECK(p.a.cqx->wr_id == 2);
	CHECK(p.a.cqx->status == IBV_WC_SUCCESS);
	CHECK(ibv_next_poll(p.a.cqx) == ENOENT);
	ibv_end_poll(p.a.cqx);

	/* Outside a batch a completion is visible as soon as the post returns. */
	REQUIRE(ibv_req_notify_cq(p.a.cq, 0) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE, 3, p.b.addr(512), p.b.mr->rkey) == 0);
	struct ibv_wc wc{};
	CHECK(ibv_poll_cq(p.a.cq, 1, &wc) == 1);
	CHECK(wc.wr_id == 3);
	CHECK(fired(p.a.ch, 0));
	REQUIRE(ibv_get_cq_event(p.a.ch, &cq, &cq_ctx) == 0);
	ibv_ack_cq_events(cq, 1);
}

TEST_CASE("fast path: a WR another thread posts behind one held back by a poll batch completes after it",
	  "[fastpath][cqex]")
{
	/* A device writes a send queue's CQEs in its WRs' order. WR 2 is
	 * posted inside a batch of the send CQ (its completion waits for
	 * end_poll), WR 3 by another thread while the batch is open: the
	 * poll returns 2, then 3. */
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	batch_holding_write(p);
	int other = -1;
	std::thread t([&] { other = post_signaled(p.a, IBV_WR_RDMA_WRITE, 3, p.b.addr(512), p.b.mr->rkey); });
	t.join();
	REQUIRE(other == 0);
	CHECK(ibv_next_poll(p.a.cqx) == ENOENT);
	ibv_end_poll(p.a.cqx);

	struct ibv_wc wc[4]{};
	REQUIRE(ibv_poll_cq(p.a.cq, 4, wc) == 2);
	CHECK(wc[0].wr_id == 2);
	CHECK(wc[1].wr_id == 3);
	CHECK(wc[0].status == IBV_WC_SUCCESS);
	CHECK(wc[1].status == IBV_WC_SUCCESS);
}

TEST_CASE("fast path: a QP reset inside a poll batch takes its held-back completions too",
	  "[fastpath][cqex]")
{
	/* The reset removes the QP's completions from its CQs (as libmlx5's
	 * mlx5_cq_clean does), the one waiting for end_poll included. */
	Pair p;
	p.connect();
	batch_holding_write(p);
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RESET;
	REQUIRE(ibv_modify_qp(p.a.qp, &a, IBV_QP_STATE) == 0);
	ibv_end_poll(p.a.cqx);
	struct ibv_wc wc{};
	CHECK(ibv_poll_cq(p.a.cq, 1, &wc) == 0);
}

TEST_CASE("send completions of WRs with immediate data say IBV_WC_WITH_IMM to ibv_poll_cq",
	  "[fastpath][cqex]")
{
	/* libmlx5: handle_good_req() sets the flag for SEND_WITH_IMM and
	 * RDMA_WRITE_WITH_IMM; the extended CQ's read_wc_flags() reports it
	 * for responder completions only. */
	Pair p;
	p.connect();
	for (uint64_t i = 0; i < 4; i++)
		REQUIRE(Pair::post_recv(p.b, 7 + i, 64 * i, 64) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_SEND_WITH_IMM, 1) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE_WITH_IMM, 2, p.b.addr(512), p.b.mr->rkey) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_SEND, 3) == 0);
	struct ibv_wc wc[3]{};
	for (int i = 0; i < 3; i++)
		REQUIRE(Pair::wait_wc(p.a, wc[i]));
	CHECK((wc[0].wr_id == 1 && wc[0].opcode == IBV_WC_SEND && wc[0].wc_flags == IBV_WC_WITH_IMM));
	CHECK((wc[1].wr_id == 2 && wc[1].opcode == IBV_WC_RDMA_WRITE &&
	       wc[1].wc_flags == IBV_WC_WITH_IMM));
	CHECK((wc[2].wr_id == 3 && wc[2].wc_flags == 0));

	REQUIRE(post_signaled(p.a, IBV_WR_RDMA_WRITE_WITH_IMM, 4, p.b.addr(512), p.b.mr->rkey) == 0);
	struct ibv_poll_cq_attr pa{};
	int err = ENOENT;
	for (int i = 0; i < 1000 && err == ENOENT; i++)
		err = ibv_start_poll(p.a.cqx, &pa);
	REQUIRE(err == 0);
	CHECK(p.a.cqx->wr_id == 4);
	CHECK(ibv_wc_read_wc_flags(p.a.cqx) == 0);
	ibv_end_poll(p.a.cqx);
	/* The responder's completions carry it either way. */
	REQUIRE(Pair::wait_wc(p.b, wc[0]));
	CHECK(wc[0].wc_flags == IBV_WC_WITH_IMM);
	REQUIRE(ibv_start_poll(p.b.cqx, &pa) == 0);
	CHECK(ibv_wc_read_wc_flags(p.b.cqx) == IBV_WC_WITH_IMM);
	ibv_end_poll(p.b.cqx);
}

TEST_CASE("fast path: ibv_poll_cq inside a start_poll batch of another CQ sees its completions",
	  "[fastpath][cqex]")
{
	Pair p;
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 7, 0, 64) == 0);
	REQUIRE(Pair::post_recv(p.b, 8, 64, 64) == 0);
	REQUIRE(post_signaled(p.a, IBV_WR_SEND, 1) == 0);
	struct ibv_poll_cq_attr pa{};
	REQUIRE(ibv_start_poll(p.b.cqx, &pa) == 0);
	CHECK(p.b.cqx->wr_id == 7);
	/* Only the batch's own CQ defers: a's completion is immediate. */
	REQUIRE(post_signaled(p.a, IBV_WR_SEND, 2) == 0);
	struct ibv_wc wc[2]{};
	CHECK(ibv_poll_cq(p.a.cq, 2, wc) == 2);
	CHECK(ibv_next_poll(p.b.cqx) == 0); /* b's receive of the second send */
	CHECK(p.b.cqx->wr_id == 8);
	ibv_end_poll(p.b.cqx);
}

TEST_CASE("fast path: a sender's copy of the consumer index never hides room or an overrun",
	  "[fastpath][overrun]")
{
	Options o;
	o.cqe = 4; /* granted 7 (mlx5 rounding); the ring has 8 slots */
	Pair p(o);
	p.connect();
	REQUIRE(ibv_cq_ex_to_cq(p.b.cqx)->cqe == 7);
	for (int i = 0; i < 12; i++)
		REQUIRE(Pair::post_recv(p.b, 100 + i, 64 * size_t(i), 64) == 0);
	auto send = [&] {
		struct ibv_sge sge = {p.a.addr(0), 8, p.a.mr->lkey};
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.opcode = IBV_WR_SEND;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		return ibv_post_send(p.a.qp, &wr, &bad);
	};
	auto cq_err = [&](int ms) {
		struct pollfd pfd = {p.ctx->async_fd, POLLIN, 0};
		if (poll(&pfd, 1, ms) != 1)
			return false;
		struct ibv_async_event ev{};
		REQUIRE(ibv_get_async_event(p.ctx, &ev) == 0);
		bool is = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == p.b.cq;
		ibv_ack_async_event(&ev);
		return is;
	};
	for (int i = 0; i < 7; i++)
		REQUIRE(send() == 0); /* the CQ holds cqe completions */
	struct ibv_wc wc[3];
	REQUIRE(ibv_poll_cq(p.b.cq, 3, wc) == 3);
	for (int i = 0; i < 3; i++)
		REQUIRE(send() == 0); /* room the sender must see: no overrun */
	CHECK_FALSE(cq_err(50));
	CHECK(ibv_poll_cq(p.b.cq, 0, wc) == 0);
	CHECK_FALSE(cq_err(50));
	REQUIRE(send() == 0); /* one more than cqe: overrun */
	/* The owner raises the event when it next looks at the CQ. */
	(void)ibv_poll_cq(p.b.cq, 1, wc);
	CHECK(cq_err(2000));
}

/* A QP's post_recv() counts its RQ's room from the receive completions
 * polled (lib/cq.h cq_track_rq()), never from the RQ's head: what it
 * counts must never make room that is not there. RC SENDs of the direct
 * path and UD ones: both refill exactly. */
TEST_CASE("fast path: a full RQ takes back exactly the receives polled, lap after lap",
	  "[fastpath][rq]")
{
	Options o;
	o.type = GENERATE(IBV_QPT_RC, IBV_QPT_UD);
	CAPTURE(o.type);
	Pair p(o);
	p.connect();
	struct ibv_ah *ah = nullptr;
	struct ibv_send_wr send{};
	if (o.type == IBV_QPT_UD) {
		struct ibv_ah_attr aa{};
		aa.dlid = p.lid;
		aa.port_num = 1;
		REQUIRE((ah = ibv_create_ah(p.pd, &aa)));
		send.wr.ud.ah = ah;
		send.wr.ud.remote_qpn = p.b.qp->qp_num;
		send.wr.ud.remote_qkey = 0x1234;
	}
	struct ibv_qp_attr qa{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(p.b.qp, &qa, IBV_QP_CAP, &ia) == 0);
	const int depth = int(ia.cap.max_recv_wr);
	REQUIRE(depth >= 4);
	uint64_t next_id = 0;
	/* Receives posted until the RQ refuses one (ENOMEM, nothing else). */
	auto fill = [&] {
		int n = 0, err;
		while ((err = Pair::post_recv(p.b, next_id, 0, 64)) == 0) {
			next_id++;
			REQUIRE(++n <= depth);
		}
		CHECK(err == ENOMEM);
		return n;
	};
	REQUIRE(fill() == depth);
	uint64_t expect_id = 0;
	for (int round = 0; round < 3 * depth; round++) {
		const int k = 1 + round % 3;
		for (int i = 0; i < k; i++)
			REQUIRE(Pair::post8(p.a, IBV_WR_SEND, uint64_t(i), send) == 0);
		struct ibv_wc wc;
		for (int i = 0; i < k; i++) {
			REQUIRE(Pair::wait_wc(p.b, wc));
			CHECK(wc.status == IBV_WC_SUCCESS);
			CHECK(wc.opcode == IBV_WC_RECV);
			CHECK(wc.wr_id == expect_id++);
			REQUIRE(Pair::wait_wc(p.a, wc));
			CHECK(wc.status == IBV_WC_SUCCESS);
		}
		CHECK(fill() == k);
	}
	if (ah)
		ibv_destroy_ah(ah);
}

/* The send engine keeps the lkeys it used held between posts (lib/datapath.h
 * LocalKeyCache). Deregistering such an MR must still return (the engine
 * lets go when the key is withdrawn), and the old lkey must be refused. */
TEST_CASE("fast path: an lkey the engine keeps held neither blocks dereg_mr nor outlives it",
	  "[fastpath][lkey]")
{
	Pair p;
	p.connect();
	std::vector<char> src(4096, 'k');
	struct ibv_mr *mr = ibv_reg_mr(p.pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	auto write_from = [&](uint32_t lkey, uint64_t wr_id) {
		REQUIRE(post_write(p.a, false, wr_id, {uint64_t(uintptr_t(src.data())), 8, lkey},
				   p.b.mr->rkey, p.b.addr(0)) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == wr_id);
		return wc.status;
	};
	const uint32_t lkey = mr->lkey;
	for (uint64_t i = 1; i <= 3; i++) /* the first resolves, the next ones hold */
		REQUIRE(write_from(lkey, i) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(p.b.at(0), "kkkkkkkk", 8) == 0);

	/* dereg_mr in another thread, bounded: a hold nobody lets go of
	 * would keep it waiting for ever. */
	std::atomic<int> rc{-1};
	std::thread t([&] { rc = ibv_dereg_mr(mr); });
	for (int i = 0; i < 500 && rc.load() < 0; i++)
		std::this_thread::sleep_for(std::chrono::milliseconds(10));
	if (rc.load() < 0) {
		FAIL_CHECK("ibv_dereg_mr still waits after 5 s");
		t.detach();
		std::quick_exit(1);
	}
	t.join();
	CHECK(rc.load() == 0);
	/* The engine must not use its old hold for the withdrawn key. */
	CHECK(write_from(lkey, 4) == IBV_WC_LOC_PROT_ERR);
}

/* The engine keeps its target's RQ and receive CQ once validated (reset
 * with the target): a QP reconnected to another QP must deliver there. */
TEST_CASE("fast path: SENDs follow a QP reconnected to another target", "[fastpath][target]")
{
	Pair p;
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 11, 0, 64) == 0);
	std::memcpy(p.a.at(0), "to-b....", 8);
	REQUIRE(Pair::post8(p.a, IBV_WR_SEND, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 11);

	Side c;
	p.make(c);
	struct ibv_qp_attr reset{};
	reset.qp_state = IBV_QPS_RESET;
	REQUIRE(ibv_modify_qp(p.a.qp, &reset, IBV_QP_STATE) == 0);
	REQUIRE(Pair::up(p.a, c.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(Pair::up(c, p.a.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(Pair::post_recv(p.b, 12, 64, 64) == 0); /* b must not get it */
	REQUIRE(Pair::post_recv(c, 21, 0, 64) == 0);
	std::memcpy(p.a.at(0), "to-c....", 8);
	REQUIRE(Pair::post8(p.a, IBV_WR_SEND, 2) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(Pair::wait_wc(c, wc));
	CHECK(wc.wr_id == 21);
	CHECK(std::memcmp(c.at(0), "to-c....", 8) == 0);
	CHECK(Pair::quiet(p.b));
	Pair::destroy(c);
}

/*
 * Once a SEND resolved the target, the next ones to its own RQ take the
 * engine's direct path (lib/datapath.cpp send_direct) when the receive
 * WQE's first SGE takes the whole message, and the general path otherwise:
 * both must give the responder's results of a device.
 */
TEST_CASE("fast path: SENDs to a resolved target, in and out of the direct path",
	  "[fastpath][send]")
{
	/* Through ibv_post_send and the ibv_wr_* builders (`ex`): the
	 * SENDs of one piece after the first take a shorter way of their
	 * own (lib/datapath.cpp direct_send) from either. */
	const bool ex = GENERATE(false, true);
	CAPTURE(ex);
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect(0); /* rnr_retry 0: no receive is an error at once */
	Side &a = p.a, &b = p.b;
	struct ibv_wc wc{};
	REQUIRE(Pair::post_recv(b, 1, 0, 64) == 0);
	REQUIRE(Pair::post8(a, IBV_WR_SEND, 100) == 0);
	REQUIRE(Pair::wait_wc(a, wc));
	REQUIRE(Pair::wait_wc(b, wc));
	REQUIRE(wc.wr_id == 1);

	auto send = [&](enum ibv_wr_opcode op, uint64_t wr_id, std::initializer_list<ibv_sge> sges,
			unsigned flags = 0) {
		std::vector<struct ibv_sge> sg(sges);
		if (ex) {
			ibv_wr_start(a.qpx);
			a.qpx->wr_id = wr_id;
			a.qpx->wr_flags = IBV_SEND_SIGNALED | flags;
			if (op == IBV_WR_SEND_WITH_IMM)
				ibv_wr_send_imm(a.qpx, htonl(0xfeed));
			else
				ibv_wr_send(a.qpx);
			if (flags & IBV_SEND_INLINE) {
				std::vector<struct ibv_data_buf> bufs;
				for (const struct ibv_sge &g : sg)
					bufs.push_back({reinterpret_cast<void *>(g.addr), g.length});
				ibv_wr_set_inline_data_list(a.qpx, bufs.size(), bufs.data());
			} else {
				ibv_wr_set_sge_list(a.qpx, sg.size(), sg.data());
			}
			return ibv_wr_complete(a.qpx);
		}
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.opcode = op;
		wr.send_flags = IBV_SEND_SIGNALED | flags;
		wr.imm_data = htonl(0xfeed);
		wr.sg_list = sg.data();
		wr.num_sge = int(sg.size());
		return ibv_post_send(a.qp, &wr, &bad);
	};
	auto recv = [&](uint64_t wr_id, std::initializer_list<ibv_sge> sges) {
		std::vector<struct ibv_sge> sg(sges);
		struct ibv_recv_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.sg_list = sg.data();
		wr.num_sge = int(sg.size());
		return ibv_post_recv(b.qp, &wr, &bad);
	};
	const uint32_t lk = a.mr->lkey, rk = b.mr->lkey;
	std::memcpy(a.at(0), "gathered-from-two-pieces", 24);

	SECTION("two local pieces, with immediate, into one receive SGE")
	{
		REQUIRE(recv(2, {{b.addr(256), 64, rk}}) == 0);
		REQUIRE(send(IBV_WR_SEND_WITH_IMM, 101, {{a.addr(0), 9, lk}, {a.addr(9), 15, lk}},
			     IBV_SEND_SOLICITED) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK((wc.wr_id == 101 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND));
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK(wc.wr_id == 2);
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.opcode == IBV_WC_RECV);
		CHECK(wc.byte_len == 24);
		CHECK(wc.wc_flags == IBV_WC_WITH_IMM);
		CHECK(ntohl(wc.imm_data) == 0xfeed);
		CHECK(wc.qp_num == b.qp->qp_num);
		CHECK(wc.src_qp == a.qp->qp_num);
		CHECK(std::memcmp(b.at(256), "gathered-from-two-pieces", 24) == 0);
		/* Inline, no immediate: nothing of the last one carried over. */
		REQUIRE(recv(3, {{b.addr(512), 64, rk}}) == 0);
		REQUIRE(send(IBV_WR_SEND, 102, {{a.addr(0), 8, lk}}, IBV_SEND_INLINE) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 3 && wc.byte_len == 8 && wc.wc_flags == 0 && wc.imm_data == 0));
		CHECK(std::memcmp(b.at(512), "gathered", 8) == 0);
	}
	SECTION("a message over the first receive SGE is scattered over the next")
	{
		REQUIRE(recv(2, {{b.addr(256), 10, rk}, {b.addr(1024), 64, rk}}) == 0);
		REQUIRE(send(IBV_WR_SEND, 101, {{a.addr(0), 24, lk}}) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 24));
		CHECK(std::memcmp(b.at(256), "gathered-f", 10) == 0);
		CHECK(std::memcmp(b.at(1024), "rom-two-pieces", 14) == 0);
	}
	/* A SEND of `len` bytes into a receive of `r`, failing on both sides. */
	auto refused = [&](struct ibv_sge r, uint32_t len, enum ibv_wc_status sender,
			   enum ibv_wc_status receiver) {
		REQUIRE(recv(2, {r}) == 0);
		REQUIRE(send(IBV_WR_SEND, 101, {{a.addr(0), len, lk}}) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.status == sender);
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 2 && wc.status == receiver));
	};
	SECTION("a message over the whole receive: local length error, the sender's remote error")
	{
		refused({b.addr(256), 16, rk}, 24, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR);
	}
	SECTION("a receive buffer whose key is not registered: protection error")
	{
		refused({b.addr(256), 64, rk ^ 0x100}, 8, IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR);
	}
	SECTION("a local piece past the end of its MR: local protection error, nothing sent")
	{
		REQUIRE(recv(2, {{b.addr(256), 64, rk}}) == 0);
		REQUIRE(send(IBV_WR_SEND, 101, {{a.addr(buf_size - 4), 8, lk}}) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK((wc.wr_id == 101 && wc.status == IBV_WC_LOC_PROT_ERR));
		CHECK(Pair::quiet(b));
	}
	SECTION("inline data over the QP's limit: ENOMEM at that WR, nothing done (libmlx5)")
	{
		struct ibv_qp_attr qa{};
		struct ibv_qp_init_attr qi{};
		REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0);
		const uint32_t limit = qi.cap.max_inline_data;
		REQUIRE(limit + 1 <= 2048);
		std::memset(a.at(4096), 'i', limit + 1);
		std::memset(b.at(4096), '.', limit + 1);
		auto write = [&](uint64_t wr_id, std::initializer_list<ibv_sge> sges) {
			std::vector<struct ibv_sge> sg(sges);
			struct ibv_send_wr wr{}, *bad = nullptr;
			wr.wr_id = wr_id;
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
			wr.sg_list = sg.data();
			wr.num_sge = int(sg.size());
			wr.wr.rdma.remote_addr = b.addr(4096);
			wr.wr.rdma.rkey = b.mr->rkey;
			int err = ibv_post_send(a.qp, &wr, &bad);
			CHECK(bad == (err ? &wr : nullptr));
			return err;
		};
		/* A SEND, then a WRITE of one piece, then two, one byte over. */
		if (!ex) {
			REQUIRE(recv(2, {{b.addr(256), 2048, rk}}) == 0);
			CHECK(send(IBV_WR_SEND, 102, {{a.addr(4096), limit + 1, lk}}, IBV_SEND_INLINE) ==
			      ENOMEM);
		}
		CHECK(write(103, {{a.addr(4096), limit + 1, lk}}) == ENOMEM);
		CHECK(write(104, {{a.addr(4096), 1, lk}, {a.addr(4097), limit, lk}}) == ENOMEM);
		CHECK(Pair::quiet(a));
		CHECK(Pair::quiet(b));
		CHECK(b.at(4096)[0] == '.');
		/* At the limit it goes. */
		REQUIRE(write(105, {{a.addr(4096), limit, lk}}) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK((wc.wr_id == 105 && wc.status == IBV_WC_SUCCESS));
		CHECK(b.at(4096)[limit - 1] == 'i');
		CHECK(b.at(4096)[limit] == '.');
	}
	SECTION("no receive posted: receiver not ready")
	{
		REQUIRE(send(IBV_WR_SEND, 101, {{a.addr(0), 8, lk}}) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
		CHECK(Pair::quiet(b));
	}
}

/* ibv_alloc_null_mr(3): data placed into a null MR is discarded and data
 * taken from it reads as zeros, whatever went into one before. The direct
 * path hands null-MR SGEs to the general one (lib/datapath.cpp
 * direct_local), with SGEs of ordinary MRs beside them. */
TEST_CASE("fast path: a null MR discards what a READ places and sources zeros",
	  "[fastpath][lkey]")
{
	Pair p;
	p.connect();
	struct ibv_mr *null_mr = ibv_alloc_null_mr(p.pd);
	REQUIRE(null_mr);
	std::memset(p.a.at(0), 'A', 256);
	std::memset(p.b.at(0), 'B', 1024);
	auto post = [&](enum ibv_wr_opcode op, uint64_t wr_id, std::initializer_list<ibv_sge> sges,
			uint64_t remote) {
		std::vector<struct ibv_sge> sg(sges);
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.opcode = op;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.sg_list = sg.data();
		wr.num_sge = int(sg.size());
		wr.wr.rdma.remote_addr = remote;
		wr.wr.rdma.rkey = p.b.mr->rkey;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == wr_id);
		return wc.status;
	};
	/* The null MR's address is not memory: nothing lands at it. */
	const struct ibv_sge null_sge = {p.a.addr(0), 64, null_mr->lkey};

	/* READ: 64 bytes of 'B' go nowhere. */
	CHECK(post(IBV_WR_RDMA_READ, 1, {null_sge}, p.b.addr(0)) == IBV_WC_SUCCESS);
	CHECK(std::string(p.a.at(0), 64) == std::string(64, 'A'));

	/* WRITE from it: zeros, not what the READ discarded. */
	CHECK(post(IBV_WR_RDMA_WRITE, 2, {null_sge}, p.b.addr(256)) == IBV_WC_SUCCESS);
	CHECK(std::string(p.b.at(256), 64) == std::string(64, '\0'));

	/* Beside an ordinary SGE, in order: 8 bytes of 'A', then 64 zeros. */
	const struct ibv_sge own = {p.a.addr(128), 8, p.a.mr->lkey};
	CHECK(post(IBV_WR_RDMA_WRITE, 3, {own, null_sge}, p.b.addr(512)) == IBV_WC_SUCCESS);
	CHECK(std::string(p.b.at(512), 8) == std::string(8, 'A'));
	CHECK(std::string(p.b.at(520), 64) == std::string(64, '\0'));
	CHECK(p.b.at(584)[0] == 'B');

	/* A SEND from it carries zeros too. */
	REQUIRE(Pair::post_recv(p.b, 40, 768, 128) == 0);
	CHECK(post(IBV_WR_SEND, 4, {null_sge}, 0) == IBV_WC_SUCCESS);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 40 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 64));
	CHECK(std::string(p.b.at(768), 64) == std::string(64, '\0'));
	CHECK(ibv_dereg_mr(null_mr) == 0);
}

/* ibv_alloc_null_mr(3): "upon ibv_post_recv() the device skips PCI write
 * cycles": a receive SGE of the null MR takes its bytes and drops them
 * (a UD receiver can so skip the GRH), the others get theirs. */
TEST_CASE("fast path: a receive SGE of the null MR takes its bytes and drops them",
	  "[fastpath][lkey]")
{
	Pair p;
	p.connect();
	struct ibv_mr *null_mr = ibv_alloc_null_mr(p.pd);
	REQUIRE(null_mr);
	std::memset(p.b.at(0), 'B', 2048);
	std::memcpy(p.a.at(0), "0123456789abcdef", 16);
	auto recv_into = [&](uint64_t wr_id, std::initializer_list<ibv_sge> sges) {
		std::vector<struct ibv_sge> sg(sges);
		struct ibv_recv_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.sg_list = sg.data();
		wr.num_sge = int(sg.size());
		return ibv_post_recv(p.b.qp, &wr, &bad);
	};
	auto send8 = [&](uint64_t wr_id) {
		struct ibv_wc wc{};
		REQUIRE(Pair::post8(p.a, IBV_WR_SEND, wr_id) == 0);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK((wc.wr_id == wr_id && wc.status == IBV_WC_SUCCESS));
		REQUIRE(Pair::wait_wc(p.b, wc));
		return wc;
	};
	/* All of it into the null MR: nothing lands at its address. */
	REQUIRE(recv_into(1, {{p.b.addr(1024), 64, null_mr->lkey}}) == 0);
	struct ibv_wc wc = send8(10);
	CHECK((wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 8));
	CHECK(std::string(p.b.at(1024), 64) == std::string(64, 'B'));
	/* The first 4 bytes dropped, the rest into the buffer. */
	REQUIRE(recv_into(2, {{p.b.addr(1024), 4, null_mr->lkey}, {p.b.addr(256), 64, p.b.mr->lkey}}) ==
		0);
	wc = send8(11);
	CHECK((wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 8));
	CHECK(std::string(p.b.at(256), 4) == "4567");
	CHECK(p.b.at(260)[0] == 'B');
	CHECK(std::string(p.b.at(1024), 8) == std::string(8, 'B'));
	CHECK(ibv_dereg_mr(null_mr) == 0);
}

/*
 * After a WRITE of one piece went the direct way, the next ones to the same
 * target and remote key take a shorter path (lib/datapath.cpp
 * direct_write). Each check of the longer one must still hold there: every
 * section first streams good WRITEs, then changes one thing.
 */
TEST_CASE("fast path: WRITEs after a stream of them keep every check", "[fastpath][write]")
{
	const bool ex = GENERATE(false, true);
	const bool inl = GENERATE(false, true);
	CAPTURE(ex, inl);
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	const uint32_t lk = a.mr->lkey, rk = b.mr->rkey;
	const unsigned sig = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
	for (size_t i = 0; i < buf_size; i++)
		a.at(0)[i] = char('a' + i % 26);
	std::memset(b.at(0), '.', buf_size);
	struct ibv_wc wc{};
	auto done = [&](uint64_t wr_id) {
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.wr_id == wr_id);
		CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
		return wc.status;
	};
	/* The stream: pieces of several lengths to several places. */
	const uint32_t lens[] = {8, 1, 17, 64, 0, 40};
	uint64_t id = 1;
	for (uint32_t len : lens) {
		const size_t at = 100 * size_t(id);
		REQUIRE(post_write(a, ex, id, {a.addr(at), len, lk}, rk, b.addr(at + 1), sig) == 0);
		REQUIRE(done(id) == IBV_WC_SUCCESS);
		CHECK(wc.byte_len == len);
		CHECK(std::memcmp(b.at(at + 1), a.at(at), len) == 0);
		CHECK(b.at(at + 1 + len)[0] == '.');
		CHECK(b.at(at)[0] == '.');
		id++;
	}
	/* What a refused WRITE must have left alone. */
	auto untouched = [&](size_t at, size_t len) {
		return std::string(b.at(at), len) == std::string(len, '.');
	};
	/* A WRITE of `sge` to b at `at` under `rkey` that fails with `status`,
	 * nothing written. */
	auto refused = [&](uint64_t wr_id, struct ibv_sge sge, uint32_t rkey, size_t at,
			   enum ibv_wc_status status) {
		REQUIRE(post_write(a, ex, wr_id, sge, rkey, b.addr(at), sig) == 0);
		CHECK(done(wr_id) == status);
		CHECK(untouched(at, std::min<size_t>(8, buf_size - at)));
	};

	SECTION("unsignaled ones complete nothing, their data lands")
	{
		for (int i = 0; i < 4; i++)
			REQUIRE(post_write(a, ex, 50 + i, {a.addr(2000 + 8 * size_t(i)), 8, lk}, rk,
					   b.addr(2000 + 8 * size_t(i)), inl ? IBV_SEND_INLINE : 0) == 0);
		REQUIRE(post_write(a, ex, 60, {a.addr(2032), 8, lk}, rk, b.addr(2032), sig) == 0);
		REQUIRE(done(60) == IBV_WC_SUCCESS);
		CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
		CHECK(std::memcmp(b.at(2000), a.at(2000), 40) == 0);
	}
	SECTION("past the end of the remote MR: remote access error")
	{
		refused(70, {a.addr(0), 8, lk}, rk, buf_size - 4, IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("another remote key, of an MR without remote write: remote access error")
	{
		struct ibv_mr *ro = ibv_reg_mr(p.pd, b.at(4096), 1024, IBV_ACCESS_REMOTE_READ);
		REQUIRE(ro);
		refused(71, {a.addr(0), 8, lk}, ro->rkey, 4096, IBV_WC_REM_ACCESS_ERR);
		CHECK(ibv_dereg_mr(ro) == 0);
	}
	SECTION("the target QP took remote write back: remote access error")
	{
		struct ibv_qp_attr qa{};
		qa.qp_access_flags = IBV_ACCESS_REMOTE_READ;
		REQUIRE(ibv_modify_qp(b.qp, &qa, IBV_QP_ACCESS_FLAGS) == 0);
		refused(72, {a.addr(0), 8, lk}, rk, 3000, IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("the target QP in ERR: no response, retries exhausted")
	{
		struct ibv_qp_attr qa{};
		qa.qp_state = IBV_QPS_ERR;
		REQUIRE(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE) == 0);
		refused(73, {a.addr(0), 8, lk}, rk, 3000, IBV_WC_RETRY_EXC_ERR);
	}
	if (inl)
		return; /* inline data has no local key */
	SECTION("a local piece past the end of its MR: local protection error")
	{
		refused(74, {a.addr(buf_size - 4), 8, lk}, rk, 3000, IBV_WC_LOC_PROT_ERR);
	}
	SECTION("a local key of another PD: local protection error")
	{
		struct ibv_pd *pd2 = ibv_alloc_pd(p.ctx);
		REQUIRE(pd2);
		struct ibv_mr *other = ibv_reg_mr(pd2, a.at(0), 1024, IBV_ACCESS_LOCAL_WRITE);
		REQUIRE(other);
		refused(75, {a.addr(0), 8, other->lkey}, rk, 3000, IBV_WC_LOC_PROT_ERR);
		CHECK(ibv_dereg_mr(other) == 0);
		CHECK(ibv_dealloc_pd(pd2) == 0);
	}
	SECTION("a local piece of the null MR: zeros")
	{
		struct ibv_mr *null_mr = ibv_alloc_null_mr(p.pd);
		REQUIRE(null_mr);
		REQUIRE(post_write(a, ex, 76, {a.addr(0), 8, null_mr->lkey}, rk, b.addr(3000), sig) == 0);
		CHECK(done(76) == IBV_WC_SUCCESS);
		CHECK(std::string(b.at(3000), 8) == std::string(8, '\0'));
		CHECK(ibv_dereg_mr(null_mr) == 0);
	}
}

/* post_send() tries the shorter ways before its own checks: a QP created
 * without send SGEs must still refuse a WR of one (ENOMEM, as libmlx5's
 * "max gs exceeded"), also after a stream of empty WRITEs that left the
 * target and key held. */
TEST_CASE("fast path: a QP without send SGEs refuses one after a stream of empty WRITEs",
	  "[fastpath][write]")
{
	Options o;
	o.max_send_sge = 0;
	Pair p(o);
	p.connect();
	REQUIRE(Pair::caps(p.a).max_send_sge == 0);
	struct ibv_wc wc{};
	for (uint64_t id = 1; id <= 3; id++) {
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = id;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = p.b.addr(0);
		wr.wr.rdma.rkey = p.b.mr->rkey;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK((wc.wr_id == id && wc.status == IBV_WC_SUCCESS && wc.byte_len == 0));
	}
	std::memset(p.b.at(0), '.', 8);
	CHECK(post_write(p.a, false, 4, {p.a.addr(0), 8, p.a.mr->lkey}, p.b.mr->rkey, p.b.addr(0)) ==
	      ENOMEM);
	CHECK(Pair::quiet(p.a));
	CHECK(std::string(p.b.at(0), 8) == "........");
}

/*
 * UC: a WRITE the responder refuses is dropped and the QP goes on, so the
 * refused key stays the one held and the WRITEs after it take the shorter
 * path too: each must be dropped again, and a good one must land after.
 */
TEST_CASE("fast path: UC WRITEs the responder refuses are dropped, again and again",
	  "[fastpath][write]")
{
	const bool ex = GENERATE(false, true);
	CAPTURE(ex);
	Options o;
	o.type = IBV_QPT_UC;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	const uint32_t lk = a.mr->lkey, rk = b.mr->rkey;
	std::memcpy(a.at(0), "uc-write", 8);
	std::memset(b.at(0), '.', buf_size);
	struct ibv_wc wc{};
	auto write = [&](uint64_t wr_id, uint32_t rkey, uint64_t raddr) {
		REQUIRE(post_write(a, ex, wr_id, {a.addr(0), 8, lk}, rkey, raddr) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.wr_id == wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS); /* UC: the requester never knows */
	};
	for (uint64_t id = 1; id <= 3; id++)
		write(id, rk, b.addr(0));
	REQUIRE(std::memcmp(b.at(0), "uc-write", 8) == 0);

	struct ibv_pd *pd2 = nullptr;
	struct ibv_mr *mr = nullptr;
	uint32_t bad_key = rk;
	size_t bad_at = 1000;
	bool drops_all = false;
	SECTION("an rkey of an MR in another PD")
	{
		pd2 = ibv_alloc_pd(p.ctx);
		REQUIRE(pd2);
		mr = ibv_reg_mr(pd2, b.at(0), buf_size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		REQUIRE(mr);
		bad_key = mr->rkey;
	}
	SECTION("the null MR's key")
	{
		mr = ibv_alloc_null_mr(p.pd);
		REQUIRE(mr);
		bad_key = mr->lkey;
	}
	SECTION("past the end of the remote MR")
	{
		bad_at = buf_size - 4;
	}
	SECTION("a target QP without remote write")
	{
		struct ibv_qp_attr qa{};
		qa.qp_access_flags = IBV_ACCESS_REMOTE_READ;
		REQUIRE(ibv_modify_qp(b.qp, &qa, IBV_QP_ACCESS_FLAGS) == 0);
		drops_all = true;
	}
	for (uint64_t id = 10; id < 13; id++)
		write(id, bad_key, b.addr(bad_at));
	CHECK(std::string(b.at(bad_at), buf_size - bad_at) == std::string(buf_size - bad_at, '.'));
	/* A good one after them lands, but at a target that took remote
	 * write back (it drops every WRITE). */
	write(20, rk, b.addr(2000));
	CHECK((std::memcmp(b.at(2000), "uc-write", 8) == 0) == !drops_all);
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0);
	if (pd2)
		CHECK(ibv_dealloc_pd(pd2) == 0);
}

/* libmlx5 counts a WR in its send queue from the post until the poll of its
 * completion, or of a later one (an unsignaled WR retires with the next
 * signaled one polled): with max_send_wr outstanding, the next post is
 * ENOMEM (mlx5_wq_overflow), whichever API posts it. */
TEST_CASE("send queue: a WR holds its room until its completion, or a later one, is polled",
	  "[fastpath][sq]")
{
	const bool ex = GENERATE(false, true);
	CAPTURE(ex);
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	const uint32_t n = Pair::caps(p.a).max_send_wr;
	REQUIRE(n + 1 <= uint32_t(o.cqe));
	auto write = [&](uint64_t id, unsigned flags = IBV_SEND_SIGNALED) {
		return post_write(p.a, ex, id, {p.a.addr(0), 8, p.a.mr->lkey}, p.b.mr->rkey,
				  p.b.addr(0), flags);
	};
	struct ibv_wc wc{};
	SECTION("signaled: full at max_send_wr, one polled completion frees one")
	{
		for (uint32_t i = 0; i < n; i++)
			REQUIRE(write(i) == 0);
		CHECK(write(100) == ENOMEM);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == 0);
		CHECK(write(101) == 0);
		CHECK(write(102) == ENOMEM);
		for (uint32_t i = 0; i < n; i++)
			REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == 101);
		CHECK(write(103) == 0);
	}
	SECTION("unsignaled: retired by the next signaled completion polled")
	{
		for (uint32_t i = 0; i + 1 < n; i++)
			REQUIRE(write(i, 0) == 0);
		REQUIRE(write(n - 1) == 0);
		CHECK(write(200, 0) == ENOMEM);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == n - 1);
		for (uint32_t i = 0; i < n; i++)
			CHECK(write(300 + i, i + 1 == n ? IBV_SEND_SIGNALED : 0) == 0);
		CHECK(write(400, 0) == ENOMEM);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == 300 + n - 1);
		CHECK(Pair::quiet(p.a));
	}
	SECTION("a reset retires every WR")
	{
		for (uint32_t i = 0; i < n; i++)
			REQUIRE(write(i) == 0);
		CHECK(write(500) == ENOMEM);
		struct ibv_qp_attr reset{};
		reset.qp_state = IBV_QPS_RESET;
		REQUIRE(ibv_modify_qp(p.a.qp, &reset, IBV_QP_STATE) == 0);
		REQUIRE(Pair::up(p.a, p.b.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
		for (uint32_t i = 0; i < n; i++)
			REQUIRE(write(600 + i) == 0);
		CHECK(write(700) == ENOMEM);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == 600); /* the reset removed the others */
	}
	SECTION("flushed WRs free their room when their completions are polled")
	{
		for (uint32_t i = 0; i + 1 < n; i++)
			REQUIRE(write(i, 0) == 0);
		struct ibv_qp_attr err{};
		err.qp_state = IBV_QPS_ERR;
		REQUIRE(ibv_modify_qp(p.a.qp, &err, IBV_QP_STATE) == 0);
		/* Posted in ERR: flushed, and the error completion retires
		 * the unsignaled WRs before it. */
		REQUIRE(write(800, 0) == 0);
		CHECK(write(801, 0) == ENOMEM);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK((wc.wr_id == 800 && wc.status == IBV_WC_WR_FLUSH_ERR));
		CHECK(write(802, 0) == 0);
	}
}

/* The WR numbers wrap at 2^32; the one numbered 0 retires like any other
 * (a QP of one WR would otherwise be full for ever after it). */
TEST_CASE("send queue: the WR numbers wrap without losing room", "[fastpath][sq]")
{
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	o.max_send_wr = 1;
	Pair p(o);
	p.connect();
	REQUIRE(Pair::caps(p.a).max_send_wr == 1);
	REQUIRE(shmverbs_test_renumber_sq(p.a.qp, 0xfffffffdu) == 0);
	struct ibv_wc wc{};
	for (uint64_t id = 1; id <= 6; id++) { /* numbers ...fd, fe, ff, 0, 1, 2 */
		REQUIRE(post_write(p.a, false, id, {p.a.addr(0), 8, p.a.mr->lkey}, p.b.mr->rkey,
				   p.b.addr(0)) == 0);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK((wc.wr_id == id && wc.status == IBV_WC_SUCCESS));
	}
	CHECK(shmverbs_test_renumber_sq(nullptr, 1) == EINVAL);
}

TEST_CASE("fast path: inline WRITEs over the limit after a stream of them", "[fastpath][write]")
{
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	const uint32_t limit = Pair::caps(p.a).max_inline_data;
	REQUIRE(limit + 1 <= 2048);
	std::memset(p.a.at(0), 'i', limit + 1);
	std::memset(p.b.at(0), '.', limit + 1);
	const unsigned flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	struct ibv_wc wc{};
	for (uint64_t id = 1; id <= 3; id++) {
		REQUIRE(post_write(p.a, false, id, {p.a.addr(0), 8, 0}, p.b.mr->rkey, p.b.addr(0),
				   flags) == 0);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK((wc.wr_id == id && wc.status == IBV_WC_SUCCESS));
	}
	CHECK(post_write(p.a, false, 4, {p.a.addr(0), limit + 1, 0}, p.b.mr->rkey, p.b.addr(0), flags) ==
	      ENOMEM);
	CHECK(Pair::quiet(p.a));
	CHECK(p.b.at(0)[8] == '.');
	REQUIRE(post_write(p.a, false, 5, {p.a.addr(0), limit, 0}, p.b.mr->rkey, p.b.addr(0), flags) ==
		0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS));
	CHECK(p.b.at(0)[limit - 1] == 'i');
	CHECK(p.b.at(0)[limit] == '.');
}

/*
 * UD: after a SEND of one piece went the direct way, the next ones to the
 * same target by the same route (a LID, no GRH) take a shorter way of their
 * own (lib/ud.cpp direct_ud). Every section streams good messages, then
 * changes one thing; what the general way does with it must still happen.
 */
/*
 * A QP created with sq_sig_all completes every WR, whatever its
 * IBV_SEND_SIGNALED: the direct ways a stream of WRs takes after the first
 * (RC WRITE and SEND, through ibv_post_send and the builders; UD SEND)
 * must say so too.
 */
TEST_CASE("fast path: a QP with sq_sig_all completes unsignaled WRs on every path",
	  "[fastpath][sigall]")
{
	const enum ibv_qp_type type = GENERATE(IBV_QPT_RC, IBV_QPT_UD);
	const bool inl = GENERATE(false, true);
	CAPTURE(type, inl);
	Options o;
	o.type = type;
	o.sq_sig_all = true;
	if (type == IBV_QPT_RC)
		o.send_ops |= IBV_QP_EX_WITH_RDMA_WRITE;
	Pair p(o);
	p.connect();
	struct ibv_ah *ah = nullptr;
	if (type == IBV_QPT_UD) {
		struct ibv_ah_attr aa{};
		aa.dlid = p.lid;
		aa.port_num = 1;
		ah = ibv_create_ah(p.pd, &aa);
		REQUIRE(ah);
	}
	const unsigned flags = inl ? IBV_SEND_INLINE : 0; /* never IBV_SEND_SIGNALED */
	const struct ibv_sge sge = {p.a.addr(0), 8, p.a.mr->lkey};
	struct ibv_wc wc{};
	auto completed = [&](uint64_t wr_id, enum ibv_wc_opcode op) {
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.opcode == op);
	};
	for (uint64_t i = 0; i < 4; i++) {
		REQUIRE(Pair::post_recv(p.b, 50 + i, 512 + 64 * i, 64) == 0);
		struct ibv_send_wr wr{}, *bad = nullptr;
		struct ibv_sge s = sge;
		wr.wr_id = 10 + i;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = flags;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = p.b.qp->qp_num;
		wr.wr.ud.remote_qkey = 0x1234;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
		completed(10 + i, IBV_WC_SEND);
		REQUIRE(Pair::wait_wc(p.b, wc));
		CHECK(wc.wr_id == 50 + i);
	}
	if (type == IBV_QPT_RC) {
		for (uint64_t i = 0; i < 4; i++) {
			const bool ex = i % 2;
			REQUIRE(post_write(p.a, ex, 20 + i, sge, p.b.mr->rkey, p.b.addr(64), flags) == 0);
			completed(20 + i, IBV_WC_RDMA_WRITE);
		}
		for (uint64_t i = 0; i < 2; i++) {
			REQUIRE(Pair::post_recv(p.b, 60 + i, 1024 + 64 * i, 64) == 0);
			ibv_wr_start(p.a.qpx);
			p.a.qpx->wr_id = 30 + i;
			p.a.qpx->wr_flags = flags;
			ibv_wr_send(p.a.qpx);
			if (inl)
				ibv_wr_set_inline_data(p.a.qpx, p.a.at(0), 8);
			else
				ibv_wr_set_sge(p.a.qpx, sge.lkey, sge.addr, sge.length);
			REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
			completed(30 + i, IBV_WC_SEND);
			REQUIRE(Pair::wait_wc(p.b, wc));
			CHECK(wc.wr_id == 60 + i);
		}
	}
	CHECK(Pair::quiet(p.a));
	if (ah)
		ibv_destroy_ah(ah);
}

TEST_CASE("fast path: UD SENDs after a stream of them keep every check", "[fastpath][ud]")
{
	const bool inl = GENERATE(false, true);
	CAPTURE(inl);
	Options o;
	o.type = IBV_QPT_UD;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	const uint32_t lk = a.mr->lkey;
	const unsigned sig = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
	struct ibv_ah_attr aa{};
	aa.dlid = p.lid;
	aa.port_num = 1;
	aa.sl = 2;
	struct ibv_ah *ah = ibv_create_ah(p.pd, &aa);
	REQUIRE(ah);
	std::memcpy(a.at(0), "ud-lane-message!", 16);
	struct ibv_wc wc{};
	auto send = [&](Side &from, uint64_t wr_id, struct ibv_ah *to_ah, uint32_t qpn, uint32_t qkey,
			struct ibv_sge sge, unsigned flags, enum ibv_wr_opcode op = IBV_WR_SEND) {
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.opcode = op;
		wr.send_flags = flags;
		wr.imm_data = htonl(0xabcd);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.ud.ah = to_ah;
		wr.wr.ud.remote_qpn = qpn;
		wr.wr.ud.remote_qkey = qkey;
		return ibv_post_send(from.qp, &wr, &bad);
	};
	/* One message to b; its completion at a. */
	auto to_b = [&](uint64_t wr_id, uint32_t qkey = 0x1234, struct ibv_sge sge = {},
			unsigned flags = ~0u) {
		if (!sge.length)
			sge = {a.addr(0), 16, lk};
		REQUIRE(send(a, wr_id, ah, b.qp->qp_num, qkey, sge, flags == ~0u ? sig : flags) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.wr_id == wr_id);
		return wc.status;
	};
	/* The receive completion of a message landed in b at `off`. */
	auto landed = [&](uint64_t recv_id, size_t off) {
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK(wc.wr_id == recv_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.byte_len == 16 + 40);
		CHECK(wc.src_qp == a.qp->qp_num);
		CHECK(wc.sl == 2);
		CHECK(std::memcmp(b.at(off + 40), "ud-lane-message!", 16) == 0);
	};
	for (uint64_t i = 0; i < 3; i++) {
		REQUIRE(Pair::post_recv(b, i, 128 * i, 128) == 0);
		REQUIRE(to_b(100 + i) == IBV_WC_SUCCESS);
		landed(i, 128 * i);
		CHECK(wc.wc_flags == 0);
	}
	REQUIRE(Pair::post_recv(b, 9, 1024, 128) == 0); /* for what follows */

	SECTION("a receive too small: LOC_LEN_ERR, and the QP in ERR takes nothing more")
	{
		/* The three messages come faster than b's owner acts on the
		 * error (its next verb or sweep): senders must not deliver into
		 * a QP that is in ERR from that error on. */
		REQUIRE(Pair::post_recv(b, 10, 2048, 20) == 0);
		REQUIRE(Pair::post_recv(b, 11, 3072, 128) == 0);
		for (uint64_t id : {120, 121, 122})
			REQUIRE(send(a, id, ah, b.qp->qp_num, 0x1234, {a.addr(0), 16, lk}, 0) == 0);
		landed(9, 1024);
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 10 && wc.status == IBV_WC_LOC_LEN_ERR));
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 11 && wc.status == IBV_WC_WR_FLUSH_ERR));
		CHECK(b.at(3072 + 40)[0] != 'u');
	}
	SECTION("with immediate, unsignaled: the immediate arrives, no send completion")
	{
		REQUIRE(send(a, 110, ah, b.qp->qp_num, 0x1234, {a.addr(0), 16, lk},
			     inl ? IBV_SEND_INLINE : 0, IBV_WR_SEND_WITH_IMM) == 0);
		landed(9, 1024);
		CHECK(wc.wc_flags == IBV_WC_WITH_IMM);
		CHECK(ntohl(wc.imm_data) == 0xabcd);
		CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
	}
	SECTION("another Q_Key: dropped")
	{
		CHECK(to_b(111, 0x4321) == IBV_WC_SUCCESS);
		CHECK(Pair::quiet(b));
	}
	SECTION("a Q_Key with the high bit: the sending QP's own")
	{
		CHECK(to_b(112, 0x80000000u) == IBV_WC_SUCCESS);
		landed(9, 1024);
		/* Once a's own is another, such messages no longer match b. */
		struct ibv_qp_attr qa{};
		qa.qkey = 0x5555;
		REQUIRE(ibv_modify_qp(a.qp, &qa, IBV_QP_QKEY) == 0);
		REQUIRE(Pair::post_recv(b, 10, 2048, 128) == 0);
		CHECK(to_b(113, 0x80000000u) == IBV_WC_SUCCESS);
		CHECK(Pair::quiet(b));
		CHECK(to_b(114) == IBV_WC_SUCCESS);
		landed(10, 2048);
	}
	SECTION("a target in INIT with a receive posted: dropped; in RTR again: taken")
	{
		struct ibv_qp_attr qa{};
		qa.qp_state = IBV_QPS_RESET;
		REQUIRE(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE) == 0);
		shmv_test::QpPath path;
		path.qkey = 0x1234;
		REQUIRE(shmv_test::qp_to_init(b.qp, IBV_QPT_UD, path) == 0);
		REQUIRE(Pair::post_recv(b, 20, 2048, 128) == 0);
		CHECK(to_b(124) == IBV_WC_SUCCESS);
		CHECK(Pair::quiet(b));
		qa.qp_state = IBV_QPS_RTR;
		REQUIRE(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE) == 0);
		CHECK(to_b(125) == IBV_WC_SUCCESS);
		landed(20, 2048);
	}
	SECTION("an AH to a LID nobody has: dropped; the first AH again: delivered")
	{
		struct ibv_ah_attr nowhere = aa;
		nowhere.dlid = uint16_t(p.lid + 100);
		struct ibv_ah *lost = ibv_create_ah(p.pd, &nowhere);
		REQUIRE(lost);
		for (uint64_t id = 115; id < 117; id++) { /* the second knows the route */
			REQUIRE(send(a, id, lost, b.qp->qp_num, 0x1234, {a.addr(0), 16, lk}, sig) == 0);
			REQUIRE(Pair::wait_wc(a, wc));
			CHECK((wc.wr_id == id && wc.status == IBV_WC_SUCCESS));
		}
		CHECK(Pair::quiet(b));
		CHECK(to_b(117) == IBV_WC_SUCCESS);
		landed(9, 1024);
		CHECK(ibv_destroy_ah(lost) == 0);
	}
	SECTION("a global AH: the GRH comes first")
	{
		struct ibv_ah_attr global = aa;
		global.is_global = 1;
		global.grh.hop_limit = 7;
		REQUIRE(ibv_query_gid(p.ctx, 1, 0, &global.grh.dgid) == 0);
		struct ibv_ah *gah = ibv_create_ah(p.pd, &global);
		REQUIRE(gah);
		REQUIRE(send(a, 118, gah, b.qp->qp_num, 0x1234, {a.addr(0), 16, lk}, sig) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		landed(9, 1024);
		CHECK(wc.wc_flags == IBV_WC_GRH);
		const auto *grh = reinterpret_cast<const struct ibv_grh *>(b.at(1024));
		CHECK(grh->hop_limit == 7);
		CHECK(std::memcmp(grh->dgid.raw, global.grh.dgid.raw, 16) == 0);
		CHECK(ibv_destroy_ah(gah) == 0);
	}
	SECTION("another target QP: the message goes there")
	{
		Side c;
		p.make(c);
		REQUIRE(Pair::up(c, 0, p.lid, IBV_QPT_UD) == 0);
		REQUIRE(Pair::post_recv(c, 30, 0, 128) == 0);
		REQUIRE(send(a, 119, ah, c.qp->qp_num, 0x1234, {a.addr(0), 16, lk}, sig) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		REQUIRE(Pair::wait_wc(c, wc));
		CHECK((wc.wr_id == 30 && wc.byte_len == 56));
		CHECK(std::memcmp(c.at(40), "ud-lane-message!", 16) == 0);
		CHECK(Pair::quiet(b));
		Pair::destroy(c);
	}
	SECTION("over the path MTU: local length error")
	{
		struct ibv_port_attr pa{};
		REQUIRE(ibv_query_port(p.ctx, 1, &pa) == 0);
		const uint32_t mtu = 128u << pa.active_mtu;
		REQUIRE(mtu < buf_size);
		if (!inl) /* inline data stops far below an MTU */
			CHECK(to_b(120, 0x1234, {a.addr(0), mtu + 1, lk}) == IBV_WC_LOC_LEN_ERR);
		CHECK(Pair::quiet(b));
	}
	if (inl) {
		SECTION("inline data over the QP's limit: ENOMEM")
		{
			struct ibv_qp_attr qa{};
			struct ibv_qp_init_attr qi{};
			REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0);
			CHECK(send(a, 121, ah, b.qp->qp_num, 0x1234,
				   {a.addr(0), qi.cap.max_inline_data + 1, lk}, sig) == ENOMEM);
			CHECK(Pair::quiet(a));
			CHECK(Pair::quiet(b));
		}
	} else {
		SECTION("a local piece past the end of its MR: local protection error")
		{
			CHECK(to_b(122, 0x1234, {a.addr(buf_size - 4), 16, lk}) == IBV_WC_LOC_PROT_ERR);
			CHECK(Pair::quiet(b));
		}
	}
	SECTION("an AH of another context: EINVAL, nothing sent")
	{
		struct ibv_context *other = shmv_test::open_first_device();
		REQUIRE(other);
		struct ibv_pd *other_pd = ibv_alloc_pd(other);
		REQUIRE(other_pd);
		struct ibv_ah *foreign = ibv_create_ah(other_pd, &aa);
		REQUIRE(foreign);
		CHECK(send(a, 123, foreign, b.qp->qp_num, 0x1234, {a.addr(0), 16, lk}, sig) == EINVAL);
		CHECK(Pair::quiet(a));
		CHECK(Pair::quiet(b));
		CHECK(ibv_destroy_ah(foreign) == 0);
		CHECK(ibv_dealloc_pd(other_pd) == 0);
		CHECK(ibv_close_device(other) == 0);
	}
	CHECK(ibv_destroy_ah(ah) == 0);
}

/*
 * The same with two ports (SHMVERBS_PORTS=2, tests/meson.build): what the
 * shorter way keeps of the route and the QP's port must follow a QP that
 * moves to the other port. Hidden, and not tagged [fastpath], so that only
 * that entry runs it.
 */
TEST_CASE("fast path: UD SENDs follow QPs that move to the other port", "[.][2ports]")
{
	Options o;
	o.type = IBV_QPT_UD;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	struct ibv_port_attr pa2{};
	REQUIRE(ibv_query_port(p.ctx, 2, &pa2) == 0);
	const uint16_t lid1 = p.lid, lid2 = pa2.lid;
	REQUIRE(lid1 != lid2);
	auto make_ah = [&](uint16_t dlid, uint8_t port) {
		struct ibv_ah_attr aa{};
		aa.dlid = dlid;
		aa.port_num = port;
		struct ibv_ah *ah = ibv_create_ah(p.pd, &aa);
		REQUIRE(ah);
		return ah;
	};
	struct ibv_ah *to_port1 = make_ah(lid1, 1), *to_port2 = make_ah(lid2, 1);
	std::memcpy(a.at(0), "two-ports", 9);
	struct ibv_wc wc{};
	uint64_t next = 1;
	/* A SEND of a to b by `ah`; a's completion. */
	auto send = [&](struct ibv_ah *ah) {
		struct ibv_send_wr wr{};
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = b.qp->qp_num;
		wr.wr.ud.remote_qkey = 0x1234;
		const uint64_t id = next++;
		REQUIRE(Pair::post8(a, IBV_WR_SEND, id, wr) == 0);
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK((wc.wr_id == id && wc.status == IBV_WC_SUCCESS));
	};
	/* RESET -> RTS on `port`. */
	auto move = [&](Side &s, uint8_t port) {
		struct ibv_qp_attr qa{};
		qa.qp_state = IBV_QPS_RESET;
		REQUIRE(ibv_modify_qp(s.qp, &qa, IBV_QP_STATE) == 0);
		qa = {};
		qa.qp_state = IBV_QPS_INIT;
		qa.port_num = port;
		qa.qkey = 0x1234;
		REQUIRE(ibv_modify_qp(s.qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							 IBV_QP_QKEY) == 0);
		REQUIRE(shmv_test::qp_init_to_rts(s.qp, IBV_QPT_UD, 0, 0) == 0);
	};
	/* One message by `ah` into b's receive `recv_id`, from `slid`. */
	auto through = [&](uint64_t recv_id, struct ibv_ah *ah, uint16_t slid) {
		REQUIRE(Pair::post_recv(b, recv_id, 0, 128) == 0);
		send(ah);
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == recv_id && wc.slid == slid));
	};
	for (uint64_t i = 0; i < 3; i++)
		through(i, to_port1, lid1);

	SECTION("the sender moves: its messages come from the other port's LID")
	{
		move(a, 2);
		for (uint64_t i = 10; i < 13; i++)
			through(i, to_port1, lid2);
	}
	SECTION("the target moves: what is addressed to the old port is dropped")
	{
		move(b, 2);
		REQUIRE(Pair::post_recv(b, 20, 0, 128) == 0);
		send(to_port1);
		send(to_port1);
		CHECK(Pair::quiet(b));
		send(to_port2);
		REQUIRE(Pair::wait_wc(b, wc));
		CHECK((wc.wr_id == 20 && wc.slid == lid1));
	}
	CHECK(ibv_destroy_ah(to_port1) == 0);
	CHECK(ibv_destroy_ah(to_port2) == 0);
}

namespace {

/* Whether a thread of this process has the name (/proc/self/task/N/comm). */
bool has_thread_named(const char *name)
{
	for (const auto &task : std::filesystem::directory_iterator("/proc/self/task")) {
		std::ifstream comm(task.path() / "comm");
		std::string line;
		if (std::getline(comm, line) && line == name)
			return true;
	}
	return false;
}

} // namespace

TEST_CASE("large WRITE, READ and SEND move every byte, the copy shared with a helper thread",
	  "[fastpath][copy]")
{
	/* From 256 KiB a payload's copy is cut in chunks, half of them
	 * copied by a helper thread on another CPU (lib/copy_helper.h).
	 * An odd length, a fresh pattern every round: a chunk left out,
	 * copied twice from the wrong place or late would show. */
	constexpr size_t msg = (1u << 20) + 3;
	loopback::Options o;
	o.buf_bytes = 2 * msg + 64;
	loopback::Pair p(o);
	p.connect();
	auto fill = [&](loopback::Side &s, size_t off, int round) {
		for (size_t i = 0; i < msg; i++)
			*s.at(off + i) = char(i * 7 + round * 131 + (i >> 12));
	};
	auto same = [&](loopback::Side &x, size_t xo, loopback::Side &y, size_t yo) {
		return std::memcmp(x.at(xo), y.at(yo), msg) == 0;
	};
	struct ibv_wc wc{};
	for (int round = 0; round < 6; round++) {
		CAPTURE(round);
		/* WRITE a[0..msg) to b at 5. */
		fill(p.a, 0, round);
		struct ibv_send_wr wr{};
		wr.wr_id = 1;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = p.b.addr(5);
		wr.wr.rdma.rkey = p.b.mr->rkey;
		REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {p.a.addr(0), uint32_t(msg), p.a.mr->lkey}) ==
			0);
		REQUIRE(p.wait_wc(p.a, wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
		CHECK(same(p.a, 0, p.b, 5));
		/* READ it back into a at msg + 9, after new bytes in b. */
		fill(p.b, 5, round + 50);
		wr.wr_id = 2;
		wr.opcode = IBV_WR_RDMA_READ;
		REQUIRE(shmv_test::post_send_sge(p.a.qp, wr,
						 {p.a.addr(msg + 9), uint32_t(msg), p.a.mr->lkey}) == 0);
		REQUIRE(p.wait_wc(p.a, wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
		CHECK(same(p.a, msg + 9, p.b, 5));
		/* SEND a[0..msg), new bytes again, into a receive at b's
		 * msg + 20. */
		fill(p.a, 0, round + 100);
		REQUIRE(p.post_recv(p.b, 3, msg + 20, uint32_t(msg)) == 0);
		wr = {};
		wr.wr_id = 4;
		wr.opcode = IBV_WR_SEND;
		REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {p.a.addr(0), uint32_t(msg), p.a.mr->lkey}) ==
			0);
		REQUIRE(p.wait_wc(p.a, wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
		REQUIRE(p.wait_wc(p.b, wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.byte_len == msg);
		CHECK(same(p.a, 0, p.b, msg + 20));
	}
	cpu_set_t cpus;
	REQUIRE(sched_getaffinity(0, sizeof(cpus), &cpus) == 0);
	const bool helper_allowed = CPU_COUNT(&cpus) > 1 && !std::getenv("SHMVERBS_COPY_HELPER");
	if (helper_allowed)
		CHECK(has_thread_named("shmverbs-copy"));
}

namespace {

std::atomic<int> write_faults{0};

/* A runtime's write tracking: the first write to a protected page faults,
 * the handler notes it and lets the page be written. */
void note_write(int, siginfo_t *si, void *)
{
	const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
	mprotect(reinterpret_cast<void *>(uintptr_t(si->si_addr) & ~(page - 1)), page,
		 PROT_READ | PROT_WRITE);
	write_faults.fetch_add(1, std::memory_order_relaxed);
}

} // namespace

TEST_CASE("a large READ into write-protected memory runs the application's fault handler "
	  "in each thread that copies",
	  "[fastpath][copy]")
{
	/* Every page of the READ's destination is protected and faults once:
	 * the pages the copy helper copies fault in the helper, which must
	 * take the application's SIGSEGV handler as the posting thread does
	 * (with SIGSEGV blocked there, the kernel kills the process). */
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	constexpr size_t msg = 1u << 20;
	loopback::Options o;
	o.buf_bytes = 2 * msg + 2 * page;
	loopback::Pair p(o);
	p.connect();
	const size_t dst = msg + (page - uintptr_t(p.a.at(msg)) % page) % page;
	struct sigaction track = {}, previous = {};
	track.sa_sigaction = note_write;
	track.sa_flags = SA_SIGINFO;
	sigemptyset(&track.sa_mask);
	REQUIRE(sigaction(SIGSEGV, &track, &previous) == 0);
	struct ibv_wc wc{};
	for (int round = 0; round < 4; round++) {
		CAPTURE(round);
		for (size_t i = 0; i < msg; i++)
			*p.b.at(i) = char(i * 13 + round * 71 + (i >> 12));
		write_faults = 0;
		REQUIRE(mprotect(p.a.at(dst), msg, PROT_READ) == 0);
		struct ibv_send_wr wr{};
		wr.wr_id = 1;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = p.b.addr(0);
		wr.wr.rdma.rkey = p.b.mr->rkey;
		REQUIRE(shmv_test::post_send_sge(p.a.qp, wr,
						 {p.a.addr(dst), uint32_t(msg), p.a.mr->lkey}) == 0);
		REQUIRE(p.wait_wc(p.a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(write_faults.load() == int(msg / page));
		CHECK(std::memcmp(p.a.at(dst), p.b.at(0), msg) == 0);
	}
	mprotect(p.a.at(dst), msg, PROT_READ | PROT_WRITE);
	REQUIRE(sigaction(SIGSEGV, &previous, nullptr) == 0);
}
