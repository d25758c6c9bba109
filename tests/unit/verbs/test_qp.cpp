/* SPDX-License-Identifier: MIT */
/*
 * QP verbs through the C ABI, as an application calls them: exports,
 * verbs_context slots reached by verbs.h's inline functions, errno and
 * return conventions, destruction order. Tests that create a QP need CQs
 * (ibv_create_cq, the CQ/SRQ family); [xrc] ones also XRCDs and XRC SRQs.
 */
#include "qp_verbs_fixture.h"

#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>

using namespace qpverbs;

TEST_CASE("QP verbs: NULL and malformed arguments fail with EINVAL, never crash",
	  "[qp][verbs]")
{
	Dev d;
	struct ibv_qp_init_attr a{};
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 1;

	errno = 0;
	CHECK(ibv_create_qp(nullptr, &a) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_qp(d.pd, nullptr) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_qp(d.pd, &a) == nullptr); /* no CQs */
	CHECK(errno == EINVAL);

	struct ibv_qp_attr qa{};
	struct ibv_qp_init_attr ia{};
	CHECK(ibv_query_qp(nullptr, &qa, IBV_QP_STATE, &ia) == EINVAL);
	CHECK(ibv_modify_qp(nullptr, &qa, IBV_QP_STATE) == EINVAL);
	CHECK(ibv_destroy_qp(nullptr) == EINVAL);
	CHECK(ibv_qp_to_qp_ex(nullptr) == nullptr);
	union ibv_gid gid{};
	CHECK(ibv_attach_mcast(nullptr, &gid, 0xc001) == EINVAL);
	CHECK(ibv_detach_mcast(nullptr, &gid, 0xc001) == EINVAL);
	CHECK(ibv_query_qp_data_in_order(nullptr, IBV_WR_SEND, 0) == 0);

	/* The extended verbs reach the provider through verbs_context. */
	struct ibv_qp_init_attr_ex ax{};
	ax.qp_type = IBV_QPT_RC;
	ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ax.pd = d.pd;
	errno = 0;
	CHECK(ibv_create_qp_ex(d.ctx, &ax) == nullptr);
	CHECK(errno == EINVAL);
	ax.comp_mask = IBV_QP_INIT_ATTR_PD | (1u << 9);
	errno = 0;
	CHECK(ibv_create_qp_ex(d.ctx, &ax) == nullptr);
	CHECK(errno == EINVAL);

	struct ibv_qp_open_attr oa{};
	oa.comp_mask = IBV_QP_OPEN_ATTR_RESERVED;
	errno = 0;
	CHECK(ibv_open_qp(d.ctx, &oa) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_TYPE;
	errno = 0;
	CHECK(ibv_open_qp(d.ctx, &oa) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("ibv_create_qp: mlx5 capacities written back, then query/modify/destroy",
	  "[qp][verbs]")
{
	Dev d;
	struct ibv_qp_init_attr a = d.init_attr(IBV_QPT_RC);
	a.cap = ibv_qp_cap{128, 1, 1, 1, 0};
	a.sq_sig_all = 1;
	struct ibv_qp *qp = ibv_create_qp(d.pd, &a);
	REQUIRE(qp);
	CHECK(qp->context == d.ctx);
	CHECK(qp->pd == d.pd);
	CHECK(qp->send_cq == a.send_cq);
	CHECK(qp->state == IBV_QPS_RESET);
	CHECK(qp->qp_type == IBV_QPT_RC);
	CHECK(qp->qp_num >= 2);
	CHECK(a.cap.max_send_wr == 128);
	CHECK(a.cap.max_inline_data == 60);
	CHECK(a.cap.max_recv_wr == 4);
	CHECK(a.cap.max_recv_sge == 1);
	CHECK(ibv_qp_to_qp_ex(qp) == nullptr);

	/* In use: the PD cannot go. */
	CHECK(ibv_dealloc_pd(d.pd) == EBUSY);

	struct ibv_qp_attr m = attr_for(IBV_QPS_INIT);
	CHECK(ibv_modify_qp(qp, &m, rc_init & ~IBV_QP_ACCESS_FLAGS) == EINVAL);
	CHECK(qp->state == IBV_QPS_RESET);
	REQUIRE(ibv_modify_qp(qp, &m, rc_init) == 0);
	CHECK(qp->state == IBV_QPS_INIT);
	m = attr_for(IBV_QPS_RTR);
	REQUIRE(ibv_modify_qp(qp, &m, rc_rtr) == 0);
	m = attr_for(IBV_QPS_RTS);
	REQUIRE(ibv_modify_qp(qp, &m, rc_rts) == 0);
	CHECK(qp->state == IBV_QPS_RTS);
	m = attr_for(IBV_QPS_INIT);
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE) == EINVAL);
	CHECK(ibv_modify_qp(qp, &m, 1 << 22) == EOPNOTSUPP);

	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr ia{};
	qp->state = IBV_QPS_UNKNOWN;
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_STATE, &ia) == 0);
	CHECK(qp->state == IBV_QPS_RTS); /* libibverbs keeps it in step */
	CHECK(q.qp_state == IBV_QPS_RTS);
	CHECK(q.dest_qp_num == 0x42);
	CHECK(q.timeout == 14);
	CHECK(q.ah_attr.dlid == 3);
	CHECK(ia.cap.max_send_wr == 128);
	CHECK(ia.cap.max_inline_data == 60);
	CHECK(ia.sq_sig_all == 1);
	CHECK(ia.send_cq == a.send_cq);
	CHECK(ibv_query_qp(qp, &q, IBV_QP_RATE_LIMIT, &ia) == EOPNOTSUPP);

	REQUIRE(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	d.pd = ibv_alloc_pd(d.ctx);
	REQUIRE(d.pd);
}

