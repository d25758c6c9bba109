/* SPDX-License-Identifier: MIT */
/*
 * The QP control path through the engine API: creation checks, the state
 * machine on live QPs, attribute validation, query, XRC sharing, multicast,
 * destruction order, data-path hooks and concurrency. Runs on the default
 * configuration (one IB port, mlx5 profile); [eth] and [2ports] cases run
 * as their own meson tests with that configuration.
 */
#include "qp_fixture.h"
#include "qp_state.h"

#include <catch2/catch.hpp>

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

using namespace shmverbs;
using namespace qptest;

namespace {

const enum ibv_qp_type all_types[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND,
				      IBV_QPT_XRC_RECV};

struct ibv_qp_attr query_all(Qp &qp, struct ibv_qp_init_attr *init = nullptr)
{
	struct ibv_qp_attr a{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(query_qp(qp, a, IBV_QP_STATE, ia) == 0);
	if (init)
		*init = ia;
	return a;
}

bool same_attr(const struct ibv_qp_attr &x, const struct ibv_qp_attr &y)
{
	return std::memcmp(&x, &y, sizeof(x)) == 0;
}

/* Reads one queued async event without blocking, or returns false. */
bool next_event(Context &ctx, struct ibv_async_event &ev)
{
	int fd = ctx.abi()->async_fd;
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	int err = ctx.get_async_event(ev);
	fcntl(fd, F_SETFL, fl);
	return err == 0;
}

} // namespace

TEST_CASE("create: an RC QP gets a number, mlx5 capacities and uses on its objects", "[qp]")
{
	Env e;
	struct ibv_qp_init_attr_ex a = e.attr(IBV_QPT_RC);
	a.cap = ibv_qp_cap{100, 100, 2, 3, 64};
	int ctx_marker = 0;
	a.qp_context = &ctx_marker;
	Cq *cq = Cq::from(a.send_cq);
	Qp *qp = e.create(a);
	CHECK(qp->abi()->qp_num >= 2);
	CHECK(qp->abi()->qp_num < (1u << 24));
	CHECK(qp->abi()->state == IBV_QPS_RESET);
	CHECK(qp->abi()->qp_type == IBV_QPT_RC);
	CHECK(qp->abi()->context == e.ctx->abi());
	CHECK(qp->abi()->pd == e.pd->abi());
	CHECK(qp->abi()->qp_context == &ctx_marker);
	CHECK(a.cap.max_send_wr == 102);
	CHECK(a.cap.max_inline_data == 124);
	CHECK(a.cap.max_send_sge == 2);
	CHECK(a.cap.max_recv_wr == 128);
	CHECK(a.cap.max_recv_sge == 4);
	CHECK(!qp->has_qp_ex());

	/* The PD and the CQ (once per queue) are in use until destroy. */
	CHECK(e.pd->uses.users == 1);
	CHECK(cq->uses.users == 2);
	CHECK(dealloc_pd(*e.pd) == EBUSY);
	REQUIRE(destroy_qp(*qp) == 0);
	CHECK(e.pd->uses.users == 0);
	CHECK(cq->uses.users == 0);
}

TEST_CASE("create: QP numbers are unique and not reused at once", "[qp]")
{
	Env e;
	Qp *a = e.create();
	Qp *b = e.create();
	uint32_t na = a->abi()->qp_num, nb = b->abi()->qp_num;
	CHECK(na != nb);
	REQUIRE(destroy_qp(*a) == 0);
	Qp *c = e.create();
	CHECK(c->abi()->qp_num != na);
	CHECK(c->abi()->qp_num != nb);
	destroy_qp(*b);
	destroy_qp(*c);
}

TEST_CASE("create: bad requests fail with the errno of rdma-core + mlx5", "[qp]")
{
	Env e;
	auto rc = [&] { return e.attr(IBV_QPT_RC); };
	auto with = [](struct ibv_qp_init_attr_ex a, auto f) {
		f(a);
		return a;
	};
	Env other; /* objects of another context */

	struct {
		const char *what;
		struct ibv_qp_init_attr_ex attr;
		int want;
	} cases[] = {
		{"valid RC", rc(), 0},
		{"unknown comp_mask bit", with(rc(), [](auto &a) { a.comp_mask |= 1u << 7; }), EINVAL},
		{"no PD in comp_mask", with(rc(), [](auto &a) { a.comp_mask = 0; }), EINVAL},
		{"NULL pd", with(rc(), [](auto &a) { a.pd = nullptr; }), EINVAL},
		{"NULL send_cq", with(rc(), [](auto &a) { a.send_cq = nullptr; }), EINVAL},
		{"NULL recv_cq", with(rc(), [](auto &a) { a.recv_cq = nullptr; }), EINVAL},
		{"type 99", with(rc(), [](auto &a) { a.qp_type = ibv_qp_type(99); }), EINVAL},
		{"type 1 (unused)", with(rc(), [](auto &a) { a.qp_type = ibv_qp_type(1); }), EINVAL},
		{"driver QP without mlx5dv", with(rc(), [](auto &a) { a.qp_type = IBV_QPT_DRIVER; }),
		 EINVAL},
		{"raw packet", with(rc(), [](auto &a) { a.qp_type = IBV_QPT_RAW_PACKET; }),
		 EOPNOTSUPP},
		{"TSO header on RC",
		 with(rc(), [](auto &a) { a.comp_mask |= IBV_QP_INIT_ATTR_MAX_TSO_HEADER; }), EINVAL},
		{"RSS", with(rc(), [](auto &a) { a.comp_mask |= IBV_QP_INIT_ATTR_RX_HASH; }),
		 EOPNOTSUPP},
		{"RSS with send ops", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		 }),
		 EINVAL},
		{"indirection table",
		 with(rc(), [](auto &a) { a.comp_mask |= IBV_QP_INIT_ATTR_IND_TABLE; }), EOPNOTSUPP},
		{"unknown create flag", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
			 a.create_flags = 1u << 3;
		 }),
		 EINVAL},
		{"create flag on RC", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
			 a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
		 }),
		 EINVAL},
		{"source QPN on RC", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
			 a.create_flags = IBV_QP_CREATE_SOURCE_QPN;
		 }),
		 EINVAL},
		{"send ops beyond RC's", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			 a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
		 }),
		 EOPNOTSUPP},
		{"unknown send op bit", with(rc(), [](auto &a) {
			 a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			 a.send_ops_flags = 1u << 11;
		 }),
		 EOPNOTSUPP},
		{"send queue over the limit",
		 with(rc(), [](auto &a) { a.cap.max_send_wr = 32768; }), EINVAL},
		{"too many send SGEs", with(rc(), [](auto &a) { a.cap.max_send_sge = 53; }), EINVAL},
		{"too much inline", with(rc(), [](auto &a) { a.cap.max_inline_data = 2000; }),
		 EINVAL},
		{"receive queue over the limit",
		 with(rc(), [](auto &a) { a.cap.max_recv_wr = 32769; }), EINVAL},
		{"PD of another context", with(rc(), [&](auto &a) { a.pd = other.pd->abi(); }),
		 EINVAL},
		{"CQ of another context",
		 with(rc(), [&](auto &a) { a.recv_cq = other.cq()->abi(); }), EINVAL},
	};
	for (auto &c : cases) {
		INFO(c.what);
		CHECK(e.create_errno(c.attr) == c.want);
	}
	/* Nothing failed half-way: no use is left behind. */
	CHECK(e.pd->uses.users == 0);
	for (Cq *cq : e.cqs)
		CHECK(cq->uses.users == 0);
}

