/* SPDX-License-Identifier: MIT */
/*
 * Queue pairs: ibv_create_qp/query/modify/destroy, ibv_qp_to_qp_ex,
 * multicast attachment and ECE are exports; ibv_create_qp_ex and ibv_open_qp
 * are inline in verbs.h and reach us through struct verbs_context.
 *
 * Return conventions are rdma-core 44's: pointer verbs give NULL with errno,
 * int verbs a positive errno. Where rdma-core would dereference a NULL
 * argument we fail with EINVAL instead.
 */
#include "abi.h"
#include "ops.h"

#include "qp.h"
#include "datapath.h"
#include "qp_ex.h"

#include <infiniband/verbs.h>

#include <cstring>

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

struct ibv_qp *finish_create(Result<Qp> r)
{
	if (r && r->has_qp_ex())
		install_qp_ex_ops(r->ibv.qp_ex); /* lib/qp_ex.cpp */
	return to_ptr(r);
}

struct ibv_qp *ctx_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_qp>(EINVAL);
	return guard_ptr([&] { return finish_create(create_qp(*c, *attr)); });
}

struct ibv_qp *ctx_open_qp(struct ibv_context *context, struct ibv_qp_open_attr *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_qp>(EINVAL);
	return guard_ptr([&] { return to_ptr(open_qp(*c, *attr)); });
}

/* rdma-core's PCI_VENDOR_ID_MELLANOX, which ECE uses as its vendor id. */
constexpr uint32_t ece_vendor_mellanox = 0x15b3;

bool is_rxe(struct ibv_qp *qp)
{
	return Context::from(qp->context)->device->profile->is(ProfileKind::Rxe);
}

} // namespace

namespace shmverbs::abi {

/* The data path (lib/datapath.h): ibv_post_send/ibv_post_recv. */
int ctx_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct ibv_send_wr *ignored;
	if (!bad_wr)
		bad_wr = &ignored;
	if (!qp)
		return EINVAL;
	return guard_int([&] { return post_send(*Qp::from(qp), wr, bad_wr); });
}

int ctx_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct ibv_recv_wr *ignored;
	if (!bad_wr)
		bad_wr = &ignored;
	if (!qp)
		return EINVAL;
	return guard_int([&] { return post_recv(*Qp::from(qp), wr, bad_wr); });
}

void install_qp_ops(struct verbs_context &v)
{
	v.create_qp_ex = ctx_create_qp_ex;
	v.open_qp = ctx_open_qp;
	v.context.ops.post_send = ctx_post_send;
	v.context.ops.post_recv = ctx_post_recv;
}

} // namespace shmverbs::abi

/*
 * Test hook: starts the QP's send queue count afresh so that the next WR
 * posted is number `next` (lib/cq.h SqSeq), for the tests of its wrap at
 * 2^32 without 2^32 posts. Returns 0, or EINVAL for a NULL or foreign QP.
 * Call it with no WR outstanding and nothing else posting.
 */
SHMV_EXPORT int shmverbs_test_renumber_sq(struct ibv_qp *qp, uint32_t next)
{
	if (!qp || !to_context(qp->context))
		return EINVAL;
	return guard_int([&] { return renumber_send_queue(*Qp::from(qp), next); });
}

SHMV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!pd || !qp_init_attr)
		return fail_ptr<struct ibv_qp>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_qp, "IBVERBS_1.1", pd, qp_init_attr);
	/* As libmlx5: the basic verb is the extended one with only a PD. */
	return guard_ptr([&]() -> struct ibv_qp * {
		struct ibv_qp_init_attr_ex ex{};
		std::memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
		ex.comp_mask = IBV_QP_INIT_ATTR_PD;
		ex.pd = pd;
		struct ibv_qp *qp = finish_create(create_qp(*c, ex));
		if (qp)
			std::memcpy(qp_init_attr, &ex, sizeof(*qp_init_attr));
		return qp;
	});
}

SHMV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	if (!qp)
		return nullptr;
	if (!to_context(qp->context)) {
		if (auto fp = SHMV_NEXT(ibv_qp_to_qp_ex, "IBVERBS_1.6"))
			return fp(qp);
		return nullptr;
	}
	Qp *q = Qp::from(qp);
	return q->has_qp_ex() ? &q->ibv.qp_ex : nullptr;
}

SHMV_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			     struct ibv_qp_init_attr *init_attr)
{
	if (!qp || !attr || !init_attr)
		return EINVAL;
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_query_qp, "IBVERBS_1.1", qp, attr, attr_mask, init_attr);
	int err = guard_int([&] { return query_qp(*Qp::from(qp), *attr, attr_mask, *init_attr); });
	/* libibverbs keeps ibv_qp::state in step with what it saw. */
	if (!err && (attr_mask & IBV_QP_STATE))
		qp->state = attr->qp_state;
	return err;
}

SHMV_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	if (!qp || !attr)
		return EINVAL;
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_modify_qp, "IBVERBS_1.1", qp, attr, attr_mask);
	int err = guard_int([&] { return modify_qp(*Qp::from(qp), *attr, attr_mask); });
	if (!err && (attr_mask & IBV_QP_STATE))
		qp->state = attr->qp_state;
	return err;
}

SHMV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	if (!qp)
		return EINVAL;
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_destroy_qp, "IBVERBS_1.1", qp);
	return guard_int([&] { return destroy_qp(*Qp::from(qp)); });
}

SHMV_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	if (!qp || !gid)
		return EINVAL;
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_attach_mcast, "IBVERBS_1.1", qp, gid, lid);
	return guard_int([&] { return attach_mcast(*Qp::from(qp), *gid, lid); });
}

SHMV_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	if (!qp || !gid)
		return EINVAL;
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_detach_mcast, "IBVERBS_1.1", qp, gid, lid);
	return guard_int([&] { return detach_mcast(*Qp::from(qp), *gid, lid); });
}

/* A ConnectX-5 has no data-in-order capability: libmlx5 answers 0. */
SHMV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op,
					   uint32_t flags)
{
	if (!qp)
		return 0;
	if (!to_context(qp->context)) {
		if (auto fp = SHMV_NEXT(ibv_query_qp_data_in_order, "IBVERBS_1.14"))
			return fp(qp, op, flags);
		return 0;
	}
	return 0;
}

/*
 * Enhanced Connection Establishment needs firmware a ConnectX-5 lacks:
 * libmlx5 checks the request, then refuses it; Soft-RoCE has no ECE at all.
 * Both set errno as well as returning it.
 */
SHMV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	if (!qp || !ece) {
		errno = EINVAL;
		return EINVAL;
	}
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_set_ece, "IBVERBS_1.10", qp, ece);
	int err;
	if (!ece->vendor_id || is_rxe(qp))
		err = EOPNOTSUPP;
	else if (ece->comp_mask || ece->vendor_id != ece_vendor_mellanox)
		err = EINVAL;
	else
		err = EOPNOTSUPP;
	errno = err;
	return err;
}

SHMV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	if (!qp || !ece) {
		errno = EINVAL;
		return EINVAL;
	}
	if (!to_context(qp->context))
		SHMV_FORWARD_INT(ibv_query_ece, "IBVERBS_1.10", qp, ece);
	if (is_rxe(qp)) {
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	ece->vendor_id = ece_vendor_mellanox;
	ece->options = 0;
	ece->comp_mask = 0;
	return 0;
}
