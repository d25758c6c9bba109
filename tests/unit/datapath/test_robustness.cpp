/* SPDX-License-Identifier: MIT */
/*
 * What the data path must survive: a QP reset with completions pending,
 * attributes changed without a state change.
 */
#include "loopback.h"

#include <arpa/inet.h>
#include <poll.h>

#include "../common/child.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

using namespace loopback;

namespace {

int post_send(Side &s, enum ibv_wr_opcode op, uint64_t wr_id, uint32_t remote_qpn = 0,
	      struct ibv_ah *ah = nullptr, uint32_t qkey = 0)
{
	struct ibv_send_wr wr{};
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = remote_qpn;
	wr.wr.ud.remote_qkey = qkey;
	return Pair::post8(s, op, wr_id, wr);
}

/* a's CQ with completions of a (SENDs 10 and 11) and, between them, of a
 * second QP `c` on the same CQ (SEND 20), none polled; b's CQ with b's
 * receive completions 1 and 2. The caller destroys c.qp. */
Side interleaved(Pair &p)
{
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 1, 0, 64) == 0);
	REQUIRE(Pair::post_recv(p.b, 2, 64, 64) == 0);
	REQUIRE(post_send(p.a, IBV_WR_SEND, 10) == 0);
	Side c;
	c.cq = p.a.cq;
	struct ibv_qp_init_attr ia{};
	ia.send_cq = ia.recv_cq = p.a.cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap = {4, 4, 1, 1, 0};
	c.qp = ibv_create_qp(p.pd, &ia);
	REQUIRE(c.qp);
	c.mr = p.a.mr;
	REQUIRE(Pair::up(c, p.b.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(post_send(c, IBV_WR_SEND, 20) == 0);
	REQUIRE(post_send(p.a, IBV_WR_SEND, 11) == 0); /* RNR-free: b had 2 recvs, c used one */
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	return c;
}

/* The one completion left in a's CQ is c's. */
void only_c_left(Pair &p, Side &c)
{
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 20);
	CHECK(wc.qp_num == c.qp->qp_num);
	CHECK(Pair::quiet(p.a));
}

/* a SENDs into a receive of b whose key is not registered: a gets
 * REM_OP_ERR, b LOC_PROT_ERR, and b's descriptor a responder error for its
 * owner to act on. */
void responder_error(Pair &p)
{
	struct ibv_wc wc{};
	REQUIRE(shmv_test::post_recv_sge(p.b.qp, {p.b.addr(0), 64, p.b.mr->lkey ^ 0x100}, 1) == 0);
	REQUIRE(post_send(p.a, IBV_WR_SEND, 10) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_REM_OP_ERR);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
}

} // namespace

TEST_CASE("reset removes the QP's unpolled completions from its CQ, others stay in order",
	  "[robust]")
{
	Pair p;
	Side c = interleaved(p);
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RESET;
	REQUIRE(ibv_modify_qp(p.a.qp, &a, IBV_QP_STATE) == 0);
	only_c_left(p, c);
	ibv_destroy_qp(c.qp);
}

/* The responder's error a sender found (here a receive whose key is not
 * registered) reaches its owner through the progress thread's sweep (10 ms)
 * or the owner's next ibv_query_qp / ibv_modify_qp. An application that
 * resets the QP and brings it back before the sweep (rdma-core's
 * test_mr_rereg_pd does) must find it working: the error belonged to the
 * QP's previous life. */
TEST_CASE("RC: a responder error still pending when its QP is reset does not follow it",
	  "[robust]")
{
	Pair p;
	p.connect();
	struct ibv_wc wc{};
	responder_error(p);
	/* The responder is in ERR as it would be on a device, whether the
	 * sweep has come by or not. */
	struct ibv_qp_attr attr{};
	struct ibv_qp_init_attr init{};
	REQUIRE(ibv_query_qp(p.b.qp, &attr, IBV_QP_STATE, &init) == 0);
	CHECK(attr.qp_state == IBV_QPS_ERR);

	struct ibv_qp_attr reset{};
	reset.qp_state = IBV_QPS_RESET;
	for (Side *s : {&p.b, &p.a})
		REQUIRE(ibv_modify_qp(s->qp, &reset, IBV_QP_STATE) == 0);
	p.connect();
	/* Several sweeps later the QP is still in RTS and carries traffic. */
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	REQUIRE(ibv_query_qp(p.b.qp, &attr, IBV_QP_STATE, &init) == 0);
	CHECK(attr.qp_state == IBV_QPS_RTS);
	REQUIRE(Pair::post_recv(p.a, 2, 0, 64) == 0);
	REQUIRE(post_send(p.b, IBV_WR_SEND, 20) == 0);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 20 && wc.status == IBV_WC_SUCCESS));
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS));
}