TEST_CASE("create: UD flags and send operations", "[qp]")
{
	Env e;
	struct ibv_qp_init_attr_ex a = e.attr(IBV_QPT_UD);
	a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
	a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	CHECK(e.create_errno(a) == 0);
	a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	CHECK(e.create_errno(a) == EINVAL);
	a.create_flags = IBV_QP_CREATE_SOURCE_QPN;
	CHECK(e.create_errno(a) == EOPNOTSUPP);

	struct ibv_qp_init_attr_ex u = e.attr(IBV_QPT_UD);
	u.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	u.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	CHECK(e.create_errno(u) == EOPNOTSUPP);
	u.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	Qp *qp = e.create(u);
	CHECK(qp->has_qp_ex());
	destroy_qp(*qp);
}

TEST_CASE("create: send_ops_flags decide the WQE size and the qp_ex", "[qp]")
{
	Env e;
	struct ibv_qp_init_attr_ex a = e.attr(IBV_QPT_RC);
	a.cap = ibv_qp_cap{128, 1, 1, 1, 0};
	a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	Qp *qp = e.create(a);
	CHECK(a.cap.max_inline_data == 28);
	CHECK(qp->has_qp_ex());
	destroy_qp(*qp);
}

TEST_CASE("create: SRQ rules", "[qp]")
{
	Env e;
	Srq *basic = e.srq();
	Srq *xrc = e.srq(IBV_SRQT_XRC);
	Env other;

	for (enum ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UD}) {
		INFO("type " << t);
		struct ibv_qp_init_attr_ex a = e.attr(t);
		a.srq = basic->abi();
		a.cap.max_recv_wr = 1000;
		a.cap.max_recv_sge = 500; /* ignored with an SRQ */
		Qp *qp = e.create(a);
		CHECK(a.cap.max_recv_wr == 0);
		CHECK(a.cap.max_recv_sge == 0);
		CHECK(qp->abi()->srq == basic->abi());
		CHECK(basic->uses.users == 1);
		struct ibv_qp_init_attr ia{};
		struct ibv_qp_attr qa = query_all(*qp, &ia);
		CHECK(qa.cap.max_recv_wr == 0);
		CHECK(ia.srq == basic->abi());
		REQUIRE(destroy_qp(*qp) == 0);
		CHECK(basic->uses.users == 0);
	}

	auto with_srq = [&](enum ibv_qp_type t, Srq *s) {
		struct ibv_qp_init_attr_ex a = e.attr(t);
		a.srq = s->abi();
		return e.create_errno(a);
	};
	CHECK(with_srq(IBV_QPT_UC, basic) == EINVAL);
	CHECK(with_srq(IBV_QPT_XRC_SEND, basic) == EINVAL);
	CHECK(with_srq(IBV_QPT_RC, xrc) == EINVAL);
	CHECK(with_srq(IBV_QPT_XRC_RECV, basic) == EINVAL);
	CHECK(with_srq(IBV_QPT_XRC_RECV, xrc) == 0);
	CHECK(xrc->uses.users == 0); /* an XRC target keeps no SRQ */

	/* The SRQ must be in the QP's PD. */
	Result<Pd> pd2 = alloc_pd(*e.ctx);
	REQUIRE(pd2);
	CHECK(with_srq(IBV_QPT_RC, e.srq(IBV_SRQT_BASIC, pd2.get())) == EINVAL);
	/* ... and of the same context. */
	CHECK(with_srq(IBV_QPT_RC, other.srq()) == EINVAL);
	/* Over-limit receive requests are refused even with an SRQ. */
	struct ibv_qp_init_attr_ex big = e.attr(IBV_QPT_RC);
	big.srq = basic->abi();
	big.cap.max_recv_wr = 40000;
	CHECK(e.create_errno(big) == EINVAL);
	CHECK(dealloc_pd(*pd2.get()) == 0);
}

TEST_CASE("create: XRC QPs", "[qp][xrc]")
{
	Env e;
	/* The initiator has no receive side: no recv CQ needed, none used. */
	struct ibv_qp_init_attr_ex s = e.attr(IBV_QPT_XRC_SEND);
	Cq *scq = Cq::from(s.send_cq);
	s.recv_cq = nullptr;
	Qp *ini = e.create(s);
	CHECK(scq->uses.users == 1);
	CHECK(query_all(*ini).cap.max_recv_wr == 0);
	destroy_qp(*ini);

	/* The target needs an XRCD, and nothing else. */
	struct ibv_qp_init_attr_ex r = e.attr(IBV_QPT_XRC_RECV);
	Xrcd *x = Xrcd::from(r.xrcd);
	Qp *tgt = e.create(r);
	CHECK(x->uses.users == 1);
	CHECK(e.pd->uses.users == 0);
	CHECK(tgt->abi()->qp_type == IBV_QPT_XRC_RECV);
	CHECK(xrc_registry_size() >= 1);
	REQUIRE(destroy_qp(*tgt) == 0);
	CHECK(x->uses.users == 0);

	r.comp_mask = IBV_QP_INIT_ATTR_PD; /* no XRCD */
	CHECK(e.create_errno(r) == EINVAL);
	r.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	r.xrcd = nullptr;
	CHECK(e.create_errno(r) == EINVAL);
	/* An XRC target has nothing to send with. */
	struct ibv_qp_init_attr_ex ops = e.attr(IBV_QPT_XRC_RECV);
	ops.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ops.send_ops_flags = IBV_QP_EX_WITH_SEND;
	CHECK(e.create_errno(ops) == EOPNOTSUPP);
}

