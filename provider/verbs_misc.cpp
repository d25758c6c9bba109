/* SPDX-License-Identifier: MIT */
/*
 * The exported helpers of libibverbs that belong to no object family:
 * enum-to-string, rate conversions, fork protection, sysfs access, the
 * kernel-ABI struct conversions, L2 address resolution, object import, ECE,
 * dma-buf registration and the in-order data query. Return conventions follow
 * rdma-core 44 verb by verb; where rdma-core would dereference a NULL
 * argument we fail instead (EINVAL in the verb's convention).
 */
#include "abi.h"

#include "context.h"
#include "device.h"
#include "ethaddr.h"
#include "fork.h"
#include "log.h"

#include <fcntl.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace shmverbs;
using namespace shmverbs::abi;

/* ---------------------------------------------------------------------------
 * Enum strings. The texts are part of the observable behaviour (programs
 * print them, test suites compare them), so they are rdma-core 44's, word for
 * word; anything out of range is "unknown".
 */

SHMV_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	switch (node_type) {
	case IBV_NODE_CA: return "InfiniBand channel adapter";
	case IBV_NODE_SWITCH: return "InfiniBand switch";
	case IBV_NODE_ROUTER: return "InfiniBand router";
	case IBV_NODE_RNIC: return "iWARP NIC";
	case IBV_NODE_USNIC: return "usNIC";
	case IBV_NODE_USNIC_UDP: return "usNIC UDP";
	case IBV_NODE_UNSPECIFIED: return "unspecified";
	default: return "unknown";
	}
}

SHMV_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	switch (port_state) {
	case IBV_PORT_NOP: return "no state change (NOP)";
	case IBV_PORT_DOWN: return "down";
	case IBV_PORT_INIT: return "init";
	case IBV_PORT_ARMED: return "armed";
	case IBV_PORT_ACTIVE: return "active";
	case IBV_PORT_ACTIVE_DEFER: return "active defer";
	default: return "unknown";
	}
}

SHMV_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	switch (event) {
	case IBV_EVENT_CQ_ERR: return "CQ error";
	case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
	case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
	case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
	case IBV_EVENT_COMM_EST: return "communication established";
	case IBV_EVENT_SQ_DRAINED: return "send queue drained";
	case IBV_EVENT_PATH_MIG: return "path migrated";
	case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
	case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
	case IBV_EVENT_PORT_ACTIVE: return "port active";
	case IBV_EVENT_PORT_ERR: return "port error";
	case IBV_EVENT_LID_CHANGE: return "LID change";
	case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
	case IBV_EVENT_SM_CHANGE: return "SM change";
	case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
	case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
	case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
	case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
	case IBV_EVENT_GID_CHANGE: return "GID table change";
	case IBV_EVENT_WQ_FATAL: return "WQ fatal";
	default: return "unknown";
	}
}

SHMV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_SUCCESS: return "success";
	case IBV_WC_LOC_LEN_ERR: return "local length error";
	case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
	case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
	case IBV_WC_LOC_PROT_ERR: return "local protection error";
	case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
	case IBV_WC_MW_BIND_ERR: return "memory management operation error";
	case IBV_WC_BAD_RESP_ERR: return "bad response error";
	case IBV_WC_LOC_ACCESS_ERR: return "local access error";
	case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
	case IBV_WC_REM_ACCESS_ERR: return "remote access error";
	case IBV_WC_REM_OP_ERR: return "remote operation error";
	case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
	case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
	case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
	case IBV_WC_REM_ABORT_ERR: return "aborted error";
	case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
	case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
	case IBV_WC_FATAL_ERR: return "fatal error";
	case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
	case IBV_WC_GENERAL_ERR: return "general error";
	case IBV_WC_TM_ERR: return "TM error";
	case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
	default: return "unknown";
	}
}

/* ---------------------------------------------------------------------------
 * Static rates. One table holds each rate's multiple of 2.5 Gb/s (0 for the
 * rates that are not a multiple, the FDR/EDR/HDR encodings) and its exact
 * signalling rate in Mb/s; every conversion reads it. Unknown inputs give -1
 * or IBV_RATE_MAX, as in rdma-core.
 */
namespace {

struct RateInfo {
	enum ibv_rate rate;
	int mult;
	int mbps;
};

constexpr RateInfo rate_table[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500},	  {IBV_RATE_5_GBPS, 2, 5000},
	{IBV_RATE_10_GBPS, 4, 10000},	  {IBV_RATE_20_GBPS, 8, 20000},
	{IBV_RATE_30_GBPS, 12, 30000},	  {IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000},	  {IBV_RATE_80_GBPS, 32, 80000},
	{IBV_RATE_120_GBPS, 48, 120000},  {IBV_RATE_14_GBPS, 0, 14062},
	{IBV_RATE_56_GBPS, 0, 56250},	  {IBV_RATE_112_GBPS, 0, 112500},
	{IBV_RATE_168_GBPS, 0, 168750},	  {IBV_RATE_25_GBPS, 0, 25781},
	{IBV_RATE_100_GBPS, 0, 103125},	  {IBV_RATE_200_GBPS, 0, 206250},
	{IBV_RATE_300_GBPS, 0, 309375},	  {IBV_RATE_28_GBPS, 11, 28125},
	{IBV_RATE_50_GBPS, 20, 53125},	  {IBV_RATE_400_GBPS, 160, 425000},
	{IBV_RATE_600_GBPS, 240, 637500}, {IBV_RATE_800_GBPS, 320, 850000},
	{IBV_RATE_1200_GBPS, 480, 1275000},
};

