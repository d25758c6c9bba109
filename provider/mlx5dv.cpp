/* SPDX-License-Identifier: MIT */
/*
 * libmlx5.so.1: the mlx5 direct verbs (<infiniband/mlx5dv.h>), every name and
 * version of rdma-core 44's library, so that programs linked against it
 * (perftest, pyverbs, ...) load with the shmverbs drop-ins and, under
 * LD_PRELOAD, keep working on a real ConnectX next to the emulation.
 *
 * The emulated devices look like a ConnectX-5 through the ordinary verbs,
 * but they are not mlx5 hardware for the direct verbs: mlx5dv_is_supported()
 * is false for them and every other call fails with EOPNOTSUPP on their
 * objects, as the real libmlx5 does for a device of another vendor, so a
 * program falls back to its plain-verbs paths. See provider/dv_common.h for
 * the forwarding of foreign objects.
 */
#include "dv_common.h"

#include <infiniband/mlx5dv.h>

using shmverbs::dv::NoObject;

namespace shmverbs::dv {

/* mlx5dv_init_obj() names the objects it converts in a struct; they all
 * belong to one context, so the first one selected decides. */
struct ObjectSet {
	struct mlx5dv_obj *obj;
	uint64_t types;
	ObjectSet(struct mlx5dv_obj *o, uint64_t t) : obj(o), types(t) {}
};

inline Owner owner_of(const ObjectSet &set)
{
	if (!set.obj)
		return Owner::Null;
	const struct mlx5dv_obj &o = *set.obj;
	if (set.types & MLX5DV_OBJ_QP)
		return owner_of(o.qp.in);
	if (set.types & MLX5DV_OBJ_CQ)
		return owner_of(o.cq.in);
	if (set.types & MLX5DV_OBJ_SRQ)
		return owner_of(o.srq.in);
	if (set.types & MLX5DV_OBJ_RWQ)
		return owner_of(o.rwq.in);
	if (set.types & MLX5DV_OBJ_DM)
		return owner_of(o.dm.in);
	if (set.types & MLX5DV_OBJ_AH)
		return owner_of(o.ah.in);
	if (set.types & MLX5DV_OBJ_PD)
		return owner_of(o.pd.in);
	/* Nothing selected: EINVAL whatever the device (libmlx5's
	 * get_context_from_obj() finds no context). */
	return Owner::Null;
}

} // namespace shmverbs::dv

using shmverbs::dv::ObjectSet;

/* No emulated device is an mlx5 device for the direct verbs. */
SHMV_DV_EXPORT bool mlx5dv_is_supported(struct ibv_device *device)
{
	using namespace shmverbs::dv;
	if (owner_of(device) != Owner::Foreign)
		return false;
	auto real = SHMV_DV_NEXT(mlx5dv_is_supported, "MLX5_1.8");
	return real && real(device);
}

/* An event file descriptor: -1 with errno, never an errno that could pass
 * for a descriptor. */
SHMV_DV_EXPORT int mlx5dv_vfio_get_events_fd(struct ibv_context *ibctx)
{
	using namespace shmverbs::dv;
	Owner owner = owner_of(ibctx);
	if (owner == Owner::Foreign)
		if (auto real = SHMV_DV_NEXT(mlx5dv_vfio_get_events_fd, "MLX5_1.21"))
			return real(ibctx);
	errno = owner == Owner::Null ? EINVAL : EOPNOTSUPP;
	return -1;
}

/* mlx5dv_init_obj@MLX5_1.0, the variant from before MLX5_1.2 (it did not
 * know the later object types); same prototype, a different real entry. */
extern "C" __attribute__((visibility("default"), symver("mlx5dv_init_obj@MLX5_1.0"))) int
compat_1_0_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	using namespace shmverbs::dv;
	switch (owner_of(ObjectSet(obj, obj_type))) {
	case Owner::Null:
		return EINVAL;
	case Owner::Foreign:
		if (auto real = reinterpret_cast<decltype(&mlx5dv_init_obj)>(
			    next_symbol("mlx5dv_init_obj", "MLX5_1.0")))
			return real(obj, obj_type);
		break;
	case Owner::Ours:
		break;
	}
	return EOPNOTSUPP;
}

/* Everything else, by the version that introduced it. */

/* MLX5_1.0 */
SHMV_DV("MLX5_1.0", int, mlx5dv_query_device,
	(struct ibv_context *ctx_in, struct mlx5dv_context *attrs_out),
	(ctx_in, attrs_out), ctx_in)

