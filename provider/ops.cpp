/* SPDX-License-Identifier: MIT */
#include "ops.h"

#include "context.h"

#include <mutex>

namespace shmverbs::abi {

namespace {

/* poll_cq reports failure as a negative value, unlike the other int slots. */
template <int Err>
int poll_cq_failing(struct ibv_cq *, int, struct ibv_wc *) { return -Err; }

/* Every slot failing with Err in its convention. */
template <int Err>
void install_failing_ops(struct verbs_context &v)
{
#undef SHMV_UNSUPPORTED
#define SHMV_UNSUPPORTED(slot) (slot) = &shmverbs::abi::Unsupported<decltype(slot), Err>::call
	struct ibv_context_ops &o = v.context.ops;

	SHMV_UNSUPPORTED(o._compat_query_device);
	SHMV_UNSUPPORTED(o._compat_query_port);
	SHMV_UNSUPPORTED(o._compat_alloc_pd);
	SHMV_UNSUPPORTED(o._compat_dealloc_pd);
	SHMV_UNSUPPORTED(o._compat_reg_mr);
	SHMV_UNSUPPORTED(o._compat_rereg_mr);
	SHMV_UNSUPPORTED(o._compat_dereg_mr);
	SHMV_UNSUPPORTED(o.alloc_mw);
	SHMV_UNSUPPORTED(o.bind_mw);
	SHMV_UNSUPPORTED(o.dealloc_mw);
	SHMV_UNSUPPORTED(o._compat_create_cq);
	o.poll_cq = poll_cq_failing<Err>;
	SHMV_UNSUPPORTED(o.req_notify_cq);
	SHMV_UNSUPPORTED(o._compat_cq_event);
	SHMV_UNSUPPORTED(o._compat_resize_cq);
	SHMV_UNSUPPORTED(o._compat_destroy_cq);
	SHMV_UNSUPPORTED(o._compat_create_srq);
	SHMV_UNSUPPORTED(o._compat_modify_srq);
	SHMV_UNSUPPORTED(o._compat_query_srq);
	SHMV_UNSUPPORTED(o._compat_destroy_srq);
	SHMV_UNSUPPORTED(o.post_srq_recv);
	SHMV_UNSUPPORTED(o._compat_create_qp);
	SHMV_UNSUPPORTED(o._compat_query_qp);
	SHMV_UNSUPPORTED(o._compat_modify_qp);
	SHMV_UNSUPPORTED(o._compat_destroy_qp);
	SHMV_UNSUPPORTED(o.post_send);
	SHMV_UNSUPPORTED(o.post_recv);
	SHMV_UNSUPPORTED(o._compat_create_ah);
	SHMV_UNSUPPORTED(o._compat_destroy_ah);
	SHMV_UNSUPPORTED(o._compat_attach_mcast);
	SHMV_UNSUPPORTED(o._compat_detach_mcast);
	SHMV_UNSUPPORTED(o._compat_async_event);

	SHMV_UNSUPPORTED(v.query_port);
	SHMV_UNSUPPORTED(v.advise_mr);
	SHMV_UNSUPPORTED(v.alloc_null_mr);
	SHMV_UNSUPPORTED(v.read_counters);
	SHMV_UNSUPPORTED(v.attach_counters_point_flow);
	SHMV_UNSUPPORTED(v.create_counters);
	SHMV_UNSUPPORTED(v.destroy_counters);
	SHMV_UNSUPPORTED(v.reg_dm_mr);
	SHMV_UNSUPPORTED(v.alloc_dm);
	SHMV_UNSUPPORTED(v.free_dm);
	SHMV_UNSUPPORTED(v.modify_flow_action_esp);
	SHMV_UNSUPPORTED(v.destroy_flow_action);
	SHMV_UNSUPPORTED(v.create_flow_action_esp);
	SHMV_UNSUPPORTED(v.modify_qp_rate_limit);
	SHMV_UNSUPPORTED(v.alloc_parent_domain);
	SHMV_UNSUPPORTED(v.dealloc_td);
	SHMV_UNSUPPORTED(v.alloc_td);
	SHMV_UNSUPPORTED(v.modify_cq);
	SHMV_UNSUPPORTED(v.post_srq_ops);
	SHMV_UNSUPPORTED(v.destroy_rwq_ind_table);
	SHMV_UNSUPPORTED(v.create_rwq_ind_table);
	SHMV_UNSUPPORTED(v.destroy_wq);
	SHMV_UNSUPPORTED(v.modify_wq);
	SHMV_UNSUPPORTED(v.create_wq);
	SHMV_UNSUPPORTED(v.query_rt_values);
	SHMV_UNSUPPORTED(v.create_cq_ex);
	SHMV_UNSUPPORTED(v.query_device_ex);
	SHMV_UNSUPPORTED(v.ibv_destroy_flow);
	SHMV_UNSUPPORTED(v.ABI_placeholder2);
	SHMV_UNSUPPORTED(v.ibv_create_flow);
	SHMV_UNSUPPORTED(v.ABI_placeholder1);
	SHMV_UNSUPPORTED(v.open_qp);
	SHMV_UNSUPPORTED(v.create_qp_ex);
	SHMV_UNSUPPORTED(v.get_srq_num);
	SHMV_UNSUPPORTED(v.create_srq_ex);
	SHMV_UNSUPPORTED(v.open_xrcd);
	SHMV_UNSUPPORTED(v.close_xrcd);
}

} // namespace

void install_default_ops(struct verbs_context &v)
{
	install_failing_ops<EOPNOTSUPP>(v);
	/* The engine marks contexts inherited in a forked child; their slots
	 * then fail with EIO. */
	static std::once_flag once;
	std::call_once(once, [] {
		set_inherited_context_hook([](Context &c) { install_inherited_ops(c.vctx); });
	});
}

void install_inherited_ops(struct verbs_context &v) { install_failing_ops<EIO>(v); }

} // namespace shmverbs::abi
