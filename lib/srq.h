/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues (basic and XRC) and XRC domains.
 */
#pragma once

#include "context.h"
#include "cq.h"
#include "pd.h"

#include <infiniband/verbs.h>

namespace shmverbs {

struct Xrcd {
	struct ibv_xrcd ibv; /* first: ibv_xrcd* <-> Xrcd* */
	UseCount uses;       /* XRC SRQs and XRC_RECV QPs in this domain */
	/* Identifies the shared domain: handles opened on the same file (same
	 * inode) in any context of this process share it, as they share one
	 * kernel xrcd; an anonymous domain (fd -1) gets a fresh value. */
	uint64_t domain;
	/* --- family-private state below (lib/srq.cpp) --- */

	struct ibv_xrcd *abi() { return &ibv; }
	static Xrcd *from(struct ibv_xrcd *x) { return reinterpret_cast<Xrcd *>(x); }
};

struct Srq {
	struct ibv_srq ibv; /* first: ibv_srq* <-> Srq* */
	UseCount uses;      /* QPs attached to this SRQ */
	AsyncEventCounter async_events; /* SRQ_LIMIT_REACHED, SRQ_ERR */
	enum ibv_srq_type srq_type;     /* IBV_SRQT_BASIC, _XRC or _TM */
	Pd *pd;
	Xrcd *xrcd;   /* XRC SRQs only */
	Cq *cq;       /* XRC SRQs only */
	uint32_t srq_num;
	/* --- family-private state below (lib/srq.cpp) --- */

	struct ibv_srq *abi() { return &ibv; }
	static Srq *from(struct ibv_srq *s) { return reinterpret_cast<Srq *>(s); }
};

} // namespace shmverbs