/* MLX5_1.1 */
SHMV_DV("MLX5_1.1", struct ibv_cq_ex *, mlx5dv_create_cq,
	(struct ibv_context *context, struct ibv_cq_init_attr_ex *cq_attr,
	 struct mlx5dv_cq_init_attr *mlx5_cq_attr),
	(context, cq_attr, mlx5_cq_attr), context)

/* MLX5_1.2 */
SHMV_DV("MLX5_1.2", int, mlx5dv_init_obj,
	(struct mlx5dv_obj *obj, uint64_t obj_type),
	(obj, obj_type), ObjectSet(obj, obj_type))
SHMV_DV("MLX5_1.2", int, mlx5dv_set_context_attr,
	(struct ibv_context *context, enum mlx5dv_set_ctx_attr_type type, void *attr),
	(context, type, attr), context)

/* MLX5_1.3 */
SHMV_DV("MLX5_1.3", struct ibv_qp *, mlx5dv_create_qp,
	(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
	 struct mlx5dv_qp_init_attr *mlx5_qp_attr),
	(context, qp_attr, mlx5_qp_attr), context)
SHMV_DV("MLX5_1.3", struct ibv_wq *, mlx5dv_create_wq,
	(struct ibv_context *context, struct ibv_wq_init_attr *wq_init_attr,
	 struct mlx5dv_wq_init_attr *mlx5_wq_attr),
	(context, wq_init_attr, mlx5_wq_attr), context)

/* MLX5_1.4 */
SHMV_DV("MLX5_1.4", int, mlx5dv_get_clock_info,
	(struct ibv_context *context, struct mlx5dv_clock_info *clock_info),
	(context, clock_info), context)

/* MLX5_1.5 */
SHMV_DV("MLX5_1.5", struct ibv_flow_action *, mlx5dv_create_flow_action_esp,
	(struct ibv_context *ctx, struct ibv_flow_action_esp_attr *esp,
	 struct mlx5dv_flow_action_esp *mlx5_attr),
	(ctx, esp, mlx5_attr), ctx)

/* MLX5_1.6 */
SHMV_DV("MLX5_1.6", struct ibv_flow *, mlx5dv_create_flow,
	(struct mlx5dv_flow_matcher *matcher, struct mlx5dv_flow_match_parameters *match_value,
	 size_t num_actions, struct mlx5dv_flow_action_attr actions_attr[]),
	(matcher, match_value, num_actions, actions_attr), matcher)
SHMV_DV("MLX5_1.6", struct mlx5dv_flow_matcher *, mlx5dv_create_flow_matcher,
	(struct ibv_context *context, struct mlx5dv_flow_matcher_attr *matcher_attr),
	(context, matcher_attr), context)
SHMV_DV("MLX5_1.6", int, mlx5dv_destroy_flow_matcher,
	(struct mlx5dv_flow_matcher *matcher),
	(matcher), matcher)

/* MLX5_1.7 */
SHMV_DV("MLX5_1.7", struct ibv_flow_action *, mlx5dv_create_flow_action_modify_header,
	(struct ibv_context *ctx, size_t actions_sz, uint64_t actions[],
	 enum mlx5dv_flow_table_type ft_type),
	(ctx, actions_sz, actions, ft_type), ctx)
SHMV_DV("MLX5_1.7", struct ibv_flow_action *, mlx5dv_create_flow_action_packet_reformat,
	(struct ibv_context *ctx, size_t data_sz, void *data,
	 enum mlx5dv_flow_action_packet_reformat_type reformat_type,
	 enum mlx5dv_flow_table_type ft_type),
	(ctx, data_sz, data, reformat_type, ft_type), ctx)
SHMV_DV("MLX5_1.7", struct mlx5dv_devx_uar *, mlx5dv_devx_alloc_uar,
	(struct ibv_context *context, uint32_t flags),
	(context, flags), context)
SHMV_DV("MLX5_1.7", void, mlx5dv_devx_free_uar,
	(struct mlx5dv_devx_uar *devx_uar),
	(devx_uar), devx_uar)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_general_cmd,
	(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen),
	(context, in, inlen, out, outlen), context)
