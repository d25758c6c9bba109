/* SPDX-License-Identifier: MIT */
/*
 * Device discovery, open/close, device and port queries, GID and P_Key
 * tables, asynchronous events. Return conventions follow rdma-core 44's
 * libibverbs verb by verb (some return -1 with errno, most a positive errno).
 */
#include "abi.h"
#include "ops.h"

#include "context.h"
#include "device.h"
#include "fork.h"

#include <infiniband/verbs.h>

#include <cstdlib>
#include <cstring>

/* verbs.h wraps these in inline helpers; we define the real entry points. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_query_gid_ex
#undef ibv_query_gid_table

using namespace shmverbs;
using namespace shmverbs::abi;

/* ibv_query_gid_type()'s result type lives in rdma-core's private driver.h. */
enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

namespace {

int ctx_query_port(struct ibv_context *ctx, uint8_t port_num, struct ibv_port_attr *attr,
		   size_t attr_len)
{
	Context *c = to_context(ctx);
	return c ? query_port(*c, port_num, attr, attr_len) : EINVAL;
}

int ctx_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t attr_size)
{
	Context *c = to_context(ctx);
	return c ? query_device_ex(*c, input, attr, attr_size) : EINVAL;
}

int ctx_compat_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	Context *c = to_context(ctx);
	if (!c || !attr)
		return EINVAL;
	return query_device(*c, *attr);
}

int ctx_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *values)
{
	if (!to_context(ctx) || !values)
		return EINVAL;
	if (values->comp_mask & ~uint32_t(IBV_VALUES_MASK_RAW_CLOCK))
		return EINVAL;
	if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
		/* The raw clock is CLOCK_MONOTONIC in ns (hca_core_clock 1
		 * GHz), all of it in tv_nsec as libmlx5 puts its cycle count
		 * (mlx5_query_rt_values: tv_sec 0): comparable with the
		 * completions' timestamps. */
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		values->raw_clock.tv_sec = 0;
		values->raw_clock.tv_nsec = long(now.tv_sec) * 1000000000l + now.tv_nsec;
	}
	return 0;
}

} // namespace

namespace shmverbs::abi {

void install_device_ops(struct verbs_context &v)
{
	v.context.ops._compat_query_device = ctx_compat_query_device;
	v.query_port = ctx_query_port;
	v.query_device_ex = ctx_query_device_ex;
	v.query_rt_values = ctx_query_rt_values;
}

} // namespace shmverbs::abi

SHMV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	return guard_ptr([&]() -> struct ibv_device ** {
		apply_fork_env(); /* rdma-core's ibverbs_init() */
		const auto &list = devices();
		/* Never NULL for "no device": programs treat NULL as a hard
		 * error and an empty list as "skip". */
		auto **out = static_cast<struct ibv_device **>(
			std::calloc(list.size() + 1, sizeof(struct ibv_device *)));
		if (!out)
			return fail_ptr<struct ibv_device *>(ENOMEM);
		for (size_t i = 0; i < list.size(); i++)
			out[i] = &list[i]->ibv;
		if (num_devices)
			*num_devices = static_cast<int>(list.size());
		return out;
	});
}

SHMV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	std::free(list);
}

SHMV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	if (!device)
		return fail_ptr<const char>(EINVAL);
	if (!to_device(device))
		SHMV_FORWARD_PTR(ibv_get_device_name, "IBVERBS_1.1", device);
	return device->name;
}

SHMV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	Device *d = to_device(device);
	if (!d) {
		if (device)
			if (auto fp = SHMV_NEXT(ibv_get_device_guid, "IBVERBS_1.1"))
				return fp(device);
		errno = EINVAL;
		return 0;
	}
	return htobe64(d->node_guid);
}

SHMV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	Device *d = to_device(device);
	if (!d) {
		if (device)
			if (auto fp = SHMV_NEXT(ibv_get_device_index, "IBVERBS_1.9"))
				return fp(device);
		return -1;
	}
	return static_cast<int>(d->index);
}

SHMV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (!device)
		return fail_ptr<struct ibv_context>(EINVAL);
	Device *d = to_device(device);
	if (!d)
		SHMV_FORWARD_PTR(ibv_open_device, "IBVERBS_1.1", device);
	return guard_ptr([&]() -> struct ibv_context * {
		Result<Context> ctx = open_context(*d);
		if (ctx)
			install_ops(ctx->vctx);
		return to_ptr(ctx);
	});
}

