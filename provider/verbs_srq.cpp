/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues and XRC domains: the exported SRQ verbs and the
 * context slots behind verbs.h's inline ibv_create_srq_ex(),
 * ibv_get_srq_num(), ibv_open_xrcd() and ibv_close_xrcd().
 */
#include "abi.h"
#include "ops.h"

#include "srq.h"
#include "srq_ring.h"

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

Srq *our_srq(struct ibv_srq *srq)
{
	return to_context(srq->context) ? Srq::from(srq) : nullptr;
}

struct ibv_srq *ctx_create_srq_ex(struct ibv_context *context,
				  struct ibv_srq_init_attr_ex *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_srq>(EINVAL);
	return guard_ptr([&] { return to_ptr(create_srq(*c, *attr)); });
}

int ctx_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num)
{
	if (!srq || !srq_num || !our_srq(srq))
		return EINVAL;
	return get_srq_num(*Srq::from(srq), *srq_num);
}

struct ibv_xrcd *ctx_open_xrcd(struct ibv_context *context, struct ibv_xrcd_init_attr *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_xrcd>(EINVAL);
	return guard_ptr([&] { return to_ptr(open_xrcd(*c, *attr)); });
}

int ctx_close_xrcd(struct ibv_xrcd *xrcd)
{
	if (!xrcd || !to_context(xrcd->context))
		return EINVAL;
	return guard_int([&] { return close_xrcd(*Xrcd::from(xrcd)); });
}

/* ibv_post_srq_recv() is inline in verbs.h: the ops slot. */
int ctx_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	if (srq && !wr)
		return 0; /* libmlx5: an empty list posts nothing */
	if (!srq || !bad_wr || !our_srq(srq)) {
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	return guard_int([&] { return post_srq_recv(*Srq::from(srq), wr, bad_wr); });
}

} // namespace

namespace shmverbs::abi {

void install_srq_ops(struct verbs_context &v)
{
	v.create_srq_ex = ctx_create_srq_ex;
	v.get_srq_num = ctx_get_srq_num;
	v.context.ops.post_srq_recv = ctx_post_srq_recv;
	v.open_xrcd = ctx_open_xrcd;
	v.close_xrcd = ctx_close_xrcd;
}

} // namespace shmverbs::abi

SHMV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!pd || !attr)
		return fail_ptr<struct ibv_srq>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_srq, "IBVERBS_1.1", pd, attr);
	return guard_ptr([&]() -> struct ibv_srq * {
		struct ibv_srq_init_attr_ex ex{};
		ex.srq_context = attr->srq_context;
		ex.attr = attr->attr;
		ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
		ex.pd = pd;
		Result<Srq> srq = create_srq(*c, ex);
		if (srq)
			attr->attr = ex.attr;
		return to_ptr(srq);
	});
}

SHMV_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
			       int srq_attr_mask)
{
	if (!srq || !srq_attr)
		return EINVAL;
	if (!our_srq(srq))
		SHMV_FORWARD_INT(ibv_modify_srq, "IBVERBS_1.1", srq, srq_attr, srq_attr_mask);
	return guard_int([&] { return modify_srq(*Srq::from(srq), *srq_attr, srq_attr_mask); });
}

SHMV_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	if (!srq || !srq_attr)
		return EINVAL;
	if (!our_srq(srq))
		SHMV_FORWARD_INT(ibv_query_srq, "IBVERBS_1.1", srq, srq_attr);
	return guard_int([&] { return query_srq(*Srq::from(srq), *srq_attr); });
}

SHMV_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	if (!srq)
		return EINVAL;
	if (!our_srq(srq))
		SHMV_FORWARD_INT(ibv_destroy_srq, "IBVERBS_1.1", srq);
	return guard_int([&] { return destroy_srq(*Srq::from(srq)); });
}

/*
 * Test and diagnostic hook into the data path's SRQ entry point: does what a
 * consumer does after a take that left `posted` receive WQEs, so that
 * IBV_EVENT_SRQ_LIMIT_REACHED follows (the owner's poller, within 10 ms)
 * when that is below an armed limit. Returns 0, or EINVAL for a NULL or
 * foreign SRQ.
 */
SHMV_EXPORT int shmverbs_inject_srq_posted(struct ibv_srq *srq, uint32_t posted)
{
	if (!srq || !our_srq(srq))
		return EINVAL;
	return guard_int([&] {
		srq_ring_note_left(*Srq::from(srq), posted);
		return 0;
	});
}
