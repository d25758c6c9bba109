/* SPDX-License-Identifier: MIT */
/*
 * Verbs-level QP fixture: an opened device, a PD, and CQs/SRQs/XRCDs made
 * through the public API as an application makes them.
 *
 * ibv_create_cq/ibv_create_srq (and their destroys) are exports of the CQ/SRQ
 * family; they are declared weak here so that this file links before that
 * family is in the library. A test that needs one and finds it missing fails
 * saying so.
 */
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <cerrno>
#include <cstring>
#include <vector>

namespace qpverbs {

struct Dev : shmv_test::DeviceWithPd {
	std::vector<struct ibv_cq *> cqs;
	std::vector<struct ibv_srq *> srqs;
	std::vector<struct ibv_xrcd *> xrcds;

	~Dev()
	{
		for (auto *s : srqs)
			ibv_destroy_srq(s);
		for (auto *c : cqs)
			ibv_destroy_cq(c);
		for (auto *x : xrcds)
			ibv_close_xrcd(x);
	}
	Dev() = default;
	Dev(const Dev &) = delete;
	Dev &operator=(const Dev &) = delete;

	struct ibv_cq *cq()
	{
		struct ibv_cq *c = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
		INFO("ibv_create_cq errno " << errno);
		REQUIRE(c);
		cqs.push_back(c);
		return c;
	}
	struct ibv_srq *srq(struct ibv_pd *in = nullptr)
	{
		struct ibv_srq_init_attr a{};
		a.attr.max_wr = 16;
		a.attr.max_sge = 1;
		struct ibv_srq *s = ibv_create_srq(in ? in : pd, &a);
		INFO("ibv_create_srq errno " << errno);
		REQUIRE(s);
		srqs.push_back(s);
		return s;
	}
	/* An anonymous XRC domain (fd -1). */
	struct ibv_xrcd *xrcd(int fd = -1)
	{
		struct ibv_xrcd_init_attr a{};
		a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
		a.fd = fd;
		a.oflags = O_CREAT;
		struct ibv_xrcd *x = ibv_open_xrcd(ctx, &a);
		INFO("ibv_open_xrcd errno " << errno << " (XRCD is the SRQ family's)");
		REQUIRE(x);
		xrcds.push_back(x);
		return x;
	}
	struct ibv_srq *xrc_srq(struct ibv_xrcd *x)
	{
		struct ibv_srq_init_attr_ex a{};
		a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			      IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		a.srq_type = IBV_SRQT_XRC;
		a.pd = pd;
		a.xrcd = x;
		a.cq = cq();
		a.attr.max_wr = 16;
		a.attr.max_sge = 1;
		struct ibv_srq *s = ibv_create_srq_ex(ctx, &a);
		INFO("ibv_create_srq_ex errno " << errno);
		REQUIRE(s);
		srqs.push_back(s);
		return s;
	}

	struct ibv_qp_init_attr init_attr(enum ibv_qp_type type)
	{
		struct ibv_qp_init_attr a{};
		a.qp_type = type;
		a.send_cq = cq();
		a.recv_cq = a.send_cq;
		a.cap.max_send_wr = 16;
		a.cap.max_recv_wr = 16;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		return a;
	}
	struct ibv_qp *qp(enum ibv_qp_type type)
	{
		struct ibv_qp_init_attr a = init_attr(type);
		struct ibv_qp *q = ibv_create_qp(pd, &a);
		INFO("ibv_create_qp errno " << errno);
		REQUIRE(q);
		return q;
	}
};

inline struct ibv_qp_attr attr_for(enum ibv_qp_state to)
{
	struct ibv_qp_attr a{};
	a.qp_state = to;
	a.port_num = 1;
	a.qkey = 0x11111111;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x42;
	a.rq_psn = 1;
	a.sq_psn = 2;
	a.max_dest_rd_atomic = 1;
	a.max_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.ah_attr.dlid = 3;
	a.ah_attr.port_num = 1;
	return a;
}

constexpr int rc_init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int ud_init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
constexpr int rc_rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int rc_rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

} // namespace qpverbs