SHMV_DV("MLX5_1.7", struct mlx5dv_devx_obj *, mlx5dv_devx_obj_create,
	(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen),
	(context, in, inlen, out, outlen), context)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_obj_destroy,
	(struct mlx5dv_devx_obj *obj),
	(obj), obj)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_obj_modify,
	(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen),
	(obj, in, inlen, out, outlen), obj)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_obj_query,
	(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen),
	(obj, in, inlen, out, outlen), obj)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_query_eqn,
	(struct ibv_context *context, uint32_t vector, uint32_t *eqn),
	(context, vector, eqn), context)
SHMV_DV("MLX5_1.7", int, mlx5dv_devx_umem_dereg,
	(struct mlx5dv_devx_umem *umem),
	(umem), umem)
SHMV_DV("MLX5_1.7", struct mlx5dv_devx_umem *, mlx5dv_devx_umem_reg,
	(struct ibv_context *ctx, void *addr, size_t size, uint32_t access),
	(ctx, addr, size, access), ctx)
SHMV_DV("MLX5_1.7", struct ibv_context *, mlx5dv_open_device,
	(struct ibv_device *device, struct mlx5dv_context_attr *attr),
	(device, attr), device)

/* MLX5_1.8 */
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_cq_modify,
	(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen),
	(cq, in, inlen, out, outlen), cq)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_cq_query,
	(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen),
	(cq, in, inlen, out, outlen), cq)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_ind_tbl_modify,
	(struct ibv_rwq_ind_table *ind_tbl, const void *in, size_t inlen, void *out, size_t outlen),
	(ind_tbl, in, inlen, out, outlen), ind_tbl)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_ind_tbl_query,
	(struct ibv_rwq_ind_table *ind_tbl, const void *in, size_t inlen, void *out, size_t outlen),
	(ind_tbl, in, inlen, out, outlen), ind_tbl)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_qp_modify,
	(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen),
	(qp, in, inlen, out, outlen), qp)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_qp_query,
	(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen),
	(qp, in, inlen, out, outlen), qp)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_srq_modify,
	(struct ibv_srq *srq, const void *in, size_t inlen, void *out, size_t outlen),
	(srq, in, inlen, out, outlen), srq)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_srq_query,
	(struct ibv_srq *srq, const void *in, size_t inlen, void *out, size_t outlen),
	(srq, in, inlen, out, outlen), srq)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_wq_modify,
	(struct ibv_wq *wq, const void *in, size_t inlen, void *out, size_t outlen),
	(wq, in, inlen, out, outlen), wq)
SHMV_DV("MLX5_1.8", int, mlx5dv_devx_wq_query,
	(struct ibv_wq *wq, const void *in, size_t inlen, void *out, size_t outlen),
	(wq, in, inlen, out, outlen), wq)

/* MLX5_1.9 */
SHMV_DV("MLX5_1.9", struct mlx5dv_devx_cmd_comp *, mlx5dv_devx_create_cmd_comp,
	(struct ibv_context *context),
	(context), context)
SHMV_DV("MLX5_1.9", void, mlx5dv_devx_destroy_cmd_comp,
	(struct mlx5dv_devx_cmd_comp *cmd_comp),
	(cmd_comp), cmd_comp)
SHMV_DV("MLX5_1.9", int, mlx5dv_devx_get_async_cmd_comp,
	(struct mlx5dv_devx_cmd_comp *cmd_comp, struct mlx5dv_devx_async_cmd_hdr *cmd_resp,
	 size_t cmd_resp_len),
	(cmd_comp, cmd_resp, cmd_resp_len), cmd_comp)
SHMV_DV("MLX5_1.9", int, mlx5dv_devx_obj_query_async,
	(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, size_t outlen, uint64_t wr_id,
	 struct mlx5dv_devx_cmd_comp *cmd_comp),
	(obj, in, inlen, outlen, wr_id, cmd_comp), obj)

/* MLX5_1.10 */
SHMV_DV("MLX5_1.10", struct ibv_dm *, mlx5dv_alloc_dm,
	(struct ibv_context *context, struct ibv_alloc_dm_attr *dm_attr,
	 struct mlx5dv_alloc_dm_attr *mlx5_dm_attr),
	(context, dm_attr, mlx5_dm_attr), context)
SHMV_DV("MLX5_1.10", struct mlx5dv_mkey *, mlx5dv_create_mkey,
	(struct mlx5dv_mkey_init_attr *mkey_init_attr),
	(mkey_init_attr), mkey_init_attr ? mkey_init_attr->pd : nullptr)