/* A post is the other place the owner meets such an error first: a SEND
 * posted right after it, toward a requester already back in RTS, is flushed
 * as on a device (whose QP entered ERR with the error), not delivered. */
TEST_CASE("RC: a post right after a responder error finds its QP in ERR", "[robust]")
{
	Pair p;
	p.connect();
	struct ibv_wc wc{};
	responder_error(p);

	struct ibv_qp_attr reset{};
	reset.qp_state = IBV_QPS_RESET;
	REQUIRE(ibv_modify_qp(p.a.qp, &reset, IBV_QP_STATE) == 0);
	REQUIRE(Pair::up(p.a, p.b.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(Pair::post_recv(p.a, 2, 0, 64) == 0);
	REQUIRE(post_send(p.b, IBV_WR_SEND, 20) == 0);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 20 && wc.status == IBV_WC_WR_FLUSH_ERR));
	CHECK(Pair::quiet(p.a));
}

/* libmlx5's destroy_qp cleans both CQs of the QP's completions too: an
 * application that polls after destroying a QP never sees its number. */
TEST_CASE("destroy removes the QP's unpolled completions from its CQs, others stay in order",
	  "[robust]")
{
	Pair p;
	Side c = interleaved(p);
	REQUIRE(ibv_destroy_qp(p.a.qp) == 0);
	p.a.qp = nullptr;
	only_c_left(p, c);
	/* Receive completions: b's CQ held 1 and 2. */
	REQUIRE(ibv_destroy_qp(p.b.qp) == 0);
	p.b.qp = nullptr;
	CHECK(Pair::quiet(p.b));
	ibv_destroy_qp(c.qp);
}

TEST_CASE("UD: a qkey changed in RTS (RTS->RTS) is the one the engine checks", "[robust]")
{
	Options o;
	o.type = IBV_QPT_UD;
	Pair p(o);
	p.connect();
	struct ibv_ah_attr aa{};
	aa.dlid = p.lid;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(p.pd, &aa);
	REQUIRE(ah);
	REQUIRE(Pair::post_recv(p.b, 1, 0, 128) == 0);
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTS;
	a.qkey = 0x5555;
	REQUIRE(ibv_modify_qp(p.b.qp, &a, IBV_QP_STATE | IBV_QP_QKEY) == 0);
	/* The old qkey is dropped now, the new one delivered. */
	REQUIRE(post_send(p.a, IBV_WR_SEND, 7, p.b.qp->qp_num, ah, 0x1234) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(Pair::quiet(p.b));
	REQUIRE(post_send(p.a, IBV_WR_SEND, 8, p.b.qp->qp_num, ah, 0x5555) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 1);
	ibv_destroy_ah(ah);
}

TEST_CASE("RC: min_rnr_timer changed in RTS is the one the requester waits", "[robust]")
{
	Pair p;
	p.connect(1); /* rnr_retry 1: one wait, then RNR_RETRY_EXC_ERR */
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTS;
	a.min_rnr_timer = 24; /* 40.96 ms (it was 1: 10 us) */
	REQUIRE(ibv_modify_qp(p.b.qp, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0);
	auto t0 = std::chrono::steady_clock::now();
	REQUIRE(post_send(p.a, IBV_WR_SEND, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
		std::chrono::steady_clock::now() - t0).count();
	CHECK(wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
	CHECK(ms >= 35);
}

TEST_CASE("RC: SENDs queued behind an RNR go once the responder can take them all",
	  "[robust]")
{
	/* An early retry that took what was there would leave the rest of
	 * the queue to RNR again, and a sender would trail its receiver a
	 * few receives at a time. */
	Pair p;
	p.connect(); /* rnr_retry 7; the RQ has 16 entries */
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTS;
	a.min_rnr_timer = 0; /* 655.36 ms: only early retries within the test */
	REQUIRE(ibv_modify_qp(p.b.qp, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0);
	constexpr uint64_t sends = 6;
	for (uint64_t i = 0; i < sends; i++)
		REQUIRE(post_send(p.a, IBV_WR_SEND, 1 + i) == 0);
	REQUIRE(Pair::quiet(p.a, 20));
	/* Receives for 4 of the 6: nothing goes (the test's polls and the
	 * progress thread both look meanwhile). */
	for (uint64_t i = 0; i < 4; i++)
		REQUIRE(Pair::post_recv(p.b, 100 + i, i * 64, 64) == 0);
	CHECK(Pair::quiet(p.a, 50));
	CHECK(Pair::quiet(p.b, 1));
	/* The last 2: all 6 go, in order. */
	for (uint64_t i = 4; i < sends; i++)
		REQUIRE(Pair::post_recv(p.b, 100 + i, i * 64, 64) == 0);
	for (uint64_t i = 0; i < sends; i++) {
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc, 300));
		CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 + i));
		REQUIRE(Pair::wait_wc(p.b, wc, 300));
		CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 100 + i));
	}
}

