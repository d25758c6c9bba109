/* SPDX-License-Identifier: MIT */
/*
 * Engine-level QP test fixture: a context on the first configured device
 * with a PD and stand-in CQ/SRQ/XRCD objects. Those families have their own
 * verbs (lib/cq.h, lib/srq.h are their contracts); the QP control path only
 * needs objects with that layout, which these are.
 */
#pragma once

#include "context.h"
#include "cq.h"
#include "device.h"
#include "pd.h"
#include "qp.h"
#include "srq.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

namespace qptest {

using namespace shmverbs;

struct Env {
	Context *ctx = nullptr;
	Pd *pd = nullptr;
	std::vector<Cq *> cqs;
	std::vector<Srq *> srqs;
	std::vector<Xrcd *> xrcds;

	Env()
	{
		REQUIRE(!devices().empty());
		Result<Context> c = open_context(*devices()[0]);
		REQUIRE(c);
		ctx = c.get();
		Result<Pd> p = alloc_pd(*ctx);
		REQUIRE(p);
		pd = p.get();
	}
	~Env()
	{
		for (Cq *cq : cqs)
			delete cq;
		for (Srq *s : srqs)
			delete s;
		for (Xrcd *x : xrcds)
			delete x;
		dealloc_pd(*pd);
		close_context(*ctx);
	}
	Env(const Env &) = delete;
	Env &operator=(const Env &) = delete;

	Cq *cq()
	{
		auto *cq = new Cq{};
		cq->ibv.cq.context = ctx->abi();
		cqs.push_back(cq);
		return cq;
	}
	Srq *srq(enum ibv_srq_type type = IBV_SRQT_BASIC, Pd *in = nullptr)
	{
		auto *s = new Srq{};
		s->ibv.context = ctx->abi();
		s->srq_type = type;
		s->pd = in ? in : pd;
		s->ibv.pd = s->pd->abi();
		srqs.push_back(s);
		return s;
	}
	Xrcd *xrcd(uint64_t domain)
	{
		auto *x = new Xrcd{};
		x->ibv.context = ctx->abi();
		x->domain = domain;
		xrcds.push_back(x);
		return x;
	}

	/* A valid request for the type: PD, one CQ for both queues, small caps. */
	struct ibv_qp_init_attr_ex attr(enum ibv_qp_type type = IBV_QPT_RC)
	{
		struct ibv_qp_init_attr_ex a{};
		a.qp_type = type;
		Cq *c = cq();
		a.send_cq = c->abi();
		a.recv_cq = c->abi();
		a.cap.max_send_wr = 16;
		a.cap.max_recv_wr = 16;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		if (type == IBV_QPT_XRC_RECV) {
			a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
			a.xrcd = xrcd(0x5eed)->abi();
			a.cap = ibv_qp_cap{};
		} else {
			a.comp_mask = IBV_QP_INIT_ATTR_PD;
			a.pd = pd->abi();
		}
		return a;
	}

	Qp *create(enum ibv_qp_type type = IBV_QPT_RC)
	{
		struct ibv_qp_init_attr_ex a = attr(type);
		return create(a);
	}
	Qp *create(struct ibv_qp_init_attr_ex &a)
	{
		Result<Qp> r = create_qp(*ctx, a);
		INFO("create_qp errno " << r.error());
		REQUIRE(r);
		return r.get();
	}
	/* 0 when creation succeeds (the QP is destroyed again), else the errno. */
	int create_errno(struct ibv_qp_init_attr_ex a)
	{
		Result<Qp> r = create_qp(*ctx, a);
		if (!r)
			return r.error();
		REQUIRE(destroy_qp(*r.get()) == 0);
		return 0;
	}
};

/* Values that are valid for every attribute on port 1 of an IB device. */
inline struct ibv_qp_attr good_attr(enum ibv_qp_state to, bool roce = false)
{
	struct ibv_qp_attr a{};
	a.qp_state = to;
	a.path_mtu = IBV_MTU_1024;
	a.path_mig_state = IBV_MIG_MIGRATED;
	a.qkey = 0x11111111;
	a.rq_psn = 100;
	a.sq_psn = 200;
	a.dest_qp_num = 0x1234;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	a.ah_attr.dlid = 7;
	a.ah_attr.port_num = 1;
	if (roce) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.sgid_index = 1;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.dgid.raw[0] = 0xfe;
		a.ah_attr.grh.dgid.raw[1] = 0x80;
		a.ah_attr.grh.dgid.raw[15] = 9;
	}
	a.alt_ah_attr = a.ah_attr;
	a.alt_port_num = 1;
	a.alt_timeout = 14;
	a.max_rd_atomic = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.port_num = 1;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	return a;
}

/* The attributes each forward step needs for each type. */
inline int step_mask(enum ibv_qp_type type, enum ibv_qp_state to)
{
	switch (to) {
	case IBV_QPS_INIT:
		return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		       (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
	case IBV_QPS_RTR:
		switch (type) {
		case IBV_QPT_UD:
			return IBV_QP_STATE;
		case IBV_QPT_UC:
		case IBV_QPT_XRC_SEND:
			return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			       IBV_QP_RQ_PSN;
		default:
			return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	case IBV_QPS_RTS:
		switch (type) {
		case IBV_QPT_UD:
		case IBV_QPT_UC:
			return IBV_QP_STATE | IBV_QP_SQ_PSN;
		case IBV_QPT_XRC_RECV:
			return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
		default:
			return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
		}
	default:
		return IBV_QP_STATE;
	}
}

/* Moves a fresh QP forward to `to` (INIT, RTR or RTS). */
inline void bring_to(Qp &qp, enum ibv_qp_state to, bool roce = false)
{
	for (enum ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
		struct ibv_qp_attr a = good_attr(s, roce);
		INFO("to state " << int(s));
		REQUIRE(modify_qp(qp, a, step_mask(qp.core->type, s)) == 0);
		if (s == to)
			return;
	}
}

inline enum ibv_qp_state state_of(Qp &qp)
{
	struct ibv_qp_attr a{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(query_qp(qp, a, IBV_QP_STATE, ia) == 0);
	return a.qp_state;
}

} // namespace qptest
