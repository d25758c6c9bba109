/* SPDX-License-Identifier: MIT */
/*
 * The QP control path. Checks are made in the order the real stack makes
 * them (libmlx5, then libibverbs' command layer, then ib_core/uverbs, then
 * mlx5_ib), so that a request with several faults fails with the errno a
 * ConnectX-5 gives for it.
 */
#include "qp.h"
#include "ud.h"

#include "datapath.h"
#include "fork.h"
#include "ids.h"
#include "qp_state.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <new>
#include <type_traits>
#include <utility>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Qp>, "ibv_qp* is converted back with a cast");
static_assert(offsetof(Qp, ibv) == 0);

namespace {

/* XRC_RECV QPs of the process, by (XRC domain, QP number), for ibv_open_qp(). */
std::mutex xrc_lock;
std::map<std::pair<uint64_t, uint32_t>, QpCore *> xrc_qps;

constexpr uint32_t create_comp_mask_known =
	IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
	IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH |
	IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

constexpr uint32_t create_flags_known =
	IBV_QP_CREATE_BLOCK_SELF_MCAST_LB | IBV_QP_CREATE_SCATTER_FCS |
	IBV_QP_CREATE_CVLAN_STRIPPING | IBV_QP_CREATE_SOURCE_QPN |
	IBV_QP_CREATE_PCI_WRITE_END_PADDING;

/* The send opcodes libmlx5 can build for each QP type (mlx5_qp_fill_wr_pfns). */
constexpr uint64_t send_ops_rc =
	IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_SEND_WITH_IMM |
	IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
	IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
	IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
constexpr uint64_t send_ops_uc =
	IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_SEND_WITH_IMM |
	IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
	IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
constexpr uint64_t send_ops_ud = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

int check_send_ops(enum ibv_qp_type type, uint64_t ops)
{
	uint64_t supported;
	switch (type) {
	case IBV_QPT_RC:
	case IBV_QPT_XRC_SEND:
		supported = send_ops_rc;
		break;
	case IBV_QPT_UC:
		supported = send_ops_uc;
		break;
	case IBV_QPT_UD:
		supported = send_ops_ud;
		break;
	default: /* an XRC target sends nothing */
		return EOPNOTSUPP;
	}
	return (ops & ~supported) ? EOPNOTSUPP : 0;
}

bool is_ours(Context &ctx, struct ibv_context *c) { return c == ctx.abi(); }

/* An enum field as the application stored it: C code may put any int there,
 * which C++ must not load as the enum type. */
template <typename E>
int raw_value(const E &field)
{
	static_assert(sizeof(E) == sizeof(int));
	int v;
	std::memcpy(&v, &field, sizeof(v));
	return v;
}

/* The object's context, or nullptr when it is not one of ours at all. */
template <typename T>
struct ibv_context *owner(T *obj)
{
	return obj && to_context(obj->context) ? obj->context : nullptr;
}

const Port *port_of(const Device &dev, unsigned port_num)
{
	return port_num <= 0xff ? dev.port(static_cast<uint8_t>(port_num)) : nullptr;
}

bool is_eth(const Device &dev) { return dev.link_layer == LinkLayer::Ethernet; }

/*
 * An address vector as ib_core and mlx5_ib check it: the port exists, RoCE
 * needs a GRH, the source GID index is inside the table (EINVAL) and names
 * a populated entry (ENODATA), the static rate is one the device knows.
 */
int check_ah(const Device &dev, const struct ibv_ah_attr &ah)
{
	const Port *port = port_of(dev, ah.port_num);
	if (!port)
		return EINVAL;
	if (is_eth(dev) && !ah.is_global)
		return EINVAL;
	if (ah.is_global) {
		if (ah.grh.sgid_index >= port->gids.size())
			return EINVAL;
		if (!port->gids[ah.grh.sgid_index].valid)
			return ENODATA;
	}
	if (ah.static_rate > IBV_RATE_600_GBPS)
		return EINVAL;
	return 0;
}

/* What the device keeps of an address vector (and reports back): no GRH
 * fields without a GRH, RoCE has no LIDs, SL and flow label field widths. */
struct ibv_ah_attr stored_ah(const Device &dev, const struct ibv_ah_attr &in)
{
	struct ibv_ah_attr ah = in;
	if (!ah.is_global)
		std::memset(&ah.grh, 0, sizeof(ah.grh));
	ah.grh.flow_label &= 0xfffff;
	if (is_eth(dev)) {
		ah.dlid = 0;
		ah.src_path_bits = 0;
		ah.sl &= 0x7;
	} else {
		ah.sl &= 0xf;
	}
	return ah;
}

constexpr uint32_t psn_mask = 0xffffff;

/* Applies the attributes named in mask to a copy of the QP's attributes. */
void apply_attrs(const Device &dev, struct ibv_qp_attr &to, const struct ibv_qp_attr &from,
		 uint32_t mask)
{
	if (mask & IBV_QP_PATH_MTU)
		to.path_mtu = from.path_mtu;
	if (mask & IBV_QP_PATH_MIG_STATE)
		to.path_mig_state = from.path_mig_state;
	if (mask & IBV_QP_QKEY)
		to.qkey = from.qkey;
	if (mask & IBV_QP_RQ_PSN)
		to.rq_psn = from.rq_psn & psn_mask;
	if (mask & IBV_QP_SQ_PSN)
		to.sq_psn = from.sq_psn & psn_mask;
	if (mask & IBV_QP_DEST_QPN)
		to.dest_qp_num = from.dest_qp_num & 0xffffff;
	if (mask & IBV_QP_ACCESS_FLAGS)
		to.qp_access_flags = from.qp_access_flags;
	if (mask & IBV_QP_AV)
		to.ah_attr = stored_ah(dev, from.ah_attr);
	if (mask & IBV_QP_ALT_PATH) {
		to.alt_ah_attr = stored_ah(dev, from.alt_ah_attr);
		to.alt_pkey_index = from.alt_pkey_index;
		to.alt_port_num = from.alt_port_num;
		to.alt_timeout = from.alt_timeout;
	}
	if (mask & IBV_QP_PKEY_INDEX)
		to.pkey_index = from.pkey_index;
	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
		to.en_sqd_async_notify = from.en_sqd_async_notify;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		to.max_rd_atomic = from.max_rd_atomic;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		to.max_dest_rd_atomic = from.max_dest_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		to.min_rnr_timer = from.min_rnr_timer;
	if (mask & IBV_QP_PORT)
		to.port_num = from.port_num;
	if (mask & IBV_QP_TIMEOUT)
		to.timeout = from.timeout;
	if (mask & IBV_QP_RETRY_CNT)
		to.retry_cnt = from.retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		to.rnr_retry = from.rnr_retry;
}

/* Posts an event to every handle of the QP, each naming its own ibv_qp in
 * its own context; the caller holds the core's lock, which is what keeps
 * destroy from racing with it. */
void post_event_locked(QpCore &core, enum ibv_event_type type)
{
	for (Qp *h : core.handles) {
		if (h->destroying)
			continue;
		struct ibv_async_event e{};
		e.element.qp = h->abi();
		e.event_type = type;
		Context::post_async_event_if_open(h->ctx, e);
	}
}

/* The state change itself, with the core locked: record it, tell the data
 * path, and raise the events the hardware raises for it. */
void enter_state(QpCore &core, enum ibv_qp_state from, enum ibv_qp_state to)
{
	core.attr.qp_state = to;
	core.attr.cur_qp_state = to;
	if (to == IBV_QPS_ERR) {
		if (core.data_path)
			core.data_path->flush();
		/* With nothing in flight every WQE is consumed at once, so a
		 * QP on an SRQ reports its last WQE as it enters ERR. */
		if (from != IBV_QPS_ERR && core.has_srq)
			post_event_locked(core, IBV_EVENT_QP_LAST_WQE_REACHED);
	} else if (to == IBV_QPS_RESET) {
		if (core.data_path)
			core.data_path->reset();
	} else if (core.data_path) {
		core.data_path->state_changed(from, to);
	}
}

void release_uses(Qp &qp)
{
	if (qp.pd)
		qp.pd->uses.put();
	if (qp.parent)
		qp.parent->pd.uses.put();
	if (qp.send_cq)
		qp.send_cq->uses.put();
	if (qp.recv_cq)
		qp.recv_cq->uses.put();
	if (qp.srq)
		qp.srq->uses.put();
	if (qp.xrcd)
		qp.xrcd->uses.put();
}

/* A handle with the fields rdma-core's set_qp()/ibv_cmd_open_qp() fill. */
Qp *new_handle(Context &ctx, QpCore *core)
{
	auto *qp = new (std::nothrow) Qp{};
	if (!qp)
		return nullptr;
	qp->ctx = &ctx;
	qp->core = core;
	struct ibv_qp &q = qp->ibv.qp;
	q.context = ctx.abi();
	q.qp_num = core->qp_num;
	q.handle = core->qp_num;
	q.qp_type = core->type;
	q.state = IBV_QPS_RESET;
	pthread_mutex_init(&q.mutex, nullptr);
	pthread_cond_init(&q.cond, nullptr);
	return qp;
}

void free_handle(Qp *qp)
{
	pthread_mutex_destroy(&qp->ibv.qp.mutex);
	pthread_cond_destroy(&qp->ibv.qp.cond);
	delete qp;
}

/* libmlx5's older switch to huge pages for a QP type's buffer ("y"). */
const char *legacy_huge_key(enum ibv_qp_type type)
{
	switch (type) {
	case IBV_QPT_RC:
		return "HUGE_RC";
	case IBV_QPT_UC:
		return "HUGE_UC";
	case IBV_QPT_UD:
		return "HUGE_UD";
	default:
		return "HUGE_NA";
	}
}

/* The objects a create request names, checked against the context. */
struct Parts {
	Pd *pd = nullptr;
	ParentDomain *parent = nullptr; /* attr.pd when it is a parent domain */
	Cq *send_cq = nullptr;
	Cq *recv_cq = nullptr;
	Srq *srq = nullptr;
	Xrcd *xrcd = nullptr;
};

/* What libibverbs' ibv_icmd_create_qp() and the kernel's QP_CREATE method
 * require of the objects, for the QP types we create. */
int resolve_parts(Context &ctx, const struct ibv_qp_init_attr_ex &attr, uint32_t flags,
		  Parts &p)
{
	const enum ibv_qp_type type = attr.qp_type;

	/* libibverbs: which handle the type needs. */
	if (type == IBV_QPT_XRC_RECV) {
		if (!(attr.comp_mask & IBV_QP_INIT_ATTR_XRCD))
			return EINVAL;
	} else {
		if (!(attr.comp_mask & IBV_QP_INIT_ATTR_PD))
			return EINVAL;
		/* (rdma-core dereferences these; we refuse instead) */
		if (!attr.send_cq || (type != IBV_QPT_XRC_SEND && !attr.recv_cq))
			return EINVAL;
	}
	if (flags & ~create_flags_known)
		return EINVAL;

	/* Kernel: every handle must name an object of this context. */
	if (type == IBV_QPT_XRC_RECV) {
		if (!attr.xrcd || !is_ours(ctx, owner(attr.xrcd)))
			return EINVAL;
		p.xrcd = Xrcd::from(attr.xrcd);
	} else {
		if (type == IBV_QPT_XRC_SEND && attr.srq)
			return EINVAL;
		if (!attr.pd || !is_ours(ctx, owner(attr.pd)) ||
		    !is_ours(ctx, owner(attr.send_cq)))
			return EINVAL;
		p.pd = Pd::from(attr.pd);
		p.parent = ParentDomain::from(attr.pd);
		p.send_cq = Cq::from(attr.send_cq);
		if (type != IBV_QPT_XRC_SEND) {
			if (!is_ours(ctx, owner(attr.recv_cq)))
				return EINVAL;
			p.recv_cq = Cq::from(attr.recv_cq);
		}
	}

	/* Kernel: creation flags only for UD (and raw packet QPs, which we
	 * do not offer); FCS scattering and VLAN stripping only for raw. */
	if (flags && type != IBV_QPT_UD)
		return EINVAL;
	if (flags & (IBV_QP_CREATE_SCATTER_FCS | IBV_QP_CREATE_CVLAN_STRIPPING))
		return EINVAL;

	if (attr.srq) {
		if (!is_ours(ctx, owner(attr.srq)))
			return EINVAL;
		Srq *srq = Srq::from(attr.srq);
		/* An XRC SRQ serves XRC targets only, and they no other. */
		if ((srq->srq_type == IBV_SRQT_XRC) != (type == IBV_QPT_XRC_RECV))
			return EINVAL;
		if (type != IBV_QPT_XRC_RECV) {
			/* ibv_create_qp(3): only RC and UD QPs take an SRQ,
			 * and it must be in the QP's protection domain. */
			if (type != IBV_QPT_RC && type != IBV_QPT_UD)
				return EINVAL;
			if (srq->pd != p.pd)
				return EINVAL;
			p.srq = srq;
		}
		/* An XRC target's SRQ comes with each packet; the kernel
		 * keeps no reference to the one named at creation. */
	}

	/* A QP that sends with another QP's number (IPoIB underlay) needs
	 * CAP_NET_RAW and a device feature we do not emulate. */
	if (flags & IBV_QP_CREATE_SOURCE_QPN)
		return EOPNOTSUPP;
	return 0;
}

} // namespace