TEST_CASE("RC: a zero-length SEND into a receive WQE without SGEs", "[robust]")
{
	/* The WQE's (empty) SGE list is copied out of the ring: no memcpy
	 * into a null vector (UBSan found it under the stress test). */
	Pair p;
	p.connect();
	struct ibv_recv_wr rwr{}, *rbad = nullptr;
	rwr.wr_id = 7;
	REQUIRE(ibv_post_recv(p.b.qp, &rwr, &rbad) == 0);
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 8;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 8));
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.byte_len == 0 &&
	       wc.opcode == IBV_WC_RECV));
}

TEST_CASE("RC: a zero-length WRITE, WRITE_WITH_IMM or READ checks neither address nor rkey",
	  "[robust]")
{
	/* IBA C9-88: a zero-length RDMA request need not carry a valid
	 * address or R_Key (a WRITE_WITH_IMM of nothing is a common
	 * notification); the responder QP's remote access is still checked. */
	Pair p;
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 7, 0, 64) == 0);
	auto post_empty = [&](enum ibv_wr_opcode op) {
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = uint64_t(op);
		wr.opcode = op;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(5);
		wr.wr.rdma.remote_addr = 0x1234;
		wr.wr.rdma.rkey = 0xdead00;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == uint64_t(op));
		return wc.status;
	};
	for (enum ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE_WITH_IMM}) {
		CAPTURE(op);
		CHECK(post_empty(op) == IBV_WC_SUCCESS);
	}
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.byte_len == 0 &&
	       wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.imm_data == htonl(5)));

	/* Without remote write access at the responder, even nothing is
	 * refused. */
	struct ibv_qp_attr a{};
	a.qp_access_flags = 0;
	REQUIRE(ibv_modify_qp(p.b.qp, &a, IBV_QP_ACCESS_FLAGS) == 0);
	CHECK(post_empty(IBV_WR_RDMA_WRITE) == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("RC: a responder without READ/atomic resources refuses READs and atomics",
	  "[robust]")
{
	/* mlx5_ib: with max_dest_rd_atomic 0 the QP context keeps remote
	 * write access only, whatever qp_access_flags say. */
	const enum ibv_wr_opcode op = GENERATE(IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD);
	CAPTURE(op);
	Pair p;
	REQUIRE(Pair::up(p.a, p.b.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	shmv_test::QpPath path;
	path.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	path.max_rd_atomic = 0;
	REQUIRE(shmv_test::qp_to_rts(p.b.qp, IBV_QPT_RC, p.a.qp->qp_num, p.lid, path) == 0);
	struct ibv_send_wr wr{};
	wr.wr.rdma.remote_addr = p.b.addr(0);
	wr.wr.rdma.rkey = p.b.mr->rkey;
	REQUIRE(Pair::post8(p.a, IBV_WR_RDMA_WRITE, 1, wr) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS));
	if (op != IBV_WR_RDMA_READ) {
		wr.wr.atomic.remote_addr = p.b.addr(0);
		wr.wr.atomic.rkey = p.b.mr->rkey;
	}
	REQUIRE(Pair::post8(p.a, op, 2, wr) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 2);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("RC: a SEND in its RNR wait goes as soon as the responder reposts, not at the timer",
	  "[robust]")
{
	Pair p;
	p.connect(); /* rnr_retry 7 */
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTS;
	a.min_rnr_timer = 0; /* 655.36 ms */
	REQUIRE(ibv_modify_qp(p.b.qp, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0);
	REQUIRE(post_send(p.a, IBV_WR_SEND, 1) == 0);
	/* No receive yet: RNR, the requester waits. */
	REQUIRE(Pair::quiet(p.a, 20));
	/* A batch of receives (a quarter of the 16-entry RQ) ends the wait:
	 * the requester's empty poll_cq retries early. */
	for (uint64_t i = 0; i < 4; i++)
		REQUIRE(Pair::post_recv(p.b, 100 + i, i * 64, 64) == 0);
	auto t0 = std::chrono::steady_clock::now();
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
		std::chrono::steady_clock::now() - t0).count();
	CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 1));
	CHECK(ms < 300);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == 100));
}