TEST_CASE("ibv_create_qp_ex: with only a PD it is ibv_create_qp; send ops give a qp_ex",
	  "[qp][verbs]")
{
	Dev d;
	struct ibv_qp_init_attr_ex a{};
	a.qp_type = IBV_QPT_RC;
	a.send_cq = a.recv_cq = d.cq();
	a.cap = ibv_qp_cap{100, 100, 2, 3, 64};
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = d.pd;
	struct ibv_qp *plain = ibv_create_qp_ex(d.ctx, &a);
	REQUIRE(plain);
	CHECK(a.cap.max_send_wr == 102);
	CHECK(a.cap.max_inline_data == 124);
	CHECK(a.cap.max_recv_wr == 128);
	CHECK(a.cap.max_recv_sge == 4);
	CHECK(ibv_qp_to_qp_ex(plain) == nullptr);

	a.cap = ibv_qp_cap{128, 1, 1, 1, 0};
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *ex = ibv_create_qp_ex(d.ctx, &a);
	REQUIRE(ex);
	CHECK(a.cap.max_inline_data == 28);
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(ex);
	REQUIRE(qpx);
	CHECK(&qpx->qp_base == ex);
	/* The work-request API is wired; a QP in RESET cannot send
	 * (tests/unit/datapath/test_qp_ex.cpp covers the rest). */
	REQUIRE(qpx->wr_start);
	REQUIRE(qpx->wr_send);
	REQUIRE(qpx->wr_rdma_write);
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	CHECK(ibv_wr_complete(qpx) == EINVAL);

	/* Unsupported operations for the type: EOPNOTSUPP. */
	a.qp_type = IBV_QPT_UD;
	a.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ;
	errno = 0;
	CHECK(ibv_create_qp_ex(d.ctx, &a) == nullptr);
	CHECK(errno == EOPNOTSUPP);

	CHECK(ibv_destroy_qp(plain) == 0);
	CHECK(ibv_destroy_qp(ex) == 0);
}

TEST_CASE("ibv_create_qp: capacity and type errors", "[qp][verbs]")
{
	Dev d;
	auto err = [&](void (*edit)(struct ibv_qp_init_attr &)) {
		struct ibv_qp_init_attr a = d.init_attr(IBV_QPT_RC);
		edit(a);
		errno = 0;
		struct ibv_qp *qp = ibv_create_qp(d.pd, &a);
		if (qp) {
			ibv_destroy_qp(qp);
			return 0;
		}
		return errno;
	};
	CHECK(err([](auto &) {}) == 0);
	CHECK(err([](auto &a) { a.cap.max_send_wr = 32768; }) == EINVAL);
	CHECK(err([](auto &a) { a.cap.max_recv_wr = 32769; }) == EINVAL);
	CHECK(err([](auto &a) { a.cap.max_send_sge = 60; }) == EINVAL);
	CHECK(err([](auto &a) { a.cap.max_recv_sge = 33; }) == EINVAL);
	CHECK(err([](auto &a) { a.cap.max_inline_data = 1024; }) == EINVAL);
	CHECK(err([](auto &a) { a.qp_type = IBV_QPT_RAW_PACKET; }) == EOPNOTSUPP);
	CHECK(err([](auto &a) { a.qp_type = ibv_qp_type(42); }) == EINVAL);
	CHECK(err([](auto &a) { a.recv_cq = nullptr; }) == EINVAL);
}