SHMV_DV("MLX5_1.10", int, mlx5dv_destroy_mkey,
	(struct mlx5dv_mkey *mkey),
	(mkey), mkey)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_ibv_qp,
	(struct ibv_qp *ibqp),
	(ibqp), ibqp)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_table,
	(struct mlx5dv_dr_table *table),
	(table), table)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_vport,
	(struct mlx5dv_dr_domain *domain, uint32_t vport),
	(domain, vport), domain)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_drop,
	(void),
	(), NoObject{})
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_flow_counter,
	(struct mlx5dv_devx_obj *devx_obj, uint32_t offset),
	(devx_obj, offset), devx_obj)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_modify_header,
	(struct mlx5dv_dr_domain *domain, uint32_t flags, size_t actions_sz, __be64 actions[]),
	(domain, flags, actions_sz, actions), domain)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_packet_reformat,
	(struct mlx5dv_dr_domain *domain, uint32_t flags,
	 enum mlx5dv_flow_action_packet_reformat_type reformat_type, size_t data_sz, void *data),
	(domain, flags, reformat_type, data_sz, data), domain)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_tag,
	(uint32_t tag_value),
	(tag_value), NoObject{})
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_action_destroy,
	(struct mlx5dv_dr_action *action),
	(action), action)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_domain *, mlx5dv_dr_domain_create,
	(struct ibv_context *ctx, enum mlx5dv_dr_domain_type type),
	(ctx, type), ctx)
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_domain_destroy,
	(struct mlx5dv_dr_domain *domain),
	(domain), domain)
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_domain_sync,
	(struct mlx5dv_dr_domain *domain, uint32_t flags),
	(domain, flags), domain)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_matcher *, mlx5dv_dr_matcher_create,
	(struct mlx5dv_dr_table *table, uint16_t priority, uint8_t match_criteria_enable,
	 struct mlx5dv_flow_match_parameters *mask),
	(table, priority, match_criteria_enable, mask), table)
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_matcher_destroy,
	(struct mlx5dv_dr_matcher *matcher),
	(matcher), matcher)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_rule *, mlx5dv_dr_rule_create,
	(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_flow_match_parameters *value,
	 size_t num_actions, struct mlx5dv_dr_action *actions[]),
	(matcher, value, num_actions, actions), matcher)
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_rule_destroy,
	(struct mlx5dv_dr_rule *rule),
	(rule), rule)
SHMV_DV("MLX5_1.10", struct mlx5dv_dr_table *, mlx5dv_dr_table_create,
	(struct mlx5dv_dr_domain *domain, uint32_t level),
	(domain, level), domain)
SHMV_DV("MLX5_1.10", int, mlx5dv_dr_table_destroy,
	(struct mlx5dv_dr_table *table),
	(table), table)
SHMV_DV("MLX5_1.10", struct mlx5dv_qp_ex *, mlx5dv_qp_ex_from_ibv_qp_ex,
	(struct ibv_qp_ex *qp),
	(qp), qp)

/* MLX5_1.11 */
SHMV_DV("MLX5_1.11", struct mlx5dv_devx_event_channel *, mlx5dv_devx_create_event_channel,
	(struct ibv_context *context, enum mlx5dv_devx_create_event_channel_flags flags),
	(context, flags), context)
SHMV_DV("MLX5_1.11", void, mlx5dv_devx_destroy_event_channel,
	(struct mlx5dv_devx_event_channel *event_channel),
	(event_channel), event_channel)
SHMV_DV("MLX5_1.11", ssize_t, mlx5dv_devx_get_event,
	(struct mlx5dv_devx_event_channel *event_channel,
	 struct mlx5dv_devx_async_event_hdr *event_data, size_t event_resp_len),
	(event_channel, event_data, event_resp_len), event_channel)
SHMV_DV("MLX5_1.11", int, mlx5dv_devx_subscribe_devx_event,
	(struct mlx5dv_devx_event_channel *event_channel, struct mlx5dv_devx_obj *obj,
	 uint16_t events_sz, uint16_t events_num[], uint64_t cookie),
	(event_channel, obj, events_sz, events_num, cookie), event_channel)
SHMV_DV("MLX5_1.11", int, mlx5dv_devx_subscribe_devx_event_fd,
	(struct mlx5dv_devx_event_channel *event_channel, int fd, struct mlx5dv_devx_obj *obj,
	 uint16_t event_num),
	(event_channel, fd, obj, event_num), event_channel)