Result<Qp> create_qp(Context &ctx, struct ibv_qp_init_attr_ex &attr)
{
	/* Any int may come from C; only the types below are ever used as
	 * the enum. */
	const int raw_type = raw_value(attr.qp_type);
	const enum ibv_qp_type type =
		raw_type >= 0 && raw_type <= IBV_QPT_DRIVER ? attr.qp_type : IBV_QPT_DRIVER;
	const uint32_t flags =
		(attr.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? attr.create_flags : 0;

	/* libmlx5 create_qp(): it returns NULL with errno untouched for the
	 * first two; EINVAL says the same and is what the kernel would say. */
	if (attr.comp_mask & ~create_comp_mask_known)
		return Err{EINVAL};
	if ((attr.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && type != IBV_QPT_RAW_PACKET)
		return Err{EINVAL};
	if ((attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr.comp_mask & IBV_QP_INIT_ATTR_RX_HASH))
		return Err{EINVAL};
	if ((flags & IBV_QP_CREATE_SOURCE_QPN) && type != IBV_QPT_UD)
		return Err{EINVAL};

	switch (type) {
	case IBV_QPT_RC:
	case IBV_QPT_UC:
	case IBV_QPT_UD:
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV:
		break;
	case IBV_QPT_RAW_PACKET:
		/* Raw Ethernet QPs need CAP_NET_RAW and an Ethernet data path. */
		return Err{EOPNOTSUPP};
	default: /* including IBV_QPT_DRIVER without mlx5dv DC attributes */
		return Err{EINVAL};
	}

	/* Receive work queues and RSS are not emulated. */
	if (attr.comp_mask & (IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_IND_TABLE))
		return Err{EOPNOTSUPP};

	const bool send_ops_given = attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (send_ops_given)
		if (int err = check_send_ops(type, attr.send_ops_flags))
			return Err{err};

	QpSizing sizing{};
	sizing.qp_type = type;
	sizing.cap = attr.cap;
	sizing.has_srq = attr.srq != nullptr;
	sizing.send_ops_given = send_ops_given;
	sizing.send_ops_flags = send_ops_given ? attr.send_ops_flags : 0;
	QpCaps caps{};
	if (int err = ctx.device->profile->size_qp(sizing, caps))
		return Err{err};

	Parts parts;
	if (int err = resolve_parts(ctx, attr, flags, parts))
		return Err{err};

	/* libmlx5's work queue buffer, on huge pages when asked to be. */
	HugeChunks::Lease huge;
	if (int err = take_queue_huge_pages(ctx, parts.parent, "MLX_QP", legacy_huge_key(type),
					    caps.mlx5_buffer_bytes, huge))
		return Err{err};
	auto core = std::unique_ptr<QpCore>(new (std::nothrow) QpCore{});
	if (!core) {
		ctx.huge_chunks.give_back(huge);
		return Err{ENOMEM};
	}
	core->huge = huge;
	core->huge_owner = &ctx.huge_chunks;
	core->device = ctx.device;
	core->type = type;
	core->sq_sig_all = attr.sq_sig_all != 0;
	core->caps = caps;
	core->send_ops_given = send_ops_given;
	core->send_ops_flags = sizing.send_ops_flags;
	core->create_flags = flags;
	core->has_srq = parts.srq != nullptr;
	core->xrc_domain = parts.xrcd ? parts.xrcd->domain : 0;
	core->attr.qp_state = IBV_QPS_RESET;
	core->qp_num = allocate_id(*ctx.device, IdKind::Qp);
	if (!core->qp_num) {
		ctx.huge_chunks.give_back(core->huge);
		return Err{ENOMEM};
	}

	Qp *qp = new_handle(ctx, core.get());
	if (!qp) {
		release_id(*ctx.device, IdKind::Qp, core->qp_num);
		ctx.huge_chunks.give_back(core->huge);
		return Err{ENOMEM};
	}
	/* rdma-core's set_qp() copies the caller's pointers as given. */
	struct ibv_qp &q = qp->ibv.qp;
	q.qp_context = attr.qp_context;
	q.pd = attr.pd;
	q.send_cq = attr.send_cq;
	q.recv_cq = attr.recv_cq;
	q.srq = attr.srq;
	if (attr.comp_mask & IBV_QP_INIT_ATTR_XRCD) {
		qp->verbs_comp_mask |= Qp::verbs_qp_xrcd;
		qp->verbs_xrcd = parts.xrcd;
	}
	if (send_ops_given)
		qp->verbs_comp_mask |= Qp::verbs_qp_ex;

	qp->pd = parts.pd;
	qp->parent = parts.parent;
	qp->send_cq = parts.send_cq;
	qp->recv_cq = parts.recv_cq;
	qp->srq = parts.srq;
	qp->xrcd = parts.xrcd;
	for (UseCount *u : {parts.pd ? &parts.pd->uses : nullptr,
			    parts.parent ? &parts.parent->pd.uses : nullptr,
			    parts.send_cq ? &parts.send_cq->uses : nullptr,
			    parts.recv_cq ? &parts.recv_cq->uses : nullptr,
			    parts.srq ? &parts.srq->uses : nullptr,
			    parts.xrcd ? &parts.xrcd->uses : nullptr})
		if (u)
			u->get();

	core->handles.push_back(qp);
	if (type == IBV_QPT_XRC_RECV) {
		std::lock_guard guard(xrc_lock);
		xrc_qps[{core->xrc_domain, core->qp_num}] = core.get();
	}
	ctx.add_event_source(qp->abi(), &qp->async_events);
	core.release();
	/* Queues in shared memory, published under the QP number. */
	attach_data_path(*qp);

	attr.cap = caps.created;
	process_fork_ranges().queue_created();
	return qp;
}

Result<Qp> open_qp(Context &ctx, const struct ibv_qp_open_attr &attr)
{
	/* libibverbs' ibv_cmd_open_qp(), then the kernel's ib_open_qp(). */
	if (attr.comp_mask >= IBV_QP_OPEN_ATTR_RESERVED)
		return Err{EOPNOTSUPP};
	constexpr uint32_t needed = IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_NUM |
				    IBV_QP_OPEN_ATTR_TYPE;
	if ((attr.comp_mask & needed) != needed)
		return Err{EINVAL};
	if (!attr.xrcd || !is_ours(ctx, owner(attr.xrcd)))
		return Err{EINVAL};
	if (raw_value(attr.qp_type) != IBV_QPT_XRC_RECV)
		return Err{EINVAL};
	Xrcd *xrcd = Xrcd::from(attr.xrcd);

	std::lock_guard guard(xrc_lock);
	auto it = xrc_qps.find({xrcd->domain, attr.qp_num});
	if (it == xrc_qps.end() || it->second->device != ctx.device)
		return Err{EINVAL};
	QpCore *core = it->second;
	Qp *qp = new_handle(ctx, core);
	if (!qp)
		return Err{ENOMEM};
	struct ibv_qp &q = qp->ibv.qp;
	q.qp_context = attr.qp_context;
	q.state = IBV_QPS_UNKNOWN;
	qp->opened = true;
	qp->verbs_comp_mask = Qp::verbs_qp_xrcd;
	qp->verbs_xrcd = xrcd;
	qp->xrcd = xrcd;
	xrcd->uses.get();
	ctx.add_event_source(qp->abi(), &qp->async_events);
	std::lock_guard core_guard(core->lock);
	core->handles.push_back(qp);
	return qp;
}

int query_qp(Qp &qp, struct ibv_qp_attr &attr, int attr_mask,
	     struct ibv_qp_init_attr &init_attr)
{
	/* Attributes from IBV_QP_RATE_LIMIT on go through the extended
	 * command, which has no query. */
	if (attr_mask < 0 || (uint32_t(attr_mask) & ~(uint32_t(IBV_QP_RATE_LIMIT) - 1)))
		return EOPNOTSUPP;

	QpCore &core = *qp.core;
	/* The state as the device has it: an error a sender met here has
	 * moved the QP to ERR already on a device. */
	if (core.data_path)
		core.data_path->check_remote_errors();
	std::lock_guard guard(core.lock);
	const struct ibv_qp_attr &a = core.attr;
	attr.qkey = a.qkey;
	attr.rq_psn = a.rq_psn;
	attr.sq_psn = a.sq_psn;
	attr.dest_qp_num = a.dest_qp_num;
	attr.qp_access_flags = a.qp_access_flags;
	attr.pkey_index = a.pkey_index;
	attr.alt_pkey_index = a.alt_pkey_index;
	attr.qp_state = a.qp_state;
	attr.cur_qp_state = a.qp_state;
	attr.path_mtu = a.path_mtu;
	attr.path_mig_state = a.path_mig_state;
	attr.sq_draining = 0; /* an SQD QP here has always finished draining */
	attr.max_rd_atomic = a.max_rd_atomic;
	attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
	attr.min_rnr_timer = a.min_rnr_timer;
	attr.port_num = a.port_num;
	attr.timeout = a.timeout;
	attr.retry_cnt = a.retry_cnt;
	attr.rnr_retry = a.rnr_retry;
	attr.alt_port_num = a.alt_port_num;
	attr.alt_timeout = a.alt_timeout;
	attr.cap = core.caps.queried;
	attr.ah_attr = a.ah_attr;
	attr.alt_ah_attr = a.alt_ah_attr;
	core.device->profile->read_back(attr);

	const struct ibv_qp &q = qp.ibv.qp;
	init_attr.qp_context = q.qp_context;
	init_attr.send_cq = q.send_cq;
	init_attr.recv_cq = q.recv_cq;
	init_attr.srq = q.srq;
	init_attr.qp_type = q.qp_type;
	init_attr.cap = core.caps.queried;
	init_attr.sq_sig_all = core.sq_sig_all;
	return 0;
}

namespace {

/* The QP's unpolled completions leave its CQs (mlx5_cq_clean), after a
 * reset or a destroy: a poll after this never returns them. Without the
 * core lock, and without the send lock (QpDataPath::reset): a poller
 * inside an ibv_start_poll() batch of the CQ holds the CQ's lock, which
 * this takes, and may call a verb that takes either. */
void clean_cqs(const Qp &qp, uint32_t qp_num)
{
	if (qp.recv_cq)
		cq_clean(*qp.recv_cq, qp_num);
	if (qp.send_cq && qp.send_cq != qp.recv_cq)
		cq_clean(*qp.send_cq, qp_num);
}

/* modify_qp() under the core lock; `reset`: the QP entered RESET. */
int modify_qp_locked(Qp &qp, const struct ibv_qp_attr &request, int attr_mask, bool &reset)
{
	struct ibv_qp_attr attr = request; /* uverbs may fill in the port */
	QpCore &core = *qp.core;
	const Device &dev = *core.device;
	uint32_t mask = static_cast<uint32_t>(attr_mask);

	/* libibverbs and uverbs: unknown attribute bits. */
	if (attr_mask < 0 || (mask & ~(qp_attr_standard_bits | IBV_QP_RATE_LIMIT)))
		return EOPNOTSUPP;

	/* As in query_qp(): the transition starts from the device's state. */
	if (core.data_path)
		core.data_path->check_remote_errors();
	std::lock_guard guard(core.lock);
	const enum ibv_qp_state actual = core.state();

	/* uverbs modify_qp(): ports named must exist; a primary path given
	 * with INIT->RTR must use the QP's port, elsewhere (SQD->SQD) it
	 * moves the QP to the path's port. */
	if ((mask & IBV_QP_PORT) && !port_of(dev, attr.port_num))
		return EINVAL;
	uint8_t new_port = (mask & IBV_QP_PORT) ? attr.port_num : core.attr.port_num;
	if (mask & IBV_QP_AV) {
		if (!port_of(dev, attr.ah_attr.port_num))
			return EINVAL;
		if ((mask & IBV_QP_STATE) && raw_value(attr.qp_state) == IBV_QPS_RTR) {
			if (attr.ah_attr.port_num != core.attr.port_num)
				return EINVAL;
		} else if (mask & IBV_QP_PORT) {
			if (attr.port_num != attr.ah_attr.port_num)
				return EINVAL;
		} else {
			mask |= IBV_QP_PORT;
			attr.port_num = attr.ah_attr.port_num;
			new_port = attr.port_num;
		}
	}
	if ((mask & IBV_QP_ALT_PATH) &&
	    (!port_of(dev, attr.alt_port_num) || !port_of(dev, attr.alt_ah_attr.port_num) ||
	     attr.alt_port_num != attr.alt_ah_attr.port_num))
		return EINVAL;
	if (((mask & IBV_QP_CUR_STATE) && !qp_state_is_valid(raw_value(attr.cur_qp_state))) ||
	    ((mask & IBV_QP_STATE) && !qp_state_is_valid(raw_value(attr.qp_state))))
		return EINVAL;

	mask &= ~qp_ignored_attrs(core.type);

	/* ib_core: address vectors; alternate paths are an IB-only feature. */
	if (mask & IBV_QP_AV)
		if (int err = check_ah(dev, attr.ah_attr))
			return err;
	if (mask & IBV_QP_ALT_PATH) {
		if (int err = check_ah(dev, attr.alt_ah_attr))
			return err;
		if (is_eth(dev))
			return EINVAL;
	}

	/* mlx5_ib_modify_qp(): the state machine, then values. */
	const enum ibv_qp_state cur = (mask & IBV_QP_CUR_STATE) ? attr.cur_qp_state : actual;
	const enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr.qp_state : cur;
	if (!qp_transition_allowed(cur, next, core.type, mask))
		return EINVAL;
	if (next == IBV_QPS_SQD && !dev.profile->drains_sq())
		return EINVAL;
	struct ibv_device_attr da = dev.device_attr();
	if (mask & (IBV_QP_PKEY_INDEX | IBV_QP_ALT_PATH)) {
		const Port *port = port_of(dev, new_port ? new_port : 1);
		if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index >= port->pkeys.size())
			return EINVAL;
		if ((mask & IBV_QP_ALT_PATH) &&
		    attr.alt_pkey_index >= port_of(dev, attr.alt_port_num)->pkeys.size())
			return EINVAL;
	}
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > da.max_qp_init_rd_atom)
		return EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > da.max_qp_rd_atom)
		return EINVAL;
	if (cur == IBV_QPS_RESET && next == IBV_QPS_RESET)
		return 0;
	/* The firmware executes the transition from the state the QP is
	 * really in; an asserted current state that is wrong fails. */
	if ((mask & IBV_QP_CUR_STATE) && attr.cur_qp_state != actual)
		return EINVAL;
	if (mask & IBV_QP_PATH_MTU) {
		const Port *port = port_of(dev, new_port ? new_port : 1);
		int mtu = raw_value(attr.path_mtu);
		if (mtu < IBV_MTU_256 || mtu > port->attr.max_mtu)
			return EINVAL;
	}
	/* Neither uverbs nor mlx5_ib refuse a value too wide for its field. */
	dev.profile->fit_path_fields(attr);

	/* Everything checked: apply. */
	struct ibv_qp_attr updated = core.attr;
	apply_attrs(dev, updated, attr, mask);
	if (next == IBV_QPS_RESET) {
		/* The device forgets the QP's context; only its identity, its
		 * capacities and its multicast attachments remain. */
		updated = ibv_qp_attr{};
		updated.qp_state = IBV_QPS_RESET;
	}
	updated.qp_state = actual;
	core.attr = updated;
	if (next != actual || next == IBV_QPS_ERR) {
		enter_state(core, actual, next);
		reset = next == IBV_QPS_RESET;
	}
	else if (core.data_path)
		core.data_path->state_changed(actual, next); /* new attributes, same state */
	if (actual == IBV_QPS_RTS && next == IBV_QPS_SQD && (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) &&
	    attr.en_sqd_async_notify)
		post_event_locked(core, IBV_EVENT_SQ_DRAINED);
	return 0;
}

} // namespace