const RateInfo *find_rate(enum ibv_rate rate)
{
	for (const RateInfo &r : rate_table)
		if (r.rate == rate)
			return &r;
	return nullptr;
}

} // namespace

SHMV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	const RateInfo *r = find_rate(rate);
	return r && r->mult ? r->mult : -1;
}

SHMV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (const RateInfo &r : rate_table)
		if (r.mult && r.mult == mult)
			return r.rate;
	return IBV_RATE_MAX;
}

SHMV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	const RateInfo *r = find_rate(rate);
	return r ? r->mbps : -1;
}

SHMV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (const RateInfo &r : rate_table)
		if (r.mbps == mbps)
			return r.rate;
	return IBV_RATE_MAX;
}

/* ---------------------------------------------------------------------------
 * fork() protection (lib/fork.h): one process-wide set of counted ranges,
 * like rdma-core's. Under LD_PRELOAD these exports also serve the real
 * libibverbs and its providers (they resolve to us), so the counts cover
 * the real device's registrations too.
 */

SHMV_EXPORT int ibv_fork_init(void)
{
	return guard_int([] {
		return process_fork_ranges().init(std::getenv("RDMAV_HUGEPAGES_SAFE") != nullptr);
	});
}

/* The emulation reaches registered memory through virtual addresses, so a
 * fork never detaches a buffer from its MR: protection is not needed, which
 * is what rdma-core 44 reports on a kernel with copy-on-fork for pinned
 * pages (Debian 12's 6.1). */
SHMV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

SHMV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	return guard_int([&] { return process_fork_ranges().dontfork(base, size); });
}

SHMV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	return guard_int([&] { return process_fork_ranges().dofork(base, size); });
}

/* ---------------------------------------------------------------------------
 * sysfs. The emulated devices have no sysfs directory; these two helpers
 * are generic file access (librdmacm reads the rdma_cm ABI version with
 * them) and behave as rdma-core's: the sysfs root is $SYSFS_PATH without
 * trailing slashes, or /sys; a missing file reads as -1 with errno.
 */

SHMV_EXPORT const char *ibv_get_sysfs_path(void)
{
	static const std::string path = [] {
		const char *env = std::getenv("SYSFS_PATH");
		if (!env)
			return std::string("/sys");
		std::string p(env, strnlen(env, IBV_SYSFS_PATH_MAX));
		while (!p.empty() && p.back() == '/')
			p.pop_back();
		return p;
	}();
	return path.c_str();
}

SHMV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	if (!dir || !file || (!buf && size)) {
		errno = EINVAL;
		return -1;
	}
	std::string path = std::string(dir) + "/" + file;
	int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t len = ::read(fd, buf, size);
	int err = errno;
	::close(fd);
	if (len < 0) {
		errno = err;
		return -1;
	}
	if (len > 0) {
		/* The result is a C string without the trailing newline; a file
		 * that fills the buffer exactly cannot be terminated: fail. */
		if (buf[len - 1] == '\n')
			buf[--len] = '\0';
		else if (size_t(len) < size)
			buf[len] = '\0';
		else
			return -1;
	}
	return static_cast<int>(len);
}

/* ---------------------------------------------------------------------------
 * Kernel ABI conversions (<rdma/ib_user_verbs.h>, <rdma/ib_user_sa.h>).
 * Field by field copies. Like rdma-core, ibv_copy_qp_attr_from_kern leaves
 * qp_state untouched (only cur_qp_state is copied), and multi-byte fields
 * keep their byte order.
 */

SHMV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
					    struct ib_uverbs_ah_attr *src)
{
	if (!dst || !src)
		return;
	std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

SHMV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst,
					    struct ib_uverbs_qp_attr *src)
{
	if (!dst || !src)
		return;
	dst->cur_qp_state = static_cast<enum ibv_qp_state>(src->cur_qp_state);
	dst->path_mtu = static_cast<enum ibv_mtu>(src->path_mtu);
	dst->path_mig_state = static_cast<enum ibv_mig_state>(src->path_mig_state);
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = static_cast<int>(src->qp_access_flags);

	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;

	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

namespace {

/* The path record fields are the same in both structs, in both directions. */
template <typename Dst, typename Src>
void copy_path_rec_fields(Dst &d, const Src &s)
{
	d.dlid = s.dlid;
	d.slid = s.slid;
	d.raw_traffic = s.raw_traffic;
	d.flow_label = s.flow_label;
	d.hop_limit = s.hop_limit;
	d.traffic_class = s.traffic_class;
	d.reversible = s.reversible;
	d.numb_path = s.numb_path;
	d.pkey = s.pkey;
	d.sl = s.sl;
	d.mtu_selector = s.mtu_selector;
	d.mtu = static_cast<decltype(d.mtu)>(s.mtu);
	d.rate_selector = s.rate_selector;
	d.rate = s.rate;
	d.packet_life_time = s.packet_life_time;
	d.preference = s.preference;
	d.packet_life_time_selector = s.packet_life_time_selector;
}

} // namespace

SHMV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
					     struct ib_user_path_rec *src)
{
	if (!dst || !src)
		return;
	std::memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
	std::memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
	copy_path_rec_fields(*dst, *src);
}

