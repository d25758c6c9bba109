/* SPDX-License-Identifier: MIT */
/*
 * Queue pairs: the control path (create, open, query, modify, destroy,
 * multicast attachment) for RC, UC, UD, XRC_SEND and XRC_RECV QPs.
 *
 * A QP is two objects:
 *   QpCore  the queue pair itself: type, number, capacities, the attributes
 *           of the state machine, and (later) its work queues. One per QP.
 *   Qp      a handle an application holds (struct ibv_qp first, laid out
 *           like rdma-core's struct verbs_qp). Every QP has the handle that
 *           created it; an XRC_RECV QP may have more, from ibv_open_qp() in
 *           any context of the process, and lives until the last is gone.
 *
 * Locking: QpCore::lock serialises modify/query/multicast on one QP, so a
 * query never sees half a modify; different QPs never share a lock. The XRC
 * registry has its own lock, taken before a core's lock when both are held.
 */
#pragma once

#include "context.h"
#include "cq.h"
#include "pd.h"
#include "profile.h"
#include "srq.h"

#include <infiniband/verbs.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace shmverbs {

/*
 * What the data path (the send and receive queues, lib/datapath.h QpEngine)
 * does when the control path moves a QP. Each call is made with the QP's lock
 * held, after the new state is recorded. Every QP gets one at creation
 * (attach_data_path, lib/datapath.cpp); set_qp_data_path() replaces it (the
 * engine tests record the calls).
 */
class QpDataPath {
public:
	virtual ~QpDataPath() = default;
	/* Entered ERR (by modify or by a data-path error): complete every
	 * outstanding send and receive WR with IBV_WC_WR_FLUSH_ERR, and keep
	 * flushing what is posted while the QP stays in ERR. */
	virtual void flush() = 0;
	/* Entered RESET: empty both work queues. */
	virtual void reset() = 0;
	/* After reset(), without the core lock: returns once no sender that
	 * found the QP ready is still inside it (bounded), so that nothing of
	 * the QP's previous life completes after modify_qp() then drops the
	 * QP's completions from its CQs (as libmlx5 does, mlx5_cq_clean);
	 * and starts the send queue's count afresh. */
	virtual void wait_for_senders() = 0;
	/* Any other transition (INIT, RTR, RTS, SQD, SQE). */
	virtual void state_changed(enum ibv_qp_state from, enum ibv_qp_state to) = 0;
	/* Acts on an error a sender found at this responder and left for the
	 * owner (the QP enters ERR), at once rather than at the next sweep.
	 * Called without the core lock. */
	virtual void check_remote_errors() = 0;
};

struct Qp;

struct McastAttachment {
	union ibv_gid gid;
	uint16_t lid;
};

struct QpCore {
	/* Fixed at creation. */
	Device *device = nullptr;
	enum ibv_qp_type type = IBV_QPT_RC;
	uint32_t qp_num = 0;
	bool sq_sig_all = false;
	QpCaps caps{};
	bool send_ops_given = false;
	uint64_t send_ops_flags = 0; /* IBV_QP_EX_WITH_*, when given */
	uint32_t create_flags = 0;   /* IBV_QP_CREATE_* */
	bool has_srq = false;
	uint64_t xrc_domain = 0;     /* XRC_RECV: the Xrcd::domain it lives in */
	/* MLX_QP_ALLOC_TYPE's huge pages (lib/huge_pages.h), in the chunks of
	 * the context that created the QP. */
	HugeChunks::Lease huge;
	HugeChunks *huge_owner = nullptr;

	/* Guarded by lock. */
	std::mutex lock;
	struct ibv_qp_attr attr{};   /* attr.qp_state is the state */
	std::vector<McastAttachment> mcast;
	std::unique_ptr<QpDataPath> data_path;

	/* The handles on this core (one, or any number for XRC_RECV); an
	 * event about the QP goes to each. Added under the XRC registry lock
	 * and this lock, removed under this lock. */
	std::vector<Qp *> handles;