/* MLX5_1.12 */
SHMV_DV("MLX5_1.12", struct mlx5dv_var *, mlx5dv_alloc_var,
	(struct ibv_context *context, uint32_t flags),
	(context, flags), context)
SHMV_DV("MLX5_1.12", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_flow_meter,
	(struct mlx5dv_dr_flow_meter_attr *attr),
	(attr), attr)
SHMV_DV("MLX5_1.12", int, mlx5dv_dr_action_modify_flow_meter,
	(struct mlx5dv_dr_action *action, struct mlx5dv_dr_flow_meter_attr *attr,
	 __be64 modify_field_select),
	(action, attr, modify_field_select), action)
SHMV_DV("MLX5_1.12", int, mlx5dv_dump_dr_domain,
	(FILE *fout, struct mlx5dv_dr_domain *domain),
	(fout, domain), domain)
SHMV_DV("MLX5_1.12", int, mlx5dv_dump_dr_matcher,
	(FILE *fout, struct mlx5dv_dr_matcher *matcher),
	(fout, matcher), matcher)
SHMV_DV("MLX5_1.12", int, mlx5dv_dump_dr_rule,
	(FILE *fout, struct mlx5dv_dr_rule *rule),
	(fout, rule), rule)
SHMV_DV("MLX5_1.12", int, mlx5dv_dump_dr_table,
	(FILE *fout, struct mlx5dv_dr_table *table),
	(fout, table), table)
SHMV_DV("MLX5_1.12", void, mlx5dv_free_var,
	(struct mlx5dv_var *dv_var),
	(dv_var), dv_var)

/* MLX5_1.13 */
SHMV_DV("MLX5_1.13", struct mlx5dv_pp *, mlx5dv_pp_alloc,
	(struct ibv_context *context, size_t pp_context_sz, const void *pp_context, uint32_t flags),
	(context, pp_context_sz, pp_context, flags), context)
SHMV_DV("MLX5_1.13", void, mlx5dv_pp_free,
	(struct mlx5dv_pp *pp),
	(pp), pp)

/* MLX5_1.14 */
SHMV_DV("MLX5_1.14", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_default_miss,
	(void),
	(), NoObject{})
SHMV_DV("MLX5_1.14", void, mlx5dv_dr_domain_set_reclaim_device_memory,
	(struct mlx5dv_dr_domain *dmn, bool enable),
	(dmn, enable), dmn)
SHMV_DV("MLX5_1.14", int, mlx5dv_modify_qp_lag_port,
	(struct ibv_qp *qp, uint8_t port_num),
	(qp, port_num), qp)
SHMV_DV("MLX5_1.14", int, mlx5dv_query_qp_lag_port,
	(struct ibv_qp *qp, uint8_t *port_num, uint8_t *active_port_num),
	(qp, port_num, active_port_num), qp)

/* MLX5_1.15 */
SHMV_DV("MLX5_1.15", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_devx_tir,
	(struct mlx5dv_devx_obj *devx_obj),
	(devx_obj), devx_obj)

/* MLX5_1.16 */
SHMV_DV("MLX5_1.16", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_array,
	(struct mlx5dv_dr_domain *domain, size_t num_dest,
	 struct mlx5dv_dr_action_dest_attr *dests[]),
	(domain, num_dest, dests), domain)
SHMV_DV("MLX5_1.16", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_flow_sampler,
	(struct mlx5dv_dr_flow_sampler_attr *attr),
	(attr), attr)

/* MLX5_1.17 */
SHMV_DV("MLX5_1.17", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_aso,
	(struct mlx5dv_dr_domain *domain, struct mlx5dv_devx_obj *devx_obj, uint32_t offset,
	 uint32_t flags, uint8_t return_reg_c),
	(domain, devx_obj, offset, flags, return_reg_c), domain)
SHMV_DV("MLX5_1.17", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_pop_vlan,
	(void),
	(), NoObject{})
SHMV_DV("MLX5_1.17", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_push_vlan,
	(struct mlx5dv_dr_domain *domain, __be32 vlan_hdr),
	(domain, vlan_hdr), domain)
SHMV_DV("MLX5_1.17", int, mlx5dv_dr_action_modify_aso,
	(struct mlx5dv_dr_action *action, uint32_t offset, uint32_t flags, uint8_t return_reg_c),
	(action, offset, flags, return_reg_c), action)