TEST_CASE("open_qp: another handle on an XRC target, found by domain and number",
	  "[qp][xrc]")
{
	Env a, b;
	const uint64_t domain = 0xd0d0;
	struct ibv_qp_init_attr_ex r = a.attr(IBV_QPT_XRC_RECV);
	r.xrcd = a.xrcd(domain)->abi();
	Qp *tgt = a.create(r);
	uint32_t qpn = tgt->abi()->qp_num;
	bring_to(*tgt, IBV_QPS_INIT);

	Xrcd *bx = b.xrcd(domain);
	struct ibv_qp_open_attr oa{};
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = qpn;
	oa.xrcd = bx->abi();
	oa.qp_type = IBV_QPT_XRC_RECV;
	int marker;
	oa.qp_context = &marker;
	Result<Qp> opened = open_qp(*b.ctx, oa);
	REQUIRE(opened);
	Qp *o = opened.get();
	CHECK(o->abi()->qp_num == qpn);
	CHECK(o->abi()->state == IBV_QPS_UNKNOWN);
	CHECK(o->abi()->pd == nullptr);
	CHECK(o->abi()->qp_context == &marker);
	CHECK(bx->uses.users == 1);
	/* Both handles see and change the same QP. */
	CHECK(state_of(*o) == IBV_QPS_INIT);
	struct ibv_qp_attr m = good_attr(IBV_QPS_RTR);
	REQUIRE(modify_qp(*o, m, step_mask(IBV_QPT_XRC_RECV, IBV_QPS_RTR)) == 0);
	CHECK(state_of(*tgt) == IBV_QPS_RTR);

	/* An event about the QP (one the data path raises, as for a CQ
	 * its receive found overrun) reaches every handle, in its own
	 * context. */
	m = good_attr(IBV_QPS_RTS);
	REQUIRE(modify_qp(*o, m, step_mask(IBV_QPT_XRC_RECV, IBV_QPS_RTS)) == 0);
	post_qp_event(*tgt->core, IBV_EVENT_QP_FATAL);
	struct ibv_async_event ea{}, eb{};
	REQUIRE(next_event(*a.ctx, ea));
	REQUIRE(next_event(*b.ctx, eb));
	CHECK(ea.event_type == IBV_EVENT_QP_FATAL);
	CHECK(ea.element.qp == tgt->abi());
	CHECK(eb.event_type == IBV_EVENT_QP_FATAL);
	CHECK(eb.element.qp == o->abi());
	ack_async_event(ea);
	ack_async_event(eb);

	/* The QP outlives its creator while opened elsewhere. */
	REQUIRE(destroy_qp(*tgt) == 0);
	CHECK(state_of(*o) == IBV_QPS_RTS);
	Result<Qp> again = open_qp(*b.ctx, oa);
	REQUIRE(again);
	REQUIRE(destroy_qp(*again.get()) == 0);
	REQUIRE(destroy_qp(*o) == 0);
	CHECK(bx->uses.users == 0);
	/* Gone with its last handle. */
	CHECK(open_qp(*b.ctx, oa).error() == EINVAL);
}

TEST_CASE("open_qp: bad requests", "[qp][xrc]")
{
	Env e;
	struct ibv_qp_init_attr_ex r = e.attr(IBV_QPT_XRC_RECV);
	Qp *tgt = e.create(r);
	struct ibv_qp_open_attr good{};
	good.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	good.qp_num = tgt->abi()->qp_num;
	good.xrcd = r.xrcd;
	good.qp_type = IBV_QPT_XRC_RECV;

	auto err = [&](struct ibv_qp_open_attr oa) {
		Result<Qp> q = open_qp(*e.ctx, oa);
		if (q) {
			destroy_qp(*q.get());
			return 0;
		}
		return q.error();
	};
	CHECK(err(good) == 0);
	struct ibv_qp_open_attr x = good;
	x.comp_mask |= IBV_QP_OPEN_ATTR_RESERVED;
	CHECK(err(x) == EOPNOTSUPP);
	x = good;
	x.comp_mask &= ~IBV_QP_OPEN_ATTR_TYPE;
	CHECK(err(x) == EINVAL);
	x = good;
	x.qp_type = IBV_QPT_RC;
	CHECK(err(x) == EINVAL);
	x = good;
	x.qp_num = good.qp_num + 1000;
	CHECK(err(x) == EINVAL);
	x = good;
	x.xrcd = e.xrcd(0x777)->abi(); /* another domain */
	CHECK(err(x) == EINVAL);
	x = good;
	x.xrcd = nullptr;
	CHECK(err(x) == EINVAL);
	/* An RC QP cannot be opened. */
	Qp *rc = e.create(IBV_QPT_RC);
	x = good;
	x.qp_num = rc->abi()->qp_num;
	CHECK(err(x) == EINVAL);
	destroy_qp(*rc);
	destroy_qp(*tgt);
}

