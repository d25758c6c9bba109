/* SPDX-License-Identifier: MIT */
/*
 * The non-default symbol versions of libibverbs.so.1:
 *
 *  - IBVERBS_1.0: the ABI of libibverbs before 1.1 (2007), whose structs
 *    (ibv_context_1_0, ibv_qp_1_0, ...) wrap the current ones. Binaries
 *    built against it are extinct; we do not emulate those wrappers. Under
 *    LD_PRELOAD the call is passed to the real libibverbs' 1.0 entry point
 *    (which wraps real objects), otherwise it fails with ENOSYS in the
 *    verb's convention and one message per process says why.
 *  - ibv_register_driver@IBVERBS_1.1: the pre-rdma-core driver
 *    registration, kept by rdma-core as a silent no-op for old providers.
 *
 * Each is a separate function bound to its versioned name with the symver
 * attribute; provider/libibverbs.map declares the version nodes. The
 * parameters are opaque where the 1.0 structs would appear.
 */
#include "abi.h"

#include "log.h"

#include <infiniband/verbs.h>

#include <atomic>

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

void explain_once(const char *name)
{
	static std::atomic<bool> said{false};
	if (!said.exchange(true))
		log_error("%s@IBVERBS_1.0: this program uses the libibverbs 1.0 ABI (before "
			  "2007), which shmverbs does not provide",
			  name);
}

} // namespace

#define SHMV_COMPAT_EXPORT(versioned)                                                    \
	extern "C" __attribute__((visibility("default"), symver(versioned)))

/* Defines name@IBVERBS_1.0: passed on to the real library when there is one,
 * otherwise `fallback` (a statement). */
#define SHMV_COMPAT_1_0(ret, name, params, args, fallback)                               \
	SHMV_COMPAT_EXPORT(#name "@IBVERBS_1.0") ret compat_1_0_##name params            \
	{                                                                                \
		using Fn = ret(*) params;                                                \
		static const Fn real = reinterpret_cast<Fn>(next_symbol(#name, "IBVERBS_1.0")); \
		if (real)                                                                \
			return real args;                                                \
		explain_once(#name);                                                     \
		fallback;                                                                \
	}

#define COMPAT_PTR(type, name, params, args)                                             \
	SHMV_COMPAT_1_0(type, name, params, args, errno = ENOSYS; return nullptr)
#define COMPAT_ERRNO(name, params, args) SHMV_COMPAT_1_0(int, name, params, args, return ENOSYS)
#define COMPAT_MINUS_ONE(name, params, args)                                             \
	SHMV_COMPAT_1_0(int, name, params, args, errno = ENOSYS; return -1)
#define COMPAT_VOID(name, params, args) SHMV_COMPAT_1_0(void, name, params, args, return)

/* Devices and contexts. */
COMPAT_PTR(void **, ibv_get_device_list, (int *num), (num))
COMPAT_VOID(ibv_free_device_list, (void **list), (list))
COMPAT_PTR(const char *, ibv_get_device_name, (void *device), (device))
SHMV_COMPAT_1_0(__be64, ibv_get_device_guid, (void *device), (device), errno = ENOSYS; return 0)
COMPAT_PTR(void *, ibv_open_device, (void *device), (device))
COMPAT_ERRNO(ibv_close_device, (void *context), (context))
COMPAT_MINUS_ONE(ibv_get_async_event, (void *context, struct ibv_async_event *event),
		 (context, event))
COMPAT_VOID(ibv_ack_async_event, (struct ibv_async_event * event), (event))
COMPAT_ERRNO(ibv_query_device, (void *context, struct ibv_device_attr *device_attr),
	     (context, device_attr))
COMPAT_ERRNO(ibv_query_port, (void *context, uint8_t port_num, struct ibv_port_attr *port_attr),
	     (context, port_num, port_attr))
COMPAT_MINUS_ONE(ibv_query_gid, (void *context, uint8_t port_num, int index, union ibv_gid *gid),
		 (context, port_num, index, gid))
COMPAT_MINUS_ONE(ibv_query_pkey, (void *context, uint8_t port_num, int index, __be16 *pkey),
		 (context, port_num, index, pkey))

/* PDs and MRs. */
COMPAT_PTR(void *, ibv_alloc_pd, (void *context), (context))
COMPAT_ERRNO(ibv_dealloc_pd, (void *pd), (pd))
COMPAT_PTR(void *, ibv_reg_mr, (void *pd, void *addr, size_t length, int access),
	   (pd, addr, length, access))
COMPAT_ERRNO(ibv_dereg_mr, (void *mr), (mr))

/* CQs and completion events. */
COMPAT_PTR(void *, ibv_create_cq,
	   (void *context, int cqe, void *cq_context, struct ibv_comp_channel *channel,
	    int comp_vector),
	   (context, cqe, cq_context, channel, comp_vector))
COMPAT_ERRNO(ibv_resize_cq, (void *cq, int cqe), (cq, cqe))
COMPAT_ERRNO(ibv_destroy_cq, (void *cq), (cq))
COMPAT_MINUS_ONE(ibv_get_cq_event, (struct ibv_comp_channel * channel, void **cq, void **cq_context),
		 (channel, cq, cq_context))
COMPAT_VOID(ibv_ack_cq_events, (void *cq, unsigned int nevents), (cq, nevents))

/* SRQs. */
COMPAT_PTR(void *, ibv_create_srq, (void *pd, struct ibv_srq_init_attr *srq_init_attr),
	   (pd, srq_init_attr))
COMPAT_ERRNO(ibv_modify_srq, (void *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask),
	     (srq, srq_attr, srq_attr_mask))
COMPAT_ERRNO(ibv_query_srq, (void *srq, struct ibv_srq_attr *srq_attr), (srq, srq_attr))
COMPAT_ERRNO(ibv_destroy_srq, (void *srq), (srq))

/* QPs, AHs and multicast. */
COMPAT_PTR(void *, ibv_create_qp, (void *pd, void *qp_init_attr), (pd, qp_init_attr))
COMPAT_ERRNO(ibv_query_qp, (void *qp, struct ibv_qp_attr *attr, int attr_mask, void *init_attr),
	     (qp, attr, attr_mask, init_attr))
COMPAT_ERRNO(ibv_modify_qp, (void *qp, struct ibv_qp_attr *attr, int attr_mask),
	     (qp, attr, attr_mask))
COMPAT_ERRNO(ibv_destroy_qp, (void *qp), (qp))
COMPAT_PTR(void *, ibv_create_ah, (void *pd, struct ibv_ah_attr *attr), (pd, attr))
COMPAT_ERRNO(ibv_destroy_ah, (void *ah), (ah))
COMPAT_ERRNO(ibv_attach_mcast, (void *qp, union ibv_gid *gid, uint16_t lid), (qp, gid, lid))
COMPAT_ERRNO(ibv_detach_mcast, (void *qp, union ibv_gid *gid, uint16_t lid), (qp, gid, lid))

/* Old-style provider registration: accepted and ignored, as rdma-core does
 * (old usnic providers call it only to silence a warning). */
SHMV_COMPAT_EXPORT("ibv_register_driver@IBVERBS_1.1") void
compat_1_1_ibv_register_driver(const char *name, void *init_func)
{
	(void)init_func;
	log_debug("ibv_register_driver(%s) ignored: providers are not loaded", name ? name : "");
}