	enum ibv_qp_state state() const { return attr.qp_state; }
};

struct Qp {
	/* Laid out like rdma-core's struct verbs_qp: ibv_qp_to_qp_ex() and
	 * mlx5dv code may rely on the ibv_qp_ex that overlays ibv_qp. */
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qp_ex;
	} ibv;
	uint32_t verbs_comp_mask; /* VERBS_QP_XRCD = 1, VERBS_QP_EX = 2 */
	Xrcd *verbs_xrcd;

	Context *ctx;
	QpCore *core;
	bool opened;     /* from ibv_open_qp() */
	bool destroying; /* set by destroy: no new async events for this handle */
	AsyncEventCounter async_events;

	/* The objects this handle holds a use on, released by destroy. */
	Pd *pd;               /* the protection domain proper */
	ParentDomain *parent; /* the parent domain it was created on, if any */
	Cq *send_cq;
	Cq *recv_cq;
	Srq *srq;
	Xrcd *xrcd;

	struct ibv_qp *abi() { return &ibv.qp; }
	static Qp *from(struct ibv_qp *qp) { return reinterpret_cast<Qp *>(qp); }
	bool has_qp_ex() const { return verbs_comp_mask & verbs_qp_ex; }

	static constexpr uint32_t verbs_qp_xrcd = 1, verbs_qp_ex = 2;
};

/* ibv_create_qp_ex(): everything libmlx5, libibverbs, ib_core and mlx5_ib
 * check, in their order. Writes the granted capacities into attr.cap. */
Result<Qp> create_qp(Context &ctx, struct ibv_qp_init_attr_ex &attr);

/* ibv_open_qp(): another handle on an XRC_RECV QP, found by its XRC domain
 * and number among the QPs of this process. */
Result<Qp> open_qp(Context &ctx, const struct ibv_qp_open_attr &attr);

/* ibv_query_qp(): fills the fields rdma-core's ibv_cmd_query_qp() fills,
 * whatever attr_mask says (as the kernel does). */
int query_qp(Qp &qp, struct ibv_qp_attr &attr, int attr_mask,
	     struct ibv_qp_init_attr &init_attr);

/* ibv_modify_qp(): all or nothing; on any error the QP is unchanged. */
int modify_qp(Qp &qp, const struct ibv_qp_attr &attr, int attr_mask);

/* ibv_destroy_qp(): EBUSY while attached to a multicast group; otherwise
 * waits until the async events the application got for this handle are
 * acknowledged, then releases everything. */
int destroy_qp(Qp &qp);

int attach_mcast(Qp &qp, const union ibv_gid &gid, uint16_t lid);
int detach_mcast(Qp &qp, const union ibv_gid &gid, uint16_t lid);

/* For the data path: the QP met an error on its own and moves to SQE (an
 * unreliable send failed) or ERR, flushing as a modify would. Returns false
 * when the QP is in RESET (nothing to fail). `cause`: the async event that
 * reports the error, if any, posted as the QP moves, before the events the
 * move itself raises (an SRQ QP's LAST_WQE_REACHED follows the error). */
bool qp_async_error(QpCore &core, enum ibv_qp_state to,
		    std::optional<enum ibv_event_type> cause = std::nullopt);

/* Posts an async event about the QP to each of its handles (as the kernel
 * does for shared XRC targets), except those being destroyed. Both take
 * the core, which the data path shares with every handle: a shared XRC
 * target's handles come and go while its engine lives. */
void post_qp_event(QpCore &core, enum ibv_event_type type);

/* Installs a data path on a QP (tests do this with a recording fake). */
void set_qp_data_path(Qp &qp, std::unique_ptr<QpDataPath> dp);

/* Number of XRC_RECV QPs in the process-wide registry (for tests). */
size_t xrc_registry_size();

} // namespace shmverbs