TEST_CASE("modify: every type walks the whole state machine; a wrong mask changes nothing",
	  "[qp][state]")
{
	for (enum ibv_qp_type type : all_types) {
		Env e;
		Qp *qp = e.create(type);
		INFO("type " << type);

		auto attempt = [&](enum ibv_qp_state to, int mask, int want) {
			INFO("to " << qp_state_name(to) << " mask " << mask);
			struct ibv_qp_attr before = query_all(*qp);
			struct ibv_qp_attr a = good_attr(to);
			CHECK(modify_qp(*qp, a, mask) == want);
			if (want)
				CHECK(same_attr(before, query_all(*qp)));
			else
				CHECK(state_of(*qp) == to);
		};
		/* mask = the required attributes (all of them) + optional ones */
		auto step = [&](enum ibv_qp_state to, int mask, int optional = 0) {
			const int required = mask & ~optional;
			/* each required attribute missing, an illegal one added */
			for (int bit = 1; bit < (1 << 21); bit <<= 1)
				if ((required & bit) && bit != IBV_QP_STATE)
					attempt(to, mask & ~bit, EINVAL);
			attempt(to, mask | IBV_QP_DEST_QPN | IBV_QP_CAP, EINVAL);
			attempt(to, mask, 0);
		};
		attempt(IBV_QPS_ERR, IBV_QP_STATE, EINVAL); /* RESET -> ERR */
		attempt(IBV_QPS_RTR, step_mask(type, IBV_QPS_RTR), EINVAL);
		step(IBV_QPS_INIT, step_mask(type, IBV_QPS_INIT));
		step(IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PKEY_INDEX, IBV_QP_PKEY_INDEX);
		step(IBV_QPS_RTR, step_mask(type, IBV_QPS_RTR));
		attempt(IBV_QPS_SQD, IBV_QP_STATE, EINVAL); /* RTR -> SQD */
		step(IBV_QPS_RTS, step_mask(type, IBV_QPS_RTS));
		/* mlx5 drains no QP on request ("[sqd]": the rxe profile's SQD). */
		attempt(IBV_QPS_SQD, IBV_QP_STATE, EINVAL);
		attempt(IBV_QPS_INIT, step_mask(type, IBV_QPS_INIT), EINVAL);
		step(IBV_QPS_RTS, IBV_QP_STATE);
		step(IBV_QPS_ERR, IBV_QP_STATE);
		step(IBV_QPS_ERR, IBV_QP_STATE);
		attempt(IBV_QPS_RTS, IBV_QP_STATE, EINVAL);
		step(IBV_QPS_RESET, IBV_QP_STATE);
		step(IBV_QPS_RESET, IBV_QP_STATE);
		step(IBV_QPS_INIT, step_mask(type, IBV_QPS_INIT));
		REQUIRE(destroy_qp(*qp) == 0);
	}
}

TEST_CASE("modify: attributes an XRC type cannot use are accepted and ignored", "[qp][xrc]")
{
	Env e;
	Qp *ini = e.create(IBV_QPT_XRC_SEND);
	struct ibv_qp_attr a = good_attr(IBV_QPS_INIT);
	a.min_rnr_timer = 5;
	REQUIRE(modify_qp(*ini, a, step_mask(IBV_QPT_XRC_SEND, IBV_QPS_INIT) |
					  IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_DEST_RD_ATOMIC) == 0);
	CHECK(query_all(*ini).min_rnr_timer == 0);
	destroy_qp(*ini);

	Qp *tgt = e.create(IBV_QPT_XRC_RECV);
	bring_to(*tgt, IBV_QPS_RTR);
	a = good_attr(IBV_QPS_RTS);
	REQUIRE(modify_qp(*tgt, a, step_mask(IBV_QPT_XRC_RECV, IBV_QPS_RTS) | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	CHECK(query_all(*tgt).retry_cnt == 0);
	destroy_qp(*tgt);
}

TEST_CASE("modify: attribute values are checked as mlx5_ib checks them", "[qp]")
{
	Env e;
	struct {
		const char *what;
		enum ibv_qp_state from;
		enum ibv_qp_state to;
		int extra_mask;
		void (*edit)(struct ibv_qp_attr &);
		int want;
	} cases[] = {
		{"port 0", IBV_QPS_RESET, IBV_QPS_INIT, 0, [](auto &a) { a.port_num = 0; }, EINVAL},
		{"port 2 of 1", IBV_QPS_RESET, IBV_QPS_INIT, 0, [](auto &a) { a.port_num = 2; },
		 EINVAL},
		{"pkey index 127", IBV_QPS_RESET, IBV_QPS_INIT, 0,
		 [](auto &a) { a.pkey_index = 127; }, 0},
		{"pkey index 128", IBV_QPS_RESET, IBV_QPS_INIT, 0,
		 [](auto &a) { a.pkey_index = 128; }, EINVAL},
		{"MTU 4096", IBV_QPS_INIT, IBV_QPS_RTR, 0, [](auto &a) { a.path_mtu = IBV_MTU_4096; },
		 0},
		{"MTU above the port's", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.path_mtu = ibv_mtu(6); }, EINVAL},
		{"MTU 0", IBV_QPS_INIT, IBV_QPS_RTR, 0, [](auto &a) { a.path_mtu = ibv_mtu(0); },
		 EINVAL},
		{"responder resources 16", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.max_dest_rd_atomic = 16; }, 0},
		{"responder resources 17", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.max_dest_rd_atomic = 17; }, EINVAL},
		{"path on another port", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.ah_attr.port_num = 2; }, EINVAL},
		{"path port 0", IBV_QPS_INIT, IBV_QPS_RTR, 0, [](auto &a) { a.ah_attr.port_num = 0; },
		 EINVAL},
		{"GRH with sgid 0", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.ah_attr.is_global = 1; }, 0},
		{"GRH with an empty sgid", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) {
			 a.ah_attr.is_global = 1;
			 a.ah_attr.grh.sgid_index = 1;
		 },
		 ENODATA},
		{"GRH with sgid beyond the table", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) {
			 a.ah_attr.is_global = 1;
			 a.ah_attr.grh.sgid_index = 200;
		 },
		 EINVAL},
		{"static rate 600G", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.ah_attr.static_rate = IBV_RATE_600_GBPS; }, 0},
		{"unknown static rate", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.ah_attr.static_rate = 23; }, EINVAL},
		{"alternate path", IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_ALT_PATH, [](auto &) {}, 0},
		{"alternate path on port 2", IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_ALT_PATH,
		 [](auto &a) { a.alt_port_num = a.alt_ah_attr.port_num = 2; }, EINVAL},
		{"alternate ports disagree", IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_ALT_PATH,
		 [](auto &a) { a.alt_ah_attr.port_num = 0; }, EINVAL},
		{"alternate timeout 32", IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_ALT_PATH,
		 [](auto &a) { a.alt_timeout = 32; }, 0}, /* mlx5: 5 bits kept */
		{"min RNR timer 32", IBV_QPS_INIT, IBV_QPS_RTR, 0,
		 [](auto &a) { a.min_rnr_timer = 32; }, 0},
		{"initiator depth 16", IBV_QPS_RTR, IBV_QPS_RTS, 0,
		 [](auto &a) { a.max_rd_atomic = 16; }, 0},
		{"initiator depth 17", IBV_QPS_RTR, IBV_QPS_RTS, 0,
		 [](auto &a) { a.max_rd_atomic = 17; }, EINVAL},
		{"timeout 31", IBV_QPS_RTR, IBV_QPS_RTS, 0, [](auto &a) { a.timeout = 31; }, 0},
		{"timeout 32", IBV_QPS_RTR, IBV_QPS_RTS, 0, [](auto &a) { a.timeout = 32; }, 0},
		{"retry count 8", IBV_QPS_RTR, IBV_QPS_RTS, 0, [](auto &a) { a.retry_cnt = 8; }, 0},
		{"RNR retry 8", IBV_QPS_RTR, IBV_QPS_RTS, 0, [](auto &a) { a.rnr_retry = 8; }, 0},
		{"migration state 3", IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_PATH_MIG_STATE,
		 [](auto &a) { a.path_mig_state = ibv_mig_state(3); }, 0},
		{"correct current state", IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_CUR_STATE,
		 [](auto &a) { a.cur_qp_state = IBV_QPS_RTR; }, 0},
		{"wrong current state", IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_CUR_STATE,
		 [](auto &a) { a.cur_qp_state = IBV_QPS_SQD; }, EINVAL},
		{"current state out of range", IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_CUR_STATE,
		 [](auto &a) { a.cur_qp_state = ibv_qp_state(9); }, EINVAL},
		{"new state out of range", IBV_QPS_RTR, IBV_QPS_RTS, 0,
		 [](auto &a) { a.qp_state = ibv_qp_state(7); }, EINVAL},
		{"unknown mask bit", IBV_QPS_RTR, IBV_QPS_RTS, 1 << 21, [](auto &) {}, EOPNOTSUPP},
		{"rate limit on RC", IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_RATE_LIMIT, [](auto &) {},
		 EINVAL},
		{"bit beyond rate limit", IBV_QPS_RTR, IBV_QPS_RTS, 1 << 26, [](auto &) {},
		 EOPNOTSUPP},
	};
	for (auto &c : cases) {
		INFO(c.what);
		Qp *qp = e.create(IBV_QPT_RC);
		if (c.from != IBV_QPS_RESET)
			bring_to(*qp, c.from);
		struct ibv_qp_attr before = query_all(*qp);
		struct ibv_qp_attr a = good_attr(c.to);
		c.edit(a);
		CHECK(modify_qp(*qp, a, step_mask(IBV_QPT_RC, c.to) | c.extra_mask) == c.want);
		if (c.want)
			CHECK(same_attr(before, query_all(*qp)));
		REQUIRE(destroy_qp(*qp) == 0);
	}
	Qp *qp = e.create(IBV_QPT_RC);
	struct ibv_qp_attr a = good_attr(IBV_QPS_INIT);
	CHECK(modify_qp(*qp, a, -1) == EOPNOTSUPP);
	destroy_qp(*qp);
}