SHMV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst,
					   struct ibv_sa_path_rec *src)
{
	if (!dst || !src)
		return;
	std::memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	std::memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	copy_path_rec_fields(*dst, *src);
}

/* ---------------------------------------------------------------------------
 * L2 resolution for RoCE (lib/ethaddr.h). Returns 0, -1 when the source GID
 * cannot be read, or a negative errno, as rdma-core does.
 */
SHMV_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
					    uint8_t eth_mac[ETHERNET_LL_SIZE], uint16_t *vid)
{
	if (!context || !attr || !eth_mac)
		return -EINVAL;
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_INT(ibv_resolve_eth_l2_from_gid, "IBVERBS_1.1", context, attr, eth_mac,
				 vid);
	union ibv_gid sgid;
	if (ibv_query_gid(context, attr->port_num, attr->grh.sgid_index, &sgid))
		return -1;
	return -guard_int([&] {
		MacAddress mac;
		uint16_t vlan;
		int err = resolve_eth_l2(*c, attr->port_num, sgid, attr->grh.dgid, mac, vlan);
		if (err)
			return err;
		std::memcpy(eth_mac, mac.data(), mac.size());
		if (vid)
			*vid = vlan;
		return 0;
	});
}

/* ---------------------------------------------------------------------------
 * Sharing objects between processes through the uverbs command fd. The
 * emulated devices cannot do this yet (their cmd_fd is a local eventfd, not a
 * uverbs file), so importing into them fails with EOPNOTSUPP, the answer of a
 * provider without import support; foreign objects go to the real library.
 */

namespace {

bool is_local_eventfd(int fd)
{
	char link[64];
	std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	char target[64] = {};
	ssize_t n = ::readlink(link, target, sizeof(target) - 1);
	return n > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

} // namespace

SHMV_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct stat st;
	if (cmd_fd < 0 || ::fstat(cmd_fd, &st))
		return fail_ptr<struct ibv_context>(EINVAL);
	if (S_ISCHR(st.st_mode)) {
		/* A uverbs character device: only a real provider has those. */
		if (auto fp = SHMV_NEXT(ibv_import_device, "IBVERBS_1.10"))
			return fp(cmd_fd);
		return fail_ptr<struct ibv_context>(ENODEV);
	}
	return fail_ptr<struct ibv_context>(is_local_eventfd(cmd_fd) ? EOPNOTSUPP : EINVAL);
}

SHMV_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	if (!context)
		return fail_ptr<struct ibv_pd>(EINVAL);
	if (!to_context(context))
		SHMV_FORWARD_PTR(ibv_import_pd, "IBVERBS_1.10", context, pd_handle);
	return fail_ptr<struct ibv_pd>(EOPNOTSUPP);
}

/* Import never succeeds on our contexts, so none of our objects is an
 * imported one: unimporting ours is a no-op (the object stays valid and must
 * still be destroyed by its owner). */
SHMV_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	if (pd && !to_context(pd->context))
		if (auto fp = SHMV_NEXT(ibv_unimport_pd, "IBVERBS_1.10"))
			fp(pd);
}

SHMV_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	if (!pd)
		return fail_ptr<struct ibv_mr>(EINVAL);
	if (!to_context(pd->context))
		SHMV_FORWARD_PTR(ibv_import_mr, "IBVERBS_1.10", pd, mr_handle);
	return fail_ptr<struct ibv_mr>(EOPNOTSUPP);
}

SHMV_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	if (mr && !to_context(mr->context))
		if (auto fp = SHMV_NEXT(ibv_unimport_mr, "IBVERBS_1.10"))
			fp(mr);
}

SHMV_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	if (!context)
		return fail_ptr<struct ibv_dm>(EINVAL);
	if (!to_context(context))
		SHMV_FORWARD_PTR(ibv_import_dm, "IBVERBS_1.13", context, dm_handle);
	return fail_ptr<struct ibv_dm>(EOPNOTSUPP);
}

SHMV_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	if (dm && !to_context(dm->context))
		if (auto fp = SHMV_NEXT(ibv_unimport_dm, "IBVERBS_1.13"))
			fp(dm);
}


/* ---------------------------------------------------------------------------
 * shmverbs' own: lets libmlx5.so.1 / libefa.so.1 tell our devices from a
 * real provider's without a second copy of the engine.
 */
SHMV_EXPORT int shmverbs_is_emulated_device(struct ibv_device *device)
{
	return to_device(device) != nullptr;
}