SHMV_DV("MLX5_1.17", int, mlx5dv_modify_qp_sched_elem,
	(struct ibv_qp *qp, const struct mlx5dv_sched_leaf *requestor,
	 const struct mlx5dv_sched_leaf *responder),
	(qp, requestor, responder), qp)
SHMV_DV("MLX5_1.17", int, mlx5dv_modify_qp_udp_sport,
	(struct ibv_qp *qp, uint16_t udp_sport),
	(qp, udp_sport), qp)
SHMV_DV("MLX5_1.17", struct mlx5dv_sched_leaf *, mlx5dv_sched_leaf_create,
	(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr),
	(context, sched_attr), context)
SHMV_DV("MLX5_1.17", int, mlx5dv_sched_leaf_destroy,
	(struct mlx5dv_sched_leaf *leaf),
	(leaf), leaf)
SHMV_DV("MLX5_1.17", int, mlx5dv_sched_leaf_modify,
	(struct mlx5dv_sched_leaf *leaf, const struct mlx5dv_sched_attr *sched_attr),
	(leaf, sched_attr), leaf)
SHMV_DV("MLX5_1.17", struct mlx5dv_sched_node *, mlx5dv_sched_node_create,
	(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr),
	(context, sched_attr), context)
SHMV_DV("MLX5_1.17", int, mlx5dv_sched_node_destroy,
	(struct mlx5dv_sched_node *node),
	(node), node)
SHMV_DV("MLX5_1.17", int, mlx5dv_sched_node_modify,
	(struct mlx5dv_sched_node *node, const struct mlx5dv_sched_attr *sched_attr),
	(node, sched_attr), node)

/* MLX5_1.18 */
SHMV_DV("MLX5_1.18", int, mlx5dv_reserved_qpn_alloc,
	(struct ibv_context *ctx, uint32_t *qpn),
	(ctx, qpn), ctx)
SHMV_DV("MLX5_1.18", int, mlx5dv_reserved_qpn_dealloc,
	(struct ibv_context *ctx, uint32_t qpn),
	(ctx, qpn), ctx)

/* MLX5_1.19 */
SHMV_DV("MLX5_1.19", int, _mlx5dv_query_port,
	(struct ibv_context *context, uint32_t port_num, struct mlx5dv_port *info, size_t info_len),
	(context, port_num, info, info_len), context)
SHMV_DV("MLX5_1.19", struct mlx5dv_devx_umem *, mlx5dv_devx_umem_reg_ex,
	(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *umem_in),
	(ctx, umem_in), ctx)
SHMV_DV("MLX5_1.19", void *, mlx5dv_dm_map_op_addr,
	(struct ibv_dm *dm, uint8_t op),
	(dm, op), dm)

/* MLX5_1.20 */
SHMV_DV("MLX5_1.20", int, _mlx5dv_mkey_check,
	(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info, size_t err_info_size),
	(mkey, err_info, err_info_size), mkey)
SHMV_DV("MLX5_1.20", void, mlx5dv_dr_domain_allow_duplicate_rules,
	(struct mlx5dv_dr_domain *domain, bool allow),
	(domain, allow), domain)
SHMV_DV("MLX5_1.20", int, mlx5dv_map_ah_to_qp,
	(struct ibv_ah *ah, uint32_t qp_num),
	(ah, qp_num), ah)

/* The number of WRs cancelled, or -errno (mlx5dv_qp_cancel_posted_send_wrs(3)):
 * a positive errno would read as a count. */
SHMV_DV_EXPORT int mlx5dv_qp_cancel_posted_send_wrs(struct mlx5dv_qp_ex *mqp, uint64_t wr_id)
{
	using namespace shmverbs::dv;
	switch (owner_of(mqp)) {
	case Owner::Null:
		return -EINVAL;
	case Owner::Foreign:
		if (auto real = SHMV_DV_NEXT(mlx5dv_qp_cancel_posted_send_wrs, "MLX5_1.20"))
			return real(mqp, wr_id);
		break;
	case Owner::Ours:
		break;
	}
	return -EOPNOTSUPP;
}

/* MLX5_1.21 */
SHMV_DV("MLX5_1.21", int, mlx5dv_crypto_login,
	(struct ibv_context *context, struct mlx5dv_crypto_login_attr *login_attr),
	(context, login_attr), context)
SHMV_DV("MLX5_1.21", int, mlx5dv_crypto_login_query_state,
	(struct ibv_context *context, enum mlx5dv_crypto_login_state *state),
	(context, state), context)