namespace {

/* A one-entry CQ (side a's), a WRITE's completion in it, and an
 * ibv_start_poll() batch open on it, which holds the CQ's poll lock until
 * ibv_end_poll(): 0, or a failure code. */
int open_batch(Pair &p, const struct ibv_send_wr &wr)
{
	p.connect();
	if (Pair::post8(p.a, IBV_WR_RDMA_WRITE, 1, wr))
		return 1;
	/* A WRITE completes in its post (or soon after). */
	struct ibv_poll_cq_attr pa{};
	int err = ENOENT;
	for (int i = 0; i < 1000 && err == ENOENT; i++)
		if ((err = ibv_start_poll(p.a.cqx, &pa)) == ENOENT)
			std::this_thread::sleep_for(std::chrono::milliseconds(1));
	return err || p.a.cqx->wr_id != 1 ? 2 : 0;
}

/* The next async event of `ctx` (acknowledged; its type and element in
 * `ev`), waited for 2 s at most: IBV_EVENT_DEVICE_FATAL stands for none. */
enum ibv_event_type next_event(struct ibv_context *ctx, struct ibv_async_event &ev)
{
	struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
	if (poll(&pfd, 1, 2000) != 1 || ibv_get_async_event(ctx, &ev) != 0)
		return IBV_EVENT_DEVICE_FATAL;
	ibv_ack_async_event(&ev);
	return ev.event_type;
}

enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a{};
	struct ibv_qp_init_attr ia{};
	return ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0 ? a.qp_state : IBV_QPS_UNKNOWN;
}

Options one_entry_cq()
{
	Options o;
	o.cqe = 1;
	return o;
}

struct ibv_send_wr write_to(Pair &p)
{
	struct ibv_send_wr wr{};
	wr.wr.rdma.remote_addr = p.b.addr(0);
	wr.wr.rdma.rkey = p.b.mr->rkey;
	return wr;
}

} // namespace

/* The tests below run where a deadlock is a hang: in a child process (the
 * test binary again, running the hidden test of the same scenario), which
 * the test kills after its bound. */

