/* SPDX-License-Identifier: MIT */
/*
 * Two connected QPs in one process (the data path takes the same code path
 * as across processes). Everything through the public API; every wait is
 * bounded.
 */
#pragma once

#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include "../common/peer.h"

#include <chrono>
#include <thread>
#include <vector>

namespace loopback {

constexpr size_t buf_size = 8192;

struct Side {
	struct ibv_comp_channel *ch = nullptr;
	struct ibv_cq_ex *cqx = nullptr;
	struct ibv_cq *cq = nullptr;
	struct ibv_qp *qp = nullptr;
	struct ibv_qp_ex *qpx = nullptr;
	struct ibv_mr *mr = nullptr;
	std::vector<char> buf = std::vector<char>(buf_size);

	char *at(size_t off) { return buf.data() + off; }
	uint64_t addr(size_t off) { return uint64_t(uintptr_t(buf.data() + off)); }
};

struct Options {
	enum ibv_qp_type type = IBV_QPT_RC;
	uint64_t send_ops = IBV_QP_EX_WITH_SEND;
	bool channel = false;
	uint64_t wc_flags = IBV_WC_STANDARD_FLAGS;
	uint32_t max_send_wr = 16;
	uint32_t max_send_sge = 2;
	uint32_t max_inline = 64;
	int cqe = 64;
	bool sq_sig_all = false;
	size_t buf_bytes = buf_size;
};

struct Pair {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	Side a, b;
	uint16_t lid = 0;
	Options opt;

	explicit Pair(const Options &o = Options()) : opt(o)
	{
		ctx = shmv_test::open_first_device();
		pd = ibv_alloc_pd(ctx);
		REQUIRE(pd);
		lid = shmv_test::port_lid(ctx);
		make(a);
		make(b);
	}

	void make(Side &s)
	{
		if (opt.channel)
			s.ch = ibv_create_comp_channel(ctx);
		struct ibv_cq_init_attr_ex ca{};
		ca.cqe = uint32_t(opt.cqe);
		ca.channel = s.ch;
		ca.wc_flags = opt.wc_flags;
		s.cqx = ibv_create_cq_ex(ctx, &ca);
		REQUIRE(s.cqx);
		s.cq = ibv_cq_ex_to_cq(s.cqx);
		struct ibv_qp_init_attr_ex a{};
		a.send_cq = s.cq;
		a.recv_cq = s.cq;
		a.qp_type = opt.type;
		a.sq_sig_all = opt.sq_sig_all;
		a.cap.max_send_wr = opt.max_send_wr;
		a.cap.max_recv_wr = 16;
		a.cap.max_send_sge = opt.max_send_sge;
		a.cap.max_recv_sge = 2;
		a.cap.max_inline_data = opt.max_inline;
		a.pd = pd;
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = opt.send_ops;
		s.qp = ibv_create_qp_ex(ctx, &a);
		REQUIRE(s.qp);
		s.qpx = ibv_qp_to_qp_ex(s.qp);
		REQUIRE(s.qpx);
		s.buf.resize(opt.buf_bytes);
		s.mr = ibv_reg_mr(pd, s.buf.data(), s.buf.size(),
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
		REQUIRE(s.mr);
	}

	/* INIT -> RTR -> RTS toward the other side (UD: no peer). */
	static int up(Side &s, uint32_t dest, uint16_t lid, enum ibv_qp_type type, int rnr_retry = 7)
	{
		shmv_test::QpPath path;
		path.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC;
		path.qkey = 0x1234;
		path.rnr_retry = uint8_t(rnr_retry);
		return shmv_test::qp_to_rts(s.qp, type, dest, lid, path);
	}

	void connect(int rnr_retry = 7)
	{
		REQUIRE(up(a, b.qp->qp_num, lid, opt.type, rnr_retry) == 0);
		REQUIRE(up(b, a.qp->qp_num, lid, opt.type, rnr_retry) == 0);
	}

	static int post_recv(Side &s, uint64_t wr_id, size_t off, uint32_t len)
	{
		return shmv_test::post_recv_sge(s.qp, {s.addr(off), len, s.mr->lkey}, wr_id);
	}

	/* `wr` (its remote part: wr.wr) posted as one signaled `op` of 8
	 * bytes from s.at(0). */
	static int post8(Side &s, enum ibv_wr_opcode op, uint64_t wr_id, struct ibv_send_wr wr = {})
	{
		wr.wr_id = wr_id;
		wr.opcode = op;
		return shmv_test::post_send_sge(s.qp, wr, {s.addr(0), 8, s.mr->lkey});
	}

	static bool wait_wc(Side &s, struct ibv_wc &wc, int ms = 10000)
	{
		return shmv_test::wait_wc(s.cq, wc, ms);
	}

	/* The capacities `s`'s QP was granted (ibv_query_qp). */
	static struct ibv_qp_cap caps(Side &s)
	{
		struct ibv_qp_attr qa{};
		struct ibv_qp_init_attr qi{};
		REQUIRE(ibv_query_qp(s.qp, &qa, IBV_QP_CAP, &qi) == 0);
		return qi.cap;
	}

	/* No completion within `ms`. */
	static bool quiet(Side &s, int ms = 30)
	{
		std::this_thread::sleep_for(std::chrono::milliseconds(ms));
		struct ibv_wc wc;
		return ibv_poll_cq(s.cq, 1, &wc) == 0;
	}

	static void destroy(Side &s)
	{
		if (s.qp)
			ibv_destroy_qp(s.qp);
		if (s.mr)
			ibv_dereg_mr(s.mr);
		if (s.cq)
			ibv_destroy_cq(s.cq);
		if (s.ch)
			ibv_destroy_comp_channel(s.ch);
	}

	~Pair()
	{
		destroy(a);
		destroy(b);
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}
};

} // namespace loopback
