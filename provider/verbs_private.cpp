/* SPDX-License-Identifier: MIT */
/*
 * IBVERBS_PRIVATE_34: the interface between rdma-core's libibverbs and its
 * providers (libmlx5, libefa, ...). Applications never call it; it is
 * exported so that the real provider libraries and librdmacm load against
 * our libibverbs.so.1, and so that the LD_PRELOAD library stays out of the
 * way of a real provider:
 *
 *  - Under LD_PRELOAD, a real provider loaded by the real libibverbs binds
 *    these names to us (we come first in the lookup order). Every entry
 *    therefore passes the call on, unchanged, to the real libibverbs.
 *  - As the drop-in libibverbs.so.1 there is nothing to pass on to. We never
 *    load provider plugins, so nothing legitimate calls these: they fail
 *    (EOPNOTSUPP in the convention of each) or do nothing.
 *
 * The parameters are declared in our own words: rdma-core's private structs
 * (verbs_qp, ibv_command_buffer, the kern-abi command structs, ...) are
 * opaque pointers here. Only the calling convention matters for passing a
 * call on, and every parameter is a pointer or an integer.
 */
#include "abi.h"

#include "fork.h"
#include "log.h"

#include <infiniband/verbs.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

constexpr const char *private_version = "IBVERBS_PRIVATE_34";

/* The failure of an entry with no real library behind it. */
int unavailable(const char *name)
{
	log_debug("%s: provider interface called without a real libibverbs", name);
	return EOPNOTSUPP;
}

} // namespace

/* Defines an entry that passes the call to the real libibverbs when there is
 * one, and otherwise runs `fallback` (a statement). */