TEST_CASE("modify: path fields too wide keep their low bits, as mlx5_ib writes them", "[qp]")
{
	/* Neither uverbs nor mlx5_ib refuses them; MLX5_SET keeps the
	 * field's width: a timeout of 33 is 1, a retry count of 9 is 1. */
	Env e;
	Qp *qp = e.create(IBV_QPT_RC);
	bring_to(*qp, IBV_QPS_RTR);
	struct ibv_qp_attr a = good_attr(IBV_QPS_RTS);
	a.timeout = 33;
	a.retry_cnt = 9;
	a.rnr_retry = 15;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTS)) == 0);
	struct ibv_qp_attr q = query_all(*qp);
	CHECK(q.timeout == 1);
	CHECK(q.retry_cnt == 1);
	CHECK(q.rnr_retry == 7);
	a = good_attr(IBV_QPS_RTS);
	a.min_rnr_timer = 40;
	REQUIRE(modify_qp(*qp, a, IBV_QP_MIN_RNR_TIMER) == 0);
	CHECK(query_all(*qp).min_rnr_timer == 8);
	destroy_qp(*qp);
}

TEST_CASE("modify: an asserted current state must be the real one", "[qp][state]")
{
	Env e;
	Qp *qp = e.create(IBV_QPT_RC);
	bring_to(*qp, IBV_QPS_RTS);
	struct ibv_qp_attr a = good_attr(IBV_QPS_RTS);
	/* SQD -> RTS with only the state is a legal row, but the QP is in RTS. */
	a.cur_qp_state = IBV_QPS_SQD;
	CHECK(modify_qp(*qp, a, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
	a.cur_qp_state = IBV_QPS_RTS;
	CHECK(modify_qp(*qp, a, IBV_QP_STATE | IBV_QP_CUR_STATE) == 0);
	destroy_qp(*qp);
}

TEST_CASE("modify: RTS -> SQD -> SQD -> RTS where the profile drains (rxe)", "[.][sqd]")
{
	for (enum ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
		INFO("type " << type);
		Env e;
		REQUIRE(e.ctx->device->profile->drains_sq());
		Qp *qp = e.create(type);
		bring_to(*qp, IBV_QPS_RTS);
		struct ibv_qp_attr a = good_attr(IBV_QPS_SQD);
		REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
		CHECK(state_of(*qp) == IBV_QPS_SQD);
		a.pkey_index = 1;
		CHECK(modify_qp(*qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX) == 0);
		CHECK(query_all(*qp).pkey_index == 1);
		a = good_attr(IBV_QPS_INIT);
		CHECK(modify_qp(*qp, a, step_mask(type, IBV_QPS_INIT)) == EINVAL);
		a = good_attr(IBV_QPS_RTS);
		CHECK(modify_qp(*qp, a, IBV_QP_STATE) == 0);
		CHECK(state_of(*qp) == IBV_QPS_RTS);
		destroy_qp(*qp);
	}
}

TEST_CASE("modify: SQD -> SQD re-paths RC; a path moves the QP to its port", "[.][sqd]")
{
	Env e;
	REQUIRE(e.ctx->device->profile->drains_sq());
	Qp *rc = e.create(IBV_QPT_RC);
	bring_to(*rc, IBV_QPS_RTS);
	struct ibv_qp_attr a = good_attr(IBV_QPS_SQD);
	REQUIRE(modify_qp(*rc, a, IBV_QP_STATE) == 0);
	a.ah_attr.dlid = 42;
	a.port_num = 0; /* not named: the path's port is taken */
	REQUIRE(modify_qp(*rc, a, IBV_QP_AV) == 0);
	CHECK(query_all(*rc).ah_attr.dlid == 42);
	CHECK(query_all(*rc).port_num == 1);
	/* With the port too, both must agree. */
	a.port_num = 1;
	CHECK(modify_qp(*rc, a, IBV_QP_AV | IBV_QP_PORT) == 0);
	destroy_qp(*rc);

	/* UC may change its path in SQD, but the implied port change is not
	 * among UC's SQD attributes: the kernel refuses it. */
	Qp *uc = e.create(IBV_QPT_UC);
	bring_to(*uc, IBV_QPS_RTS);
	REQUIRE(modify_qp(*uc, a, IBV_QP_STATE) == 0);
	CHECK(modify_qp(*uc, a, IBV_QP_AV) == EINVAL);
	destroy_qp(*uc);
}

TEST_CASE("query: returns what was set, capacities as granted", "[qp]")
{
	Env e;
	struct ibv_qp_init_attr_ex ca = e.attr(IBV_QPT_RC);
	ca.cap = ibv_qp_cap{100, 100, 2, 3, 64};
	ca.sq_sig_all = 1;
	int marker;
	ca.qp_context = &marker;
	Qp *qp = e.create(ca);

	struct ibv_qp_attr a = good_attr(IBV_QPS_INIT);
	a.pkey_index = 3;
	a.qp_access_flags = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_WRITE;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_INIT)) == 0);
	a = good_attr(IBV_QPS_RTR);
	a.path_mtu = IBV_MTU_2048;
	a.dest_qp_num = 0xabcdef;
	a.rq_psn = 0x1234567; /* PSNs are 24 bits: the kernel masks */
	a.max_dest_rd_atomic = 8;
	a.min_rnr_timer = 20;
	a.ah_attr.dlid = 0x42;
	a.ah_attr.sl = 3;
	a.ah_attr.src_path_bits = 1;
	a.ah_attr.static_rate = IBV_RATE_100_GBPS;
	a.ah_attr.grh.hop_limit = 9; /* no GRH: not kept */
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTR)) == 0);
	a = good_attr(IBV_QPS_RTS);
	a.timeout = 18;
	a.retry_cnt = 6;
	a.rnr_retry = 5;
	a.sq_psn = 0xfffffe;
	a.max_rd_atomic = 4;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTS)) == 0);

	struct ibv_qp_init_attr ia{};
	struct ibv_qp_attr q = query_all(*qp, &ia);
	CHECK(q.qp_state == IBV_QPS_RTS);
	CHECK(q.cur_qp_state == IBV_QPS_RTS);
	CHECK(q.port_num == 1);
	CHECK(q.pkey_index == 3);
	CHECK(q.qp_access_flags == (IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_WRITE));
	CHECK(q.path_mtu == IBV_MTU_2048);
	CHECK(q.dest_qp_num == 0xabcdef);
	CHECK(q.rq_psn == 0x234567);
	CHECK(q.sq_psn == 0xfffffe);
	CHECK(q.max_dest_rd_atomic == 8);
	CHECK(q.max_rd_atomic == 4);
	CHECK(q.min_rnr_timer == 20);
	CHECK(q.timeout == 18);
	CHECK(q.retry_cnt == 6);
	CHECK(q.rnr_retry == 5);
	CHECK(q.ah_attr.dlid == 0x42);
	CHECK(q.ah_attr.sl == 3);
	CHECK(q.ah_attr.src_path_bits == 1);
	CHECK(q.ah_attr.static_rate == IBV_RATE_100_GBPS);
	CHECK(q.ah_attr.port_num == 1);
	CHECK(q.ah_attr.is_global == 0);
	CHECK(q.ah_attr.grh.hop_limit == 0);
	CHECK(q.sq_draining == 0);
	CHECK(q.cap.max_send_wr == 102);
	CHECK(q.cap.max_send_sge == 2);
	CHECK(q.cap.max_inline_data == 124);
	CHECK(q.cap.max_recv_wr == 128);
	CHECK(q.cap.max_recv_sge == 4);

	CHECK(ia.qp_context == &marker);
	CHECK(ia.send_cq == ca.send_cq);
	CHECK(ia.recv_cq == ca.recv_cq);
	CHECK(ia.srq == nullptr);
	CHECK(ia.qp_type == IBV_QPT_RC);
	CHECK(ia.sq_sig_all == 1);
	CHECK(ia.cap.max_send_wr == 102);
	CHECK(ia.cap.max_recv_wr == 128);

	/* Masks from IBV_QP_RATE_LIMIT on are not queryable. */
	struct ibv_qp_attr x{};
	CHECK(query_qp(*qp, x, IBV_QP_RATE_LIMIT, ia) == EOPNOTSUPP);
	CHECK(query_qp(*qp, x, -1, ia) == EOPNOTSUPP);
	CHECK(query_qp(*qp, x, 0, ia) == 0);

	/* RESET forgets everything but the capacities. */
	a = good_attr(IBV_QPS_RESET);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	q = query_all(*qp);
	CHECK(q.qp_state == IBV_QPS_RESET);
	CHECK(q.port_num == 0);
	CHECK(q.dest_qp_num == 0);
	CHECK(q.ah_attr.dlid == 0);
	CHECK(q.timeout == 0);
	CHECK(q.cap.max_send_wr == 102);
	destroy_qp(*qp);
}