TEST_CASE("child: a poll batch deregisters an MR while a post overruns the CQ",
	  "[.overrun-batch-child]")
{
	/* The poster holds its QP's send lock while it reports the overrun
	 * (IBV_EVENT_CQ_ERR); the batch holds the CQ's poll lock, and
	 * ibv_dereg_mr() makes every engine drop its holds under its send
	 * lock. */
	Pair p(one_entry_cq());
	const struct ibv_send_wr wr = write_to(p);
	REQUIRE(open_batch(p, wr) == 0);
	/* With the batch open, two more completions overrun the one-entry CQ
	 * (whether or not the batch freed its slot). Both posts return unless
	 * the report waits for the batch: the deregistration waits for them,
	 * 2 s at most. */
	std::atomic<bool> posted{false};
	std::thread poster([&] {
		Pair::post8(p.a, IBV_WR_RDMA_WRITE, 2, wr);
		Pair::post8(p.a, IBV_WR_RDMA_WRITE, 3, wr);
		posted = true;
	});
	for (int i = 0; i < 2000 && !posted; i++)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	struct ibv_mr *mr = ibv_reg_mr(p.pd, p.a.at(0), 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	CHECK((mr && ibv_dereg_mr(mr) == 0));
	ibv_end_poll(p.a.cqx);
	poster.join();
	struct ibv_async_event ev;
	REQUIRE(ibv_get_async_event(p.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == p.a.cq);
	ibv_ack_async_event(&ev);
}

TEST_CASE("a poll batch that deregisters an MR while a post overruns the CQ does not deadlock",
	  "[robust][overrun]")
{
	CHECK(shmv_test::run_self({"[overrun-batch-child]"}, 20) == 0);
}

TEST_CASE("child: a poll batch queries a QP being reset", "[.reset-batch-child]")
{
	/* The reset removes the QP's completions from the CQ, which waits for
	 * the batch's poll lock; the batch's ibv_query_qp() takes the QP's
	 * lock, which the reset must not hold meanwhile (libmlx5 cleans the
	 * CQ after the command, under no QP lock). */
	Pair p(one_entry_cq());
	REQUIRE(open_batch(p, write_to(p)) == 0);
	std::thread resetter([&] {
		struct ibv_qp_attr a{};
		a.qp_state = IBV_QPS_RESET;
		ibv_modify_qp(p.a.qp, &a, IBV_QP_STATE);
	});
	/* Time for the reset to reach the CQ (if it did not yet, the test
	 * passes without telling anything). */
	std::this_thread::sleep_for(std::chrono::milliseconds(200));
	struct ibv_qp_attr attr{};
	struct ibv_qp_init_attr init{};
	CHECK(ibv_query_qp(p.a.qp, &attr, IBV_QP_STATE, &init) == 0);
	ibv_end_poll(p.a.cqx);
	resetter.join();
	REQUIRE(ibv_query_qp(p.a.qp, &attr, IBV_QP_STATE, &init) == 0);
	CHECK(attr.qp_state == IBV_QPS_RESET);
}

TEST_CASE("a poll batch that queries a QP being reset does not deadlock", "[robust]")
{
	CHECK(shmv_test::run_self({"[reset-batch-child]"}, 20) == 0);
}

TEST_CASE("a CQ a peer overran raises IBV_EVENT_CQ_ERR without being polled; the QP enters ERR",
	  "[robust][overrun]")
{
	/* b's one-entry CQ takes a's first SEND's completion; the second
	 * overruns it. The sender sets the ring's word; b's side raises the
	 * event, whether or not b polls (here it never does). */
	Options o = one_entry_cq();
	o.type = GENERATE(IBV_QPT_RC, IBV_QPT_UD);
	CAPTURE(o.type);
	Pair p(o);
	p.connect();
	struct ibv_ah *ah = nullptr;
	if (o.type == IBV_QPT_UD) {
		struct ibv_ah_attr aa{};
		aa.dlid = p.lid;
		aa.port_num = 1;
		REQUIRE((ah = ibv_create_ah(p.pd, &aa)));
	}
	REQUIRE(Pair::post_recv(p.b, 1, 0, 64) == 0);
	REQUIRE(Pair::post_recv(p.b, 2, 64, 64) == 0);
	for (uint64_t id : {10, 11}) {
		struct ibv_sge sge = {p.a.addr(0), 8, p.a.mr->lkey};
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = id;
		wr.opcode = IBV_WR_SEND;
		wr.sg_list = &sge;
		wr.num_sge = 1; /* unsignaled: a's own CQ stays empty */
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = p.b.qp->qp_num;
		wr.wr.ud.remote_qkey = 0x1234;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	}
	struct pollfd pfd = {p.ctx->async_fd, POLLIN, 0};
	REQUIRE(poll(&pfd, 1, 2000) == 1);
	struct ibv_async_event ev;
	REQUIRE(ibv_get_async_event(p.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == p.b.cq);
	ibv_ack_async_event(&ev);
	/* b's RQ tried its CQ in error: b's QP enters ERR (IBA's Local Work
	 * Queue Catastrophic Error), with its own event. */
	CHECK(next_event(p.ctx, ev) == IBV_EVENT_QP_FATAL);
	CHECK(ev.element.qp == p.b.qp);
	CHECK(qp_state(p.b.qp) == IBV_QPS_ERR);
	CHECK(qp_state(p.a.qp) == IBV_QPS_RTS);
	if (ah)
		ibv_destroy_ah(ah);
}

TEST_CASE("RC: a misaligned atomic is an invalid request; the responder enters ERR too",
	  "[robust]")
{
	/* IBA: the responder NAKs it (REM_INV_REQ_ERR at the requester) and
	 * enters ERR with an Invalid Request Local Work Queue Error. */
	Pair p;
	p.connect();
	struct ibv_send_wr wr{};
	wr.wr.atomic.remote_addr = p.b.addr(4);
	wr.wr.atomic.rkey = p.b.mr->rkey;
	wr.wr.atomic.compare_add = 1;
	REQUIRE(Pair::post8(p.a, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, wr) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 1 && wc.status == IBV_WC_REM_INV_REQ_ERR));
	struct ibv_async_event ev{};
	CHECK(next_event(p.ctx, ev) == IBV_EVENT_QP_REQ_ERR);
	CHECK(ev.element.qp == p.b.qp);
	CHECK(qp_state(p.b.qp) == IBV_QPS_ERR);
	CHECK(qp_state(p.a.qp) == IBV_QPS_ERR);
}

TEST_CASE("the first message a QP in RTR takes raises IBV_EVENT_COMM_EST, once", "[robust]")
{
	/* IBA 11.6.3: Communication Established, raised by the device when a
	 * connected QP receives in RTR (what rdma_cm's passive side uses when
	 * the RTU is lost). */
	Options o;
	o.type = GENERATE(IBV_QPT_RC, IBV_QPT_UC);
	CAPTURE(o.type);
	Pair p(o);
	REQUIRE(Pair::up(p.a, p.b.qp->qp_num, p.lid, o.type) == 0);
	shmv_test::QpPath path;
	path.access = IBV_ACCESS_REMOTE_WRITE;
	REQUIRE(shmv_test::qp_to_init(p.b.qp, o.type, path) == 0);
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = p.a.qp->qp_num;
	a.ah_attr.dlid = p.lid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (o.type == IBV_QPT_RC)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	REQUIRE(ibv_modify_qp(p.b.qp, &a, mask) == 0);
	for (uint64_t i = 0; i < 2; i++)
		REQUIRE(Pair::post_recv(p.b, 7 + i, 64 * i, 64) == 0);
	auto quiet = [&] {
		struct pollfd pfd = {p.ctx->async_fd, POLLIN, 0};
		return poll(&pfd, 1, 50) == 0;
	};
	CHECK(quiet());
	struct ibv_wc wc{};
	REQUIRE(Pair::post8(p.a, IBV_WR_SEND, 1) == 0);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS));
	struct ibv_async_event ev{};
	CHECK(next_event(p.ctx, ev) == IBV_EVENT_COMM_EST);
	CHECK(ev.element.qp == p.b.qp);
	REQUIRE(Pair::post8(p.a, IBV_WR_SEND, 2) == 0);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 8);
	CHECK(quiet()); /* once */
	CHECK(qp_state(p.b.qp) == IBV_QPS_RTR);
}

TEST_CASE("a QP whose send completion overruns its CQ enters ERR with IBV_EVENT_QP_FATAL",
	  "[robust][overrun]")
{
	Pair p(one_entry_cq());
	p.connect();
	const struct ibv_send_wr wr = write_to(p);
	REQUIRE(Pair::post8(p.a, IBV_WR_RDMA_WRITE, 1, wr) == 0);
	REQUIRE(Pair::post8(p.a, IBV_WR_RDMA_WRITE, 2, wr) == 0); /* no room: overrun */
	struct ibv_async_event ev{};
	CHECK(next_event(p.ctx, ev) == IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == p.a.cq);
	CHECK(next_event(p.ctx, ev) == IBV_EVENT_QP_FATAL);
	CHECK(ev.element.qp == p.a.qp);
	CHECK(qp_state(p.a.qp) == IBV_QPS_ERR);
	CHECK(qp_state(p.b.qp) == IBV_QPS_RTS);
	/* The completion that fitted is still there. */
	struct ibv_wc wc{};
	CHECK(ibv_poll_cq(p.a.cq, 1, &wc) == 1);
	CHECK(wc.wr_id == 1);
}