int modify_qp(Qp &qp, const struct ibv_qp_attr &request, int attr_mask)
{
	bool reset = false;
	const int err = modify_qp_locked(qp, request, attr_mask, reset);
	if (reset) {
		if (qp.core->data_path)
			qp.core->data_path->wait_for_senders();
		clean_cqs(qp, qp.core->qp_num);
	}
	return err;
}

int destroy_qp(Qp &qp)
{
	QpCore *core = qp.core;
	{
		std::lock_guard guard(core->lock);
		if (!core->mcast.empty())
			return EBUSY;
		qp.destroying = true;
	}
	/* Events the application has not read die with the handle; those it
	 * read must be acknowledged first (ibv_destroy_qp(3)). */
	qp.ctx->drop_queued_events(qp.abi());
	qp.async_events.wait_all_acked();
	qp.ctx->remove_event_source(qp.abi());

	bool last = true;
	{
		/* Registry first, then the core (open_qp's order), so that no
		 * one opens the QP while its last handle goes. */
		std::unique_lock registry(xrc_lock, std::defer_lock);
		if (core->type == IBV_QPT_XRC_RECV)
			registry.lock();
		std::lock_guard guard(core->lock);
		std::erase(core->handles, &qp);
		last = core->handles.empty();
		if (last && core->type == IBV_QPT_XRC_RECV)
			xrc_qps.erase({core->xrc_domain, core->qp_num});
	}
	if (last) {
		Device &device = *core->device;
		const uint32_t qp_num = core->qp_num;
		if (core->huge_owner)
			core->huge_owner->give_back(core->huge);
		/* The engine withdraws the QP and waits until no sender is
		 * inside it: no completion of it comes after this. */
		delete core;
		/* Those it left unpolled go, as libmlx5's destroy_qp cleans both
		 * CQs (mlx5_cq_clean): a poll after this never returns the
		 * number of a QP that is gone, which may be reused. Before the
		 * number is free and the CQs' uses are let go. */
		clean_cqs(qp, qp_num);
		/* After the clean, which gave an SRQ the WQEs of the
		 * completions it dropped (mlx5_cq_clean). */
		if (qp.recv_cq)
			cq_track_rq(*qp.recv_cq, qp_num, nullptr);
		release_id(device, IdKind::Qp, qp_num);
	}
	release_uses(qp);
	free_handle(&qp);
	return 0;
}