TEST_CASE("multicast: UD only, multicast GIDs and LIDs, EBUSY on destroy", "[qp][mcast]")
{
	Env e;
	union ibv_gid mgid{};
	mgid.raw[0] = 0xff;
	mgid.raw[1] = 0x12;
	mgid.raw[15] = 1;
	union ibv_gid ucast{};
	ucast.raw[0] = 0xfe;
	ucast.raw[1] = 0x80;

	Qp *rc = e.create(IBV_QPT_RC);
	CHECK(attach_mcast(*rc, mgid, 0xc001) == EINVAL);
	destroy_qp(*rc);

	Qp *ud = e.create(IBV_QPT_UD);
	CHECK(attach_mcast(*ud, ucast, 0xc001) == EINVAL);
	CHECK(attach_mcast(*ud, mgid, 0x1234) == EINVAL); /* unicast LID on IB */
	CHECK(attach_mcast(*ud, mgid, 0xffff) == EINVAL); /* permissive LID */
	CHECK(detach_mcast(*ud, mgid, 0xc001) == EINVAL); /* not attached */
	REQUIRE(attach_mcast(*ud, mgid, 0xc001) == 0);
	CHECK(attach_mcast(*ud, mgid, 0xc001) == 0); /* again: nothing new */
	CHECK(destroy_qp(*ud) == EBUSY);
	CHECK(state_of(*ud) == IBV_QPS_RESET); /* still alive */
	REQUIRE(detach_mcast(*ud, mgid, 0xc001) == 0);
	CHECK(detach_mcast(*ud, mgid, 0xc001) == EINVAL);
	CHECK(destroy_qp(*ud) == 0);
}