TEST_CASE("ibv_create_qp: SRQ rules", "[qp][verbs][srq]")
{
	Dev d;
	struct ibv_srq *srq = d.srq();
	struct ibv_qp_init_attr a = d.init_attr(IBV_QPT_RC);
	a.srq = srq;
	a.cap.max_recv_wr = 500;
	struct ibv_qp *qp = ibv_create_qp(d.pd, &a);
	REQUIRE(qp);
	CHECK(a.cap.max_recv_wr == 0);
	CHECK(a.cap.max_recv_sge == 0);
	CHECK(qp->srq == srq);
	CHECK(ibv_destroy_srq(srq) == EBUSY);
	CHECK(ibv_destroy_qp(qp) == 0);

	a = d.init_attr(IBV_QPT_UC);
	a.srq = srq;
	errno = 0;
	CHECK(ibv_create_qp(d.pd, &a) == nullptr);
	CHECK(errno == EINVAL);

	struct ibv_pd *pd2 = ibv_alloc_pd(d.ctx);
	REQUIRE(pd2);
	a = d.init_attr(IBV_QPT_RC);
	a.srq = srq;
	errno = 0;
	CHECK(ibv_create_qp(pd2, &a) == nullptr); /* SRQ in another PD */
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd2) == 0);
}

TEST_CASE("multicast: attach/detach through the exports; attached QPs cannot be destroyed",
	  "[qp][verbs][mcast]")
{
	Dev d;
	struct ibv_qp *ud = d.qp(IBV_QPT_UD);
	struct ibv_qp *rc = d.qp(IBV_QPT_RC);
	union ibv_gid mgid{};
	mgid.raw[0] = 0xff;
	mgid.raw[1] = 0x12;
	mgid.raw[15] = 7;
	CHECK(ibv_attach_mcast(rc, &mgid, 0xc007) == EINVAL);
	REQUIRE(ibv_attach_mcast(ud, &mgid, 0xc007) == 0);
	CHECK(ibv_destroy_qp(ud) == EBUSY);
	CHECK(ibv_detach_mcast(ud, &mgid, 0xc008) == EINVAL);
	REQUIRE(ibv_detach_mcast(ud, &mgid, 0xc007) == 0);
	CHECK(ibv_destroy_qp(ud) == 0);
	CHECK(ibv_destroy_qp(rc) == 0);
}