int attach_mcast(Qp &qp, const union ibv_gid &gid, uint16_t lid)
{
	QpCore &core = *qp.core;
	std::lock_guard guard(core.lock);
	/* uverbs: attaching again to the same group is a no-op. */
	for (const McastAttachment &m : core.mcast)
		if (m.lid == lid && std::memcmp(m.gid.raw, gid.raw, sizeof(gid.raw)) == 0)
			return 0;
	/* ib_attach_mcast(): a multicast GID, a UD QP, and on InfiniBand a
	 * multicast LID (RoCE ignores the LID). */
	if (!is_multicast_gid(gid) || core.type != IBV_QPT_UD)
		return EINVAL;
	if (!is_eth(*core.device) && (lid < 0xc000 || lid == 0xffff))
		return EINVAL;
	/* Membership other processes' senders see (lib/ud.h). */
	if (int err = mcast_join(core.device->index, gid, is_eth(*core.device) ? 0 : lid,
				 core.qp_num))
		return err;
	core.mcast.push_back(McastAttachment{gid, lid});
	return 0;
}

int detach_mcast(Qp &qp, const union ibv_gid &gid, uint16_t lid)
{
	QpCore &core = *qp.core;
	std::lock_guard guard(core.lock);
	auto it = std::find_if(core.mcast.begin(), core.mcast.end(), [&](const McastAttachment &m) {
		return m.lid == lid && std::memcmp(m.gid.raw, gid.raw, sizeof(gid.raw)) == 0;
	});
	if (it == core.mcast.end())
		return EINVAL;
	core.mcast.erase(it);
	mcast_leave(core.device->index, gid, is_eth(*core.device) ? 0 : lid, core.qp_num);
	return 0;
}

bool qp_async_error(QpCore &core, enum ibv_qp_state to, std::optional<enum ibv_event_type> cause)
{
	std::lock_guard guard(core.lock);
	enum ibv_qp_state from = core.state();
	if (from == IBV_QPS_RESET || (to != IBV_QPS_SQE && to != IBV_QPS_ERR))
		return false;
	/* A send error met on the way while the application moved the QP
	 * to ERR: ERR stays (there is no way back from it but RESET). */
	if (to == IBV_QPS_SQE && from == IBV_QPS_ERR)
		return false;
	if (cause)
		post_event_locked(core, *cause);
	enter_state(core, from, to);
	return true;
}

void post_qp_event(QpCore &core, enum ibv_event_type type)
{
	std::lock_guard guard(core.lock);
	post_event_locked(core, type);
}

void set_qp_data_path(Qp &qp, std::unique_ptr<QpDataPath> dp)
{
	std::lock_guard guard(qp.core->lock);
	qp.core->data_path = std::move(dp);
}

size_t xrc_registry_size()
{
	std::lock_guard guard(xrc_lock);
	return xrc_qps.size();
}

} // namespace shmverbs