TEST_CASE("destroy waits until the events the application read are acknowledged",
	  "[qp][events]")
{
	Env e;
	Qp *qp = e.create(IBV_QPT_RC);
	post_qp_event(*qp->core, IBV_EVENT_COMM_EST);
	struct ibv_async_event ev{};
	REQUIRE(next_event(*e.ctx, ev));
	CHECK(ev.event_type == IBV_EVENT_COMM_EST);
	CHECK(ev.element.qp == qp->abi());

	auto done = std::async(std::launch::async, [&] { return destroy_qp(*qp); });
	CHECK(done.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
	ack_async_event(ev);
	REQUIRE(done.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
	CHECK(done.get() == 0);
}

TEST_CASE("destroy drops the events the application never read", "[qp][events]")
{
	Env e;
	Qp *qp = e.create(IBV_QPT_RC);
	post_qp_event(*qp->core, IBV_EVENT_COMM_EST);
	auto done = std::async(std::launch::async, [&] { return destroy_qp(*qp); });
	REQUIRE(done.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
	CHECK(done.get() == 0);
	struct ibv_async_event ev{};
	CHECK_FALSE(next_event(*e.ctx, ev));
}

TEST_CASE("events: SQ drained on request where the profile drains (rxe)", "[.][sqd]")
{
	Env e;
	REQUIRE(e.ctx->device->profile->drains_sq());
	Qp *qp = e.create(IBV_QPT_RC);
	bring_to(*qp, IBV_QPS_RTS);
	struct ibv_qp_attr a = good_attr(IBV_QPS_SQD);
	struct ibv_async_event ev{};
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	CHECK_FALSE(next_event(*e.ctx, ev)); /* not asked for */
	a = good_attr(IBV_QPS_RTS);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	a = good_attr(IBV_QPS_SQD);
	a.en_sqd_async_notify = 1;
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
	REQUIRE(next_event(*e.ctx, ev));
	CHECK(ev.event_type == IBV_EVENT_SQ_DRAINED);
	CHECK(ev.element.qp == qp->abi());
	ack_async_event(ev);
	a = good_attr(IBV_QPS_ERR);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	CHECK_FALSE(next_event(*e.ctx, ev)); /* no SRQ */
	destroy_qp(*qp);
}

TEST_CASE("events: last WQE reached for SRQ QPs entering ERR, none for others",
	  "[qp][events]")
{
	Env e;
	struct ibv_async_event ev{};
	struct ibv_qp_attr a = good_attr(IBV_QPS_ERR);
	Qp *qp = e.create(IBV_QPT_RC);
	bring_to(*qp, IBV_QPS_RTS);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	CHECK_FALSE(next_event(*e.ctx, ev)); /* no SRQ */
	destroy_qp(*qp);

	struct ibv_qp_init_attr_ex sa = e.attr(IBV_QPT_RC);
	sa.srq = e.srq()->abi();
	Qp *sq = e.create(sa);
	bring_to(*sq, IBV_QPS_INIT);
	REQUIRE(modify_qp(*sq, a, IBV_QP_STATE) == 0);
	REQUIRE(next_event(*e.ctx, ev));
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED);
	CHECK(ev.element.qp == sq->abi());
	ack_async_event(ev);
	REQUIRE(modify_qp(*sq, a, IBV_QP_STATE) == 0); /* ERR -> ERR: once only */
	CHECK_FALSE(next_event(*e.ctx, ev));
	destroy_qp(*sq);
}

namespace {

struct RecordingDataPath : QpDataPath {
	std::vector<std::string> *log;
	explicit RecordingDataPath(std::vector<std::string> *l) : log(l) {}
	void flush() override { log->push_back("flush"); }
	void reset() override { log->push_back("reset"); }
	void wait_for_senders() override { log->push_back("senders"); }
	void state_changed(enum ibv_qp_state from, enum ibv_qp_state to) override
	{
		log->push_back(std::string(qp_state_name(from)) + ">" + qp_state_name(to));
	}
	void check_remote_errors() override {} /* no sender reaches this QP */
};

} // namespace

TEST_CASE("data path hooks: ERR flushes, RESET empties and waits for senders, others are told", "[qp][datapath]")
{
	Env e;
	std::vector<std::string> log;
	Qp *qp = e.create(IBV_QPT_UD);
	set_qp_data_path(*qp, std::make_unique<RecordingDataPath>(&log));
	bring_to(*qp, IBV_QPS_RTS);
	/* The data path reports a send error on an unreliable QP... */
	REQUIRE(qp_async_error(*qp->core, IBV_QPS_SQE));
	CHECK(state_of(*qp) == IBV_QPS_SQE);
	/* ...which the application recovers from, asserting the state. */
	struct ibv_qp_attr a = good_attr(IBV_QPS_RTS);
	a.cur_qp_state = IBV_QPS_SQE;
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE | IBV_QP_CUR_STATE) == 0);
	a = good_attr(IBV_QPS_ERR);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	a = good_attr(IBV_QPS_RESET);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	CHECK_FALSE(qp_async_error(*qp->core, IBV_QPS_ERR)); /* nothing to fail in RESET */
	const std::vector<std::string> want = {"RESET>INIT", "INIT>RTR", "RTR>RTS", "RTS>SQE",
					       "SQE>RTS",    "flush",	 "reset",    "senders"};
	CHECK(log == want);
	destroy_qp(*qp);
}