TEST_CASE("destroy waits for the acknowledgement of an event the application read",
	  "[qp][verbs][events]")
{
	Dev d;
	struct ibv_qp_init_attr ia = d.init_attr(IBV_QPT_RC);
	ia.srq = d.srq();
	struct ibv_qp *qp = ibv_create_qp(d.pd, &ia);
	REQUIRE(qp);
	struct ibv_qp_attr m = attr_for(IBV_QPS_INIT);
	REQUIRE(ibv_modify_qp(qp, &m, rc_init) == 0);
	m = attr_for(IBV_QPS_ERR); /* a QP on an SRQ: its last WQE is reached */
	REQUIRE(ibv_modify_qp(qp, &m, IBV_QP_STATE) == 0);

	struct ibv_async_event ev{};
	REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED);
	CHECK(ev.element.qp == qp);

	auto done = std::async(std::launch::async, [&] { return ibv_destroy_qp(qp); });
	CHECK(done.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
	ibv_ack_async_event(&ev);
	REQUIRE(done.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
	CHECK(done.get() == 0);
}

/* RC to RTS through the verbs, with the given responder depth and access. */
static void rc_to_rts(struct ibv_qp *qp, uint8_t dest_rd_atomic, unsigned access)
{
	struct ibv_qp_attr m = attr_for(IBV_QPS_INIT);
	m.qp_access_flags = access;
	REQUIRE(ibv_modify_qp(qp, &m, rc_init) == 0);
	m = attr_for(IBV_QPS_RTR);
	m.max_dest_rd_atomic = dest_rd_atomic;
	REQUIRE(ibv_modify_qp(qp, &m, rc_rtr) == 0);
	m = attr_for(IBV_QPS_RTS);
	m.max_rd_atomic = 3;
	REQUIRE(ibv_modify_qp(qp, &m, rc_rts) == 0);
}

TEST_CASE("mlx5: no SQD; the QP context's access bits and depths read back", "[qp][verbs]")
{
	/* mlx5_ib: its transition table has no RTS -> SQD; query_qp_attr()
	 * reports the remote access bits the QP context holds (read and
	 * atomic only with responder resources) and the READ/atomic depths
	 * as log2, rounded down (an unset one reads 1). */
	Dev d;
	struct ibv_qp *qp = d.qp(IBV_QPT_RC);
	const unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_qp_attr m = attr_for(IBV_QPS_INIT);
	m.qp_access_flags = all;
	REQUIRE(ibv_modify_qp(qp, &m, rc_init) == 0);
	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr qi{};
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_ACCESS_FLAGS | IBV_QP_MAX_QP_RD_ATOMIC, &qi) == 0);
	CHECK(q.qp_access_flags == IBV_ACCESS_REMOTE_WRITE); /* no responder resources yet */
	CHECK(q.max_rd_atomic == 1);
	CHECK(q.max_dest_rd_atomic == 1);
	m = attr_for(IBV_QPS_RTR);
	m.max_dest_rd_atomic = 5;
	REQUIRE(ibv_modify_qp(qp, &m, rc_rtr) == 0);
	m = attr_for(IBV_QPS_RTS);
	m.max_rd_atomic = 3;
	REQUIRE(ibv_modify_qp(qp, &m, rc_rts) == 0);
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_ACCESS_FLAGS | IBV_QP_MAX_QP_RD_ATOMIC, &qi) == 0);
	CHECK(q.qp_access_flags == (all & ~unsigned(IBV_ACCESS_LOCAL_WRITE)));
	CHECK(q.max_rd_atomic == 2);
	CHECK(q.max_dest_rd_atomic == 4);

	m = attr_for(IBV_QPS_SQD);
	m.en_sqd_async_notify = 1;
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == EINVAL);
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE) == EINVAL);
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) == 0);
	CHECK(q.qp_state == IBV_QPS_RTS);
	CHECK(ibv_destroy_qp(qp) == 0);
}