SHMV_DV("MLX5_1.21", int, mlx5dv_crypto_logout,
	(struct ibv_context *context),
	(context), context)
SHMV_DV("MLX5_1.21", int, mlx5dv_dci_stream_id_reset,
	(struct ibv_qp *qp, uint16_t stream_id),
	(qp, stream_id), qp)
SHMV_DV("MLX5_1.21", struct mlx5dv_dek *, mlx5dv_dek_create,
	(struct ibv_context *context, struct mlx5dv_dek_init_attr *init_attr),
	(context, init_attr), context)
SHMV_DV("MLX5_1.21", int, mlx5dv_dek_destroy,
	(struct mlx5dv_dek *dek),
	(dek), dek)
SHMV_DV("MLX5_1.21", int, mlx5dv_dek_query,
	(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr),
	(dek, attr), dek)
SHMV_DV("MLX5_1.21", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_ib_port,
	(struct mlx5dv_dr_domain *domain, uint32_t ib_port),
	(domain, ib_port), domain)
SHMV_DV("MLX5_1.21", int, mlx5dv_dr_matcher_set_layout,
	(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_dr_matcher_layout *layout),
	(matcher, layout), matcher)
SHMV_DV("MLX5_1.21", struct ibv_device **, mlx5dv_get_vfio_device_list,
	(struct mlx5dv_vfio_context_attr *attr),
	(attr), attr)
SHMV_DV("MLX5_1.21", int, mlx5dv_vfio_process_events,
	(struct ibv_context *context),
	(context), context)

/* MLX5_1.22 */
SHMV_DV("MLX5_1.22", int, mlx5dv_dr_aso_other_domain_link,
	(struct mlx5dv_devx_obj *devx_obj, struct mlx5dv_dr_domain *peer_dmn,
	 struct mlx5dv_dr_domain *dmn, uint32_t flags, uint8_t return_reg_c),
	(devx_obj, peer_dmn, dmn, flags, return_reg_c), devx_obj)
SHMV_DV("MLX5_1.22", int, mlx5dv_dr_aso_other_domain_unlink,
	(struct mlx5dv_devx_obj *devx_obj, struct mlx5dv_dr_domain *dmn),
	(devx_obj, dmn), devx_obj)

/* MLX5_1.23 */
SHMV_DV("MLX5_1.23", struct mlx5dv_devx_msi_vector *, mlx5dv_devx_alloc_msi_vector,
	(struct ibv_context *ibctx),
	(ibctx), ibctx)
SHMV_DV("MLX5_1.23", struct mlx5dv_devx_eq *, mlx5dv_devx_create_eq,
	(struct ibv_context *ibctx, const void *in, size_t inlen, void *out, size_t outlen),
	(ibctx, in, inlen, out, outlen), ibctx)
SHMV_DV("MLX5_1.23", int, mlx5dv_devx_destroy_eq,
	(struct mlx5dv_devx_eq *eq),
	(eq), eq)
SHMV_DV("MLX5_1.23", int, mlx5dv_devx_free_msi_vector,
	(struct mlx5dv_devx_msi_vector *msi),
	(msi), msi)

/* MLX5_1.24 */
SHMV_DV("MLX5_1.24", struct mlx5dv_steering_anchor *, mlx5dv_create_steering_anchor,
	(struct ibv_context *context, struct mlx5dv_steering_anchor_attr *attr),
	(context, attr), context)
SHMV_DV("MLX5_1.24", struct mlx5dv_crypto_login_obj *, mlx5dv_crypto_login_create,
	(struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *login_attr),
	(context, login_attr), context)
SHMV_DV("MLX5_1.24", int, mlx5dv_crypto_login_destroy,
	(struct mlx5dv_crypto_login_obj *crypto_login),
	(crypto_login), crypto_login)
SHMV_DV("MLX5_1.24", int, mlx5dv_crypto_login_query,
	(struct mlx5dv_crypto_login_obj *crypto_login,
	 struct mlx5dv_crypto_login_query_attr *query_attr),
	(crypto_login, query_attr), crypto_login)
SHMV_DV("MLX5_1.24", int, mlx5dv_destroy_steering_anchor,
	(struct mlx5dv_steering_anchor *sa),
	(sa), sa)
SHMV_DV("MLX5_1.24", struct mlx5dv_dr_action *, mlx5dv_dr_action_create_dest_root_table,
	(struct mlx5dv_dr_table *table, uint16_t priority),
	(table, priority), table)