SHMV_EXPORT int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	Context *c = to_context(context);
	/* libibverbs' ibv_close_device returns 0 whatever happens; a child's
	 * copy of its parent's context is left alone. */
	if (!c && inherited_context_refused())
		return 0;
	if (!c)
		SHMV_FORWARD_INT(ibv_close_device, "IBVERBS_1.1", context);
	return close_context(*c);
}

SHMV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	if (!context || !attr)
		return EINVAL;
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_INT(ibv_query_device, "IBVERBS_1.1", context, attr);
	return query_device(*c, *attr);
}

/* The exported symbol takes rdma-core's older _compat_ibv_port_attr, a prefix
 * of struct ibv_port_attr up to and including flags. */
SHMV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			       struct _compat_ibv_port_attr *attr)
{
	if (!context || !attr)
		return EINVAL;
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_INT(ibv_query_port, "IBVERBS_1.1", context, port_num, attr);
	return query_port(*c, port_num, reinterpret_cast<struct ibv_port_attr *>(attr),
			  offsetof(struct ibv_port_attr, flags) + sizeof(ibv_port_attr::flags));
}

SHMV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
			      union ibv_gid *gid)
{
	if (!context || !gid) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_NEG1(ibv_query_gid, "IBVERBS_1.1", context, port_num, index, gid);
	if (int err = query_gid(*c, port_num, index, *gid)) {
		errno = err;
		return -1;
	}
	return 0;
}

SHMV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
				  uint32_t gid_index, struct ibv_gid_entry *entry,
				  uint32_t flags, size_t entry_size)
{
	if (!context)
		return EINVAL;
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_INT(_ibv_query_gid_ex, "IBVERBS_1.11", context, port_num, gid_index,
				 entry, flags, entry_size);
	return query_gid_ex(*c, port_num, gid_index, entry, flags, entry_size);
}

SHMV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
					 struct ibv_gid_entry *entries, size_t max_entries,
					 uint32_t flags, size_t entry_size)
{
	if (!context)
		return -EINVAL;
	Context *c = to_context(context);
	if (!c) {
		if (auto fp = SHMV_NEXT(_ibv_query_gid_table, "IBVERBS_1.11"))
			return fp(context, entries, max_entries, flags, entry_size);
		return -EINVAL;
	}
	return query_gid_table(*c, entries, max_entries, flags, entry_size);
}

SHMV_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
				   unsigned int index, enum ibv_gid_type_sysfs *type)
{
	if (!context || !type) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c) {
		using Fn = int (*)(struct ibv_context *, uint8_t, unsigned, enum ibv_gid_type_sysfs *);
		if (auto fp = reinterpret_cast<Fn>(next_symbol("ibv_query_gid_type",
							       "IBVERBS_PRIVATE_34")))
			return fp(context, port_num, index, type);
		errno = EINVAL;
		return -1;
	}
	enum ibv_gid_type t;
	if (int err = query_gid_type(*c, port_num, index, t)) {
		errno = err;
		return -1;
	}
	*type = t == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2
					  : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

SHMV_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
			       __be16 *pkey)
{
	if (!context || !pkey) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_NEG1(ibv_query_pkey, "IBVERBS_1.1", context, port_num, index, pkey);
	if (int err = query_pkey(*c, port_num, index, *pkey)) {
		errno = err;
		return -1;
	}
	return 0;
}

SHMV_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	if (!context) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c) {
		if (auto fp = SHMV_NEXT(ibv_get_pkey_index, "IBVERBS_1.5"))
			return fp(context, port_num, pkey);
		errno = EINVAL;
		return -1;
	}
	/* -1 and errno, as ibv_query_pkey() failing gives it (man page:
	 * "-1 on error"). */
	const int index = get_pkey_index(*c, port_num, pkey);
	if (index < 0) {
		errno = -index;
		return -1;
	}
	return index;
}

SHMV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_NEG1(ibv_get_async_event, "IBVERBS_1.1", context, event);
	if (int err = c->get_async_event(*event)) {
		errno = err;
		return -1;
	}
	return 0;
}

SHMV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	if (!event || ack_async_event(*event))
		return;
	if (auto fp = SHMV_NEXT(ibv_ack_async_event, "IBVERBS_1.1"))
		fp(event);
}

SHMV_EXPORT const char *shmverbs_version(void)
{
	return SHMVERBS_VERSION_STRING;
}

SHMV_EXPORT int shmverbs_is_emulated(struct ibv_context *context)
{
	return to_context(context) != nullptr;
}