#define SHMV_PRIVATE(ret, name, params, args, fallback)                                  \
	SHMV_EXPORT ret name params                                                     \
	{                                                                                \
		using Fn = ret(*) params;                                                \
		static const Fn real =                                                   \
			reinterpret_cast<Fn>(next_symbol(#name, private_version));       \
		if (real)                                                                \
			return real args;                                                \
		fallback;                                                                \
	}

/* Entries returning an errno. */
#define SHMV_PRIVATE_ERRNO(name, params, args)                                           \
	SHMV_PRIVATE(int, name, params, args, return unavailable(#name))

/* ---------------------------------------------------------------------------
 * Provider registration and context set-up.
 */

SHMV_PRIVATE(void, verbs_register_driver_34, (const void *ops), (ops),
	     log_debug("a real provider registered itself; shmverbs does not load providers"))

SHMV_PRIVATE(void *, _verbs_init_and_alloc_context,
	     (struct ibv_device * device, int cmd_fd, size_t alloc_size, void *context_offset,
	      uint32_t driver_id),
	     (device, cmd_fd, alloc_size, context_offset, driver_id),
	     errno = unavailable("_verbs_init_and_alloc_context");
	     return nullptr)

SHMV_PRIVATE(struct ibv_context *, verbs_open_device,
	     (struct ibv_device * device, void *private_data), (device, private_data),
	     errno = unavailable("verbs_open_device");
	     return nullptr)

SHMV_PRIVATE(void, verbs_uninit_context, (struct verbs_context * context), (context), return)
SHMV_PRIVATE(void, verbs_set_ops, (struct verbs_context * vctx, const void *ops), (vctx, ops),
	     return)
SHMV_PRIVATE(void, verbs_init_cq,
	     (struct ibv_cq * cq, struct ibv_context *context, struct ibv_comp_channel *channel,
	      void *cq_context),
	     (cq, context, channel, cq_context), return)

/* Whether destroying objects of a disassociated device is allowed. A data
 * symbol: a real provider reads ours under LD_PRELOAD, so it is set the way
 * the real libibverbs sets its own. */
extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy =
	env_flag("RDMAV_ALLOW_DISASSOC_DESTROY") || env_flag("MLX4_DEVICE_FATAL_CLEANUP");
}

/* ---------------------------------------------------------------------------
 * The ioctl command path.
 */

SHMV_PRIVATE(unsigned int, __ioctl_final_num_attrs, (unsigned int num_attrs, void *link),
	     (num_attrs, link), return num_attrs)
SHMV_PRIVATE_ERRNO(execute_ioctl, (struct ibv_context * context, void *cmd), (context, cmd))

/* ---------------------------------------------------------------------------
 * Context, device and port commands.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_get_context,
		   (struct verbs_context * context, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (context, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_context, (struct ibv_context * ctx, void *driver), (ctx, driver))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_device_any,
		   (struct ibv_context * context, const struct ibv_query_device_ex_input *input,
		    struct ibv_device_attr_ex *attr, size_t attr_size, void *resp,
		    size_t *resp_size),
		   (context, input, attr, attr_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_port,
		   (struct ibv_context * context, uint8_t port_num, struct ibv_port_attr *port_attr,
		    void *cmd, size_t cmd_size),
		   (context, port_num, port_attr, cmd, cmd_size))

/* ---------------------------------------------------------------------------
 * PD, XRCD, MR, MW, DM.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_alloc_pd,
		   (struct ibv_context * context, struct ibv_pd *pd, void *cmd, size_t cmd_size,
		    void *resp, size_t resp_size),
		   (context, pd, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_dealloc_pd, (struct ibv_pd * pd), (pd))
SHMV_PRIVATE_ERRNO(ibv_cmd_open_xrcd,
		   (struct ibv_context * context, void *xrcd, int vxrcd_size,
		    struct ibv_xrcd_init_attr *attr, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (context, xrcd, vxrcd_size, attr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_close_xrcd, (void *xrcd), (xrcd))
SHMV_PRIVATE_ERRNO(ibv_cmd_reg_mr,
		   (struct ibv_pd * pd, void *addr, size_t length, uint64_t hca_va, int access,
		    void *vmr, void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (pd, addr, length, hca_va, access, vmr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_rereg_mr,
		   (void *vmr, uint32_t flags, void *addr, size_t length, uint64_t hca_va,
		    int access, struct ibv_pd *pd, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (vmr, flags, addr, length, hca_va, access, pd, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_dereg_mr, (void *vmr), (vmr))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_mr, (struct ibv_pd * pd, void *vmr, uint32_t mr_handle),
		   (pd, vmr, mr_handle))
SHMV_PRIVATE_ERRNO(ibv_cmd_advise_mr,
		   (struct ibv_pd * pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		    struct ibv_sge *sg_list, uint32_t num_sge),
		   (pd, advice, flags, sg_list, num_sge))
SHMV_PRIVATE_ERRNO(ibv_cmd_reg_dmabuf_mr,
		   (struct ibv_pd * pd, uint64_t offset, size_t length, uint64_t iova, int fd,
		    int access, void *vmr),
		   (pd, offset, length, iova, fd, access, vmr))
SHMV_PRIVATE_ERRNO(ibv_cmd_alloc_mw,
		   (struct ibv_pd * pd, enum ibv_mw_type type, struct ibv_mw *mw, void *cmd,
		    size_t cmd_size, void *resp, size_t resp_size),
		   (pd, type, mw, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_dealloc_mw, (struct ibv_mw * mw), (mw))
SHMV_PRIVATE_ERRNO(ibv_cmd_alloc_dm,
		   (struct ibv_context * ctx, const struct ibv_alloc_dm_attr *dm_attr, void *dm,
		    void *link),
		   (ctx, dm_attr, dm, link))
SHMV_PRIVATE_ERRNO(ibv_cmd_free_dm, (void *dm), (dm))
SHMV_PRIVATE_ERRNO(ibv_cmd_reg_dm_mr,
		   (struct ibv_pd * pd, void *dm, uint64_t offset, size_t length,
		    unsigned int access, void *vmr, void *link),
		   (pd, dm, offset, length, access, vmr, link))

/* ---------------------------------------------------------------------------
 * CQ.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_create_cq,
		   (struct ibv_context * context, int cqe, struct ibv_comp_channel *channel,
		    int comp_vector, struct ibv_cq *cq, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (context, cqe, channel, comp_vector, cq, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_cq_ex,
		   (struct ibv_context * context, const struct ibv_cq_init_attr_ex *cq_attr,
		    void *cq, void *cmd, size_t cmd_size, void *resp, size_t resp_size,
		    uint32_t cmd_flags),
		   (context, cq_attr, cq, cmd, cmd_size, resp, resp_size, cmd_flags))
/* Polls through the kernel: the number of completions, or -1. */
SHMV_PRIVATE(int, ibv_cmd_poll_cq, (struct ibv_cq * cq, int ne, struct ibv_wc *wc), (cq, ne, wc),
	     errno = unavailable("ibv_cmd_poll_cq");
	     return -1)
SHMV_PRIVATE_ERRNO(ibv_cmd_req_notify_cq, (struct ibv_cq * cq, int solicited_only),
		   (cq, solicited_only))
SHMV_PRIVATE_ERRNO(ibv_cmd_resize_cq,
		   (struct ibv_cq * cq, int cqe, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (cq, cqe, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_cq, (struct ibv_cq * cq), (cq))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_cq,
		   (struct ibv_cq * cq, struct ibv_modify_cq_attr *attr, void *cmd,
		    size_t cmd_size),
		   (cq, attr, cmd, cmd_size))

/* ---------------------------------------------------------------------------
 * SRQ.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_create_srq,
		   (struct ibv_pd * pd, struct ibv_srq *srq, struct ibv_srq_init_attr *attr,
		    void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (pd, srq, attr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_srq_ex,
		   (struct ibv_context * context, void *srq, struct ibv_srq_init_attr_ex *attr_ex,
		    void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (context, srq, attr_ex, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_srq,
		   (struct ibv_srq * srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask,
		    void *cmd, size_t cmd_size),
		   (srq, srq_attr, srq_attr_mask, cmd, cmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_srq,
		   (struct ibv_srq * srq, struct ibv_srq_attr *srq_attr, void *cmd,
		    size_t cmd_size),
		   (srq, srq_attr, cmd, cmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_srq, (struct ibv_srq * srq), (srq))
SHMV_PRIVATE_ERRNO(ibv_cmd_post_srq_recv,
		   (struct ibv_srq * srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr),
		   (srq, wr, bad_wr))

/* ---------------------------------------------------------------------------
 * QP and AH.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_create_qp,
		   (struct ibv_pd * pd, struct ibv_qp *qp, struct ibv_qp_init_attr *attr,
		    void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (pd, qp, attr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_qp_ex,
		   (struct ibv_context * context, void *qp, struct ibv_qp_init_attr_ex *attr_ex,
		    void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (context, qp, attr_ex, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_qp_ex2,
		   (struct ibv_context * context, void *qp, struct ibv_qp_init_attr_ex *qp_attr,
		    void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (context, qp, qp_attr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_open_qp,
		   (struct ibv_context * context, void *qp, int vqp_sz,
		    struct ibv_qp_open_attr *attr, void *cmd, size_t cmd_size, void *resp,
		    size_t resp_size),
		   (context, qp, vqp_sz, attr, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_query_qp,
		   (struct ibv_qp * qp, struct ibv_qp_attr *qp_attr, int attr_mask,
		    struct ibv_qp_init_attr *qp_init_attr, void *cmd, size_t cmd_size),
		   (qp, qp_attr, attr_mask, qp_init_attr, cmd, cmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_qp,
		   (struct ibv_qp * qp, struct ibv_qp_attr *attr, int attr_mask, void *cmd,
		    size_t cmd_size),
		   (qp, attr, attr_mask, cmd, cmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_qp_ex,
		   (struct ibv_qp * qp, struct ibv_qp_attr *attr, int attr_mask, void *cmd,
		    size_t cmd_size, void *resp, size_t resp_size),
		   (qp, attr, attr_mask, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_qp, (struct ibv_qp * qp), (qp))
SHMV_PRIVATE_ERRNO(ibv_cmd_post_send,
		   (struct ibv_qp * ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr),
		   (ibqp, wr, bad_wr))
SHMV_PRIVATE_ERRNO(ibv_cmd_post_recv,
		   (struct ibv_qp * ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr),
		   (ibqp, wr, bad_wr))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_ah,
		   (struct ibv_pd * pd, struct ibv_ah *ah, struct ibv_ah_attr *attr, void *resp,
		    size_t resp_size),
		   (pd, ah, attr, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_ah, (struct ibv_ah * ah), (ah))
SHMV_PRIVATE_ERRNO(ibv_cmd_attach_mcast,
		   (struct ibv_qp * qp, const union ibv_gid *gid, uint16_t lid), (qp, gid, lid))
SHMV_PRIVATE_ERRNO(ibv_cmd_detach_mcast,
		   (struct ibv_qp * qp, const union ibv_gid *gid, uint16_t lid), (qp, gid, lid))

/* ---------------------------------------------------------------------------
 * Flows, WQs, RSS tables, counters, flow actions.
 */

SHMV_PRIVATE_ERRNO(ibv_cmd_create_flow,
		   (struct ibv_qp * qp, struct ibv_flow *flow_id, struct ibv_flow_attr *flow_attr,
		    void *ucmd, size_t ucmd_size),
		   (qp, flow_id, flow_attr, ucmd, ucmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_flow, (struct ibv_flow * flow_id), (flow_id))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_wq,
		   (struct ibv_context * context, struct ibv_wq_init_attr *wq_init_attr,
		    struct ibv_wq *wq, void *cmd, size_t cmd_size, void *resp, size_t resp_size),
		   (context, wq_init_attr, wq, cmd, cmd_size, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_wq,
		   (struct ibv_wq * wq, struct ibv_wq_attr *attr, void *cmd, size_t cmd_size),
		   (wq, attr, cmd, cmd_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_wq, (struct ibv_wq * wq), (wq))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_rwq_ind_table,
		   (struct ibv_context * context, struct ibv_rwq_ind_table_init_attr *init_attr,
		    struct ibv_rwq_ind_table *rwq_ind_table, void *resp, size_t resp_size),
		   (context, init_attr, rwq_ind_table, resp, resp_size))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_rwq_ind_table, (struct ibv_rwq_ind_table * rwq_ind_table),
		   (rwq_ind_table))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_counters,
		   (struct ibv_context * context, struct ibv_counters_init_attr *init_attr,
		    void *vcounters, void *link),
		   (context, init_attr, vcounters, link))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_counters, (void *vcounters), (vcounters))
SHMV_PRIVATE_ERRNO(ibv_cmd_read_counters,
		   (void *vcounters, uint64_t *counters_value, uint32_t ncounters, uint32_t flags,
		    void *link),
		   (vcounters, counters_value, ncounters, flags, link))
SHMV_PRIVATE_ERRNO(ibv_cmd_create_flow_action_esp,
		   (struct ibv_context * ctx, struct ibv_flow_action_esp_attr *attr,
		    void *flow_action, void *driver),
		   (ctx, attr, flow_action, driver))
SHMV_PRIVATE_ERRNO(ibv_cmd_modify_flow_action_esp,
		   (void *flow_action, struct ibv_flow_action_esp_attr *attr, void *driver),
		   (flow_action, attr, driver))
SHMV_PRIVATE_ERRNO(ibv_cmd_destroy_flow_action, (void *action), (action))

/* ---------------------------------------------------------------------------
 * The two variadic entries cannot be passed on as they are.
 */

namespace {

/* rdma-core's logging set-up: VERBS_LOG_LEVEL (0 = off) and VERBS_LOG_FILE;
 * without a file a release build logs nothing. */
struct VerbsLog {
	unsigned long level = 0;
	FILE *fp = nullptr;

	VerbsLog()
	{
		if (const char *env = std::getenv("VERBS_LOG_LEVEL"))
			level = std::strtoul(env, nullptr, 0);
		if (!level)
			return;
		if (const char *file = std::getenv("VERBS_LOG_FILE"))
			fp = std::fopen(file, "a+e");
		if (!fp)
			level = 0;
	}
};

} // namespace

/* Providers' diagnostics. Formatted here rather than passed on (there is no
 * va_list variant to pass to), honouring the same environment. */
SHMV_EXPORT __attribute__((format(printf, 3, 4))) void
__verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...)
{
	(void)ctx;
	static VerbsLog log;
	if (!log.fp || level > log.level || !fmt)
		return;
	int saved = errno;
	va_list args;
	va_start(args, fmt);
	std::vfprintf(log.fp, fmt, args);
	va_end(args);
	errno = saved;
}

/* Reads a file below a device's sysfs directory. Only a real provider has
 * the device record this takes; the path is formatted here and handed to the
 * real libibverbs as a plain string. */
SHMV_EXPORT __attribute__((format(printf, 4, 5))) int
ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...)
{
	using Fn = int (*)(char *, size_t, void *, const char *, ...);
	static const Fn real =
		reinterpret_cast<Fn>(next_symbol("ibv_read_ibdev_sysfs_file", private_version));
	if (!real || !sysfs_dev || !fnfmt) {
		errno = EINVAL;
		return -1;
	}
	char *path = nullptr;
	va_list args;
	va_start(args, fnfmt);
	int n = vasprintf(&path, fnfmt, args);
	va_end(args);
	if (n < 0)
		return -1;
	int ret = real(buf, size, sysfs_dev, "%s", path);
	int saved = errno;
	std::free(path);
	errno = saved;
	return ret;
}