TEST_CASE("rxe: SQD on request with its event; attributes read back as set", "[.][rxe]")
{
	Dev d;
	struct ibv_qp *qp = d.qp(IBV_QPT_RC);
	rc_to_rts(qp, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr qi{};
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_ACCESS_FLAGS | IBV_QP_MAX_QP_RD_ATOMIC, &qi) == 0);
	CHECK(q.qp_access_flags == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	CHECK(q.max_rd_atomic == 3);
	CHECK(q.max_dest_rd_atomic == 0);
	struct ibv_qp_attr m = attr_for(IBV_QPS_SQD);
	m.en_sqd_async_notify = 1;
	REQUIRE(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
	struct ibv_async_event ev{};
	REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_SQ_DRAINED);
	CHECK(ev.element.qp == qp);
	ibv_ack_async_event(&ev);
	m = attr_for(IBV_QPS_RTS);
	CHECK(ibv_modify_qp(qp, &m, IBV_QP_STATE) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
}

TEST_CASE("ECE and data-in-order as a ConnectX-5 answers them", "[qp][verbs]")
{
	Dev d;
	struct ibv_qp *qp = d.qp(IBV_QPT_RC);
	struct ibv_ece ece{};
	REQUIRE(ibv_query_ece(qp, &ece) == 0);
	CHECK(ece.vendor_id == 0x15b3);
	CHECK(ece.options == 0);
	ece = {};
	CHECK(ibv_set_ece(qp, &ece) == EOPNOTSUPP);
	ece.vendor_id = 0x15b3;
	CHECK(ibv_set_ece(qp, &ece) == EOPNOTSUPP);
	ece.comp_mask = 1;
	CHECK(ibv_set_ece(qp, &ece) == EINVAL);
	CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
}

TEST_CASE("XRC: a target QP opened from another context by domain and number",
	  "[qp][verbs][xrc]")
{
	char path[] = "/tmp/shmverbs-xrcd-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0);
	unlink(path);
	Dev a, b;
	struct ibv_xrcd *xa = a.xrcd(fd);
	struct ibv_xrcd *xb = b.xrcd(fd);

	struct ibv_qp_init_attr_ex r{};
	r.qp_type = IBV_QPT_XRC_RECV;
	r.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	r.xrcd = xa;
	struct ibv_qp *tgt = ibv_create_qp_ex(a.ctx, &r);
	REQUIRE(tgt);
	CHECK(ibv_close_xrcd(xa) == EBUSY);

	struct ibv_qp_open_attr oa{};
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = tgt->qp_num;
	oa.xrcd = xb;
	oa.qp_type = IBV_QPT_XRC_RECV;
	struct ibv_qp *opened = ibv_open_qp(b.ctx, &oa);
	REQUIRE(opened);
	CHECK(opened->qp_num == tgt->qp_num);
	CHECK(opened->state == IBV_QPS_UNKNOWN);

	struct ibv_qp_attr m = attr_for(IBV_QPS_INIT);
	REQUIRE(ibv_modify_qp(tgt, &m, rc_init) == 0);
	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(opened, &q, IBV_QP_STATE, &ia) == 0);
	CHECK(opened->state == IBV_QPS_INIT);
	REQUIRE(ibv_destroy_qp(tgt) == 0);
	REQUIRE(ibv_query_qp(opened, &q, IBV_QP_STATE, &ia) == 0);
	REQUIRE(ibv_destroy_qp(opened) == 0);
	errno = 0;
	CHECK(ibv_open_qp(b.ctx, &oa) == nullptr);
	CHECK(errno == EINVAL);

	/* An XRC SRQ is for XRC targets only. */
	struct ibv_srq *xsrq = a.xrc_srq(xa);
	struct ibv_qp_init_attr ra = a.init_attr(IBV_QPT_RC);
	ra.srq = xsrq;
	errno = 0;
	CHECK(ibv_create_qp(a.pd, &ra) == nullptr);
	CHECK(errno == EINVAL);
	close(fd);
}

TEST_CASE("rxe profile: queues of 2^k - 1, SGEs and inline fill the WQE", "[.][rxe]")
{
	Dev d;
	struct ibv_qp_init_attr a = d.init_attr(IBV_QPT_RC);
	a.cap = ibv_qp_cap{128, 100, 2, 3, 64};
	struct ibv_qp *qp = ibv_create_qp(d.pd, &a);
	REQUIRE(qp);
	CHECK(a.cap.max_send_wr == 255);
	CHECK(a.cap.max_send_sge == 4);
	CHECK(a.cap.max_inline_data == 64);
	CHECK(a.cap.max_recv_wr == 127);
	CHECK(a.cap.max_recv_sge == 3);
	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_CAP, &ia) == 0);
	CHECK(ia.cap.max_send_wr == 255);
	struct ibv_ece ece{};
	CHECK(ibv_query_ece(qp, &ece) == EOPNOTSUPP);
	CHECK(ibv_destroy_qp(qp) == 0);

	a = d.init_attr(IBV_QPT_RC);
	a.cap.max_inline_data = 401;
	errno = 0;
	CHECK(ibv_create_qp(d.pd, &a) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("exact profile: capacities exactly as asked", "[.][exact]")
{
	Dev d;
	struct ibv_qp_init_attr a = d.init_attr(IBV_QPT_RC);
	a.cap = ibv_qp_cap{100, 100, 2, 3, 64};
	struct ibv_qp *qp = ibv_create_qp(d.pd, &a);
	REQUIRE(qp);
	CHECK(a.cap.max_send_wr == 100);
	CHECK(a.cap.max_send_sge == 2);
	CHECK(a.cap.max_inline_data == 64);
	CHECK(a.cap.max_recv_wr == 100);
	CHECK(a.cap.max_recv_sge == 3);
	struct ibv_qp_attr q{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(qp, &q, IBV_QP_CAP, &ia) == 0);
	CHECK(ia.cap.max_recv_wr == 100);
	CHECK(ibv_destroy_qp(qp) == 0);
}
