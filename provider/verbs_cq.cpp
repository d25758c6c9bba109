/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels: the exported verbs and the
 * context slots behind verbs.h's inline ibv_create_cq_ex(), ibv_poll_cq(),
 * ibv_req_notify_cq() and ibv_modify_cq(). Return conventions follow
 * rdma-core 44 verb by verb: pointer verbs NULL + errno, most int verbs a
 * positive errno, ibv_get_cq_event() -1 + errno, ibv_poll_cq() a negative
 * value.
 */
#include "abi.h"
#include "ops.h"

#include "cq.h"

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

/* Our CQ, or nullptr when a real provider owns it. */
Cq *our_cq(struct ibv_cq *cq)
{
	return to_context(cq->context) ? Cq::from(cq) : nullptr;
}

struct ibv_cq_ex *ctx_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_cq_ex>(EINVAL);
	return guard_ptr([&]() -> struct ibv_cq_ex * {
		Result<Cq> cq = create_cq(*c, *attr, true);
		if (!cq)
			return fail_ptr<struct ibv_cq_ex>(cq.error());
		return &cq->ibv.cq_ex;
	});
}

/* The data-path slots are reached through cq->context->ops, which only our
 * contexts point here: the CQ is ours, no lookup needed on this hot path. */
int ctx_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	if (!cq)
		return -EINVAL;
	return guard_int([&] { return poll_cq(*Cq::from(cq), num_entries, wc); });
}

int ctx_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	if (!cq)
		return EINVAL;
	return guard_int([&] { return req_notify_cq(*Cq::from(cq), solicited_only); });
}

int ctx_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr)
{
	if (!cq || !attr || !our_cq(cq))
		return EINVAL;
	return guard_int([&] { return modify_cq(*Cq::from(cq), *attr); });
}

} // namespace

namespace shmverbs::abi {

void install_cq_ops(struct verbs_context &v)
{
	v.create_cq_ex = ctx_create_cq_ex;
	v.context.ops.poll_cq = ctx_poll_cq;
	v.context.ops.req_notify_cq = ctx_req_notify_cq;
	v.modify_cq = ctx_modify_cq;
}

} // namespace shmverbs::abi

SHMV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	if (!context)
		return fail_ptr<struct ibv_comp_channel>(EINVAL);
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_comp_channel, "IBVERBS_1.0", context);
	return guard_ptr([&] { return to_ptr(create_comp_channel(*c)); });
}

SHMV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (!channel)
		return EINVAL;
	if (!to_context(channel->context))
		SHMV_FORWARD_INT(ibv_destroy_comp_channel, "IBVERBS_1.0", channel);
	return guard_int([&] { return destroy_comp_channel(*CompChannel::from(channel)); });
}

SHMV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
					 struct ibv_comp_channel *channel, int comp_vector)
{
	if (!context)
		return fail_ptr<struct ibv_cq>(EINVAL);
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_cq, "IBVERBS_1.1", context, cqe, cq_context, channel,
				 comp_vector);
	/* libmlx5 turns ibv_create_cq() into its extended path with the
	 * standard wc_flags, after refusing a non-positive size. */
	if (cqe <= 0)
		return fail_ptr<struct ibv_cq>(EINVAL);
	struct ibv_cq_init_attr_ex attr{};
	attr.cqe = static_cast<uint32_t>(cqe);
	attr.cq_context = cq_context;
	attr.channel = channel;
	attr.comp_vector = static_cast<uint32_t>(comp_vector);
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	return guard_ptr([&] { return to_ptr(create_cq(*c, attr, false)); });
}

SHMV_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	if (!cq)
		return EINVAL;
	if (!our_cq(cq))
		SHMV_FORWARD_INT(ibv_resize_cq, "IBVERBS_1.1", cq, cqe);
	return guard_int([&] { return resize_cq(*Cq::from(cq), cqe); });
}

SHMV_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	if (!cq)
		return EINVAL;
	if (!our_cq(cq))
		SHMV_FORWARD_INT(ibv_destroy_cq, "IBVERBS_1.1", cq);
	return guard_int([&] { return destroy_cq(*Cq::from(cq)); });
}

SHMV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
				 void **cq_context)
{
	if (!channel || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	if (!to_context(channel->context))
		SHMV_FORWARD_NEG1(ibv_get_cq_event, "IBVERBS_1.1", channel, cq, cq_context);
	Cq *got = nullptr;
	int err = guard_int([&] { return get_cq_event(*CompChannel::from(channel), got); });
	if (err) {
		errno = err;
		return -1;
	}
	*cq = got->abi();
	*cq_context = got->abi()->cq_context;
	return 0;
}

SHMV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	if (!cq)
		return;
	if (!our_cq(cq)) {
		if (auto fp = SHMV_NEXT(ibv_ack_cq_events, "IBVERBS_1.1"))
			fp(cq, nevents);
		return;
	}
	ack_cq_events(*Cq::from(cq), nevents);
}

/*
 * Test and diagnostic hook into the data path's entry point: delivers `wc` to
 * one of our CQs as if the device had completed a work request (solicited
 * when the request carried IBV_SEND_SOLICITED). Returns 0, ENOSPC when the
 * CQ overran, EINVAL for a NULL or foreign CQ.
 */
SHMV_EXPORT int shmverbs_inject_completion(struct ibv_cq *cq, const struct ibv_wc *wc,
					   int solicited)
{
	if (!cq || !wc || !our_cq(cq))
		return EINVAL;
	return guard_int([&] {
		Completion c{};
		c.wc = *wc;
		c.solicited = solicited != 0;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		c.timestamp_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
		clock_gettime(CLOCK_REALTIME, &ts);
		c.wallclock_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
		return deliver_completion(*Cq::from(cq), c);
	});
}