TEST_CASE("concurrency: modify/query on many QPs at once; one QP stays consistent",
	  "[qp][threads]")
{
	Env e;
	constexpr int threads = 4, rounds = 200;
	std::vector<Qp *> qps;
	for (int i = 0; i < threads; i++)
		qps.push_back(e.create(IBV_QPT_RC));
	std::atomic<int> failures{0};
	std::vector<std::thread> workers;
	for (int i = 0; i < threads; i++)
		workers.emplace_back([&, qp = qps[i]] {
			for (int r = 0; r < rounds; r++) {
				for (enum ibv_qp_state s :
				     {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR,
				      IBV_QPS_RESET}) {
					struct ibv_qp_attr a = good_attr(s);
					if (modify_qp(*qp, a, step_mask(IBV_QPT_RC, s)))
						failures++;
					struct ibv_qp_attr q{};
					struct ibv_qp_init_attr ia{};
					if (query_qp(*qp, q, IBV_QP_STATE, ia) || q.qp_state != s)
						failures++;
				}
			}
		});
	for (auto &w : workers)
		w.join();
	CHECK(failures == 0);

	/* One writer flips two attributes together; readers never see them
	 * apart. */
	Qp *shared = qps[0];
	bring_to(*shared, IBV_QPS_RTS);
	std::atomic<bool> stop{false};
	std::thread writer([&] {
		for (int r = 0; r < 2000; r++) {
			struct ibv_qp_attr a = good_attr(IBV_QPS_RTS);
			a.min_rnr_timer = (r & 1) ? 1 : 2;
			a.qp_access_flags = (r & 1) ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
			if (modify_qp(*shared, a, IBV_QP_MIN_RNR_TIMER | IBV_QP_ACCESS_FLAGS))
				failures++;
		}
		stop = true;
	});
	std::thread reader([&] {
		while (!stop) {
			struct ibv_qp_attr q{};
			struct ibv_qp_init_attr ia{};
			query_qp(*shared, q, IBV_QP_STATE, ia);
			bool one = q.min_rnr_timer == 1 && q.qp_access_flags == IBV_ACCESS_REMOTE_WRITE;
			bool two = q.min_rnr_timer == 2 && q.qp_access_flags == IBV_ACCESS_REMOTE_READ;
			bool initial = q.min_rnr_timer == 12; /* before the first write */
			if (!one && !two && !initial)
				failures++;
		}
	});
	writer.join();
	reader.join();
	CHECK(failures == 0);
	for (Qp *qp : qps)
		CHECK(destroy_qp(*qp) == 0);
}

TEST_CASE("RoCE: paths need a GRH with a populated source GID; no alternate paths",
	  "[.][qp][eth]")
{
	Env e;
	REQUIRE(e.ctx->device->link_layer == LinkLayer::Ethernet);
	auto rtr = [&](void (*edit)(struct ibv_qp_attr &), int extra = 0) {
		Qp *qp = e.create(IBV_QPT_RC);
		bring_to(*qp, IBV_QPS_INIT, true);
		struct ibv_qp_attr a = good_attr(IBV_QPS_RTR, true);
		edit(a);
		int err = modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTR) | extra);
		destroy_qp(*qp);
		return err;
	};
	CHECK(rtr([](auto &) {}) == 0);
	CHECK(rtr([](auto &a) { a.ah_attr.is_global = 0; }) == EINVAL);
	CHECK(rtr([](auto &a) { a.ah_attr.grh.sgid_index = 3; }) == 0);
	CHECK(rtr([](auto &a) { a.ah_attr.grh.sgid_index = 4; }) == ENODATA);
	CHECK(rtr([](auto &a) { a.ah_attr.grh.sgid_index = 255; }) == ENODATA);
	CHECK(rtr([](auto &) {}, IBV_QP_ALT_PATH) == EINVAL);

	/* RoCE keeps no LID. */
	Qp *qp = e.create(IBV_QPT_RC);
	bring_to(*qp, IBV_QPS_RTR, true);
	struct ibv_qp_attr q = query_all(*qp);
	CHECK(q.ah_attr.dlid == 0);
	CHECK(q.ah_attr.is_global == 1);
	CHECK(q.ah_attr.grh.sgid_index == 1);
	CHECK(q.ah_attr.grh.hop_limit == 64);
	destroy_qp(*qp);

	/* Multicast LIDs mean nothing on Ethernet. */
	Qp *ud = e.create(IBV_QPT_UD);
	union ibv_gid mgid{};
	mgid.raw[0] = 0xff;
	CHECK(attach_mcast(*ud, mgid, 0) == 0);
	CHECK(detach_mcast(*ud, mgid, 0) == 0);
	destroy_qp(*ud);
}

TEST_CASE("two ports: the primary path must use the QP's port", "[.][qp][2ports]")
{
	Env e;
	REQUIRE(e.ctx->device->ports.size() == 2);
	Qp *qp = e.create(IBV_QPT_RC);
	struct ibv_qp_attr a = good_attr(IBV_QPS_INIT);
	a.port_num = 2;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_INIT)) == 0);
	a = good_attr(IBV_QPS_RTR);
	a.ah_attr.port_num = 1;
	CHECK(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTR)) == EINVAL);
	a.ah_attr.port_num = 2;
	a.alt_port_num = a.alt_ah_attr.port_num = 1;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTR) | IBV_QP_ALT_PATH) == 0);
	struct ibv_qp_attr q = query_all(*qp);
	CHECK(q.port_num == 2);
	CHECK(q.ah_attr.port_num == 2);
	CHECK(q.alt_port_num == 1);
	a.port_num = 3;
	CHECK(modify_qp(*qp, a, IBV_QP_PORT) == EINVAL);

	destroy_qp(*qp);
}

TEST_CASE("two ports: drained, a QP moves to the port of a new primary path (rxe)",
	  "[.][sqd][sqd-2ports]")
{
	Env e;
	REQUIRE(e.ctx->device->ports.size() == 2);
	REQUIRE(e.ctx->device->profile->drains_sq());
	Qp *qp = e.create(IBV_QPT_RC);
	struct ibv_qp_attr a = good_attr(IBV_QPS_INIT);
	a.port_num = 2;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_INIT)) == 0);
	a = good_attr(IBV_QPS_RTR);
	a.ah_attr.port_num = 2;
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTR)) == 0);
	a = good_attr(IBV_QPS_RTS);
	REQUIRE(modify_qp(*qp, a, step_mask(IBV_QPT_RC, IBV_QPS_RTS)) == 0);
	a = good_attr(IBV_QPS_SQD);
	REQUIRE(modify_qp(*qp, a, IBV_QP_STATE) == 0);
	a.ah_attr.port_num = 1;
	a.port_num = 2;
	CHECK(modify_qp(*qp, a, IBV_QP_AV | IBV_QP_PORT) == EINVAL); /* disagree */
	a.port_num = 0;
	REQUIRE(modify_qp(*qp, a, IBV_QP_AV) == 0);
	CHECK(query_all(*qp).port_num == 1);
	destroy_qp(*qp);
}
