/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels.
 */
#pragma once

#include "context.h"
#include "pd.h"

#include <infiniband/verbs.h>

namespace shmverbs {

struct Cq {
	/* ibv_cq_ex begins with the fields of ibv_cq, so one object serves
	 * both ibv_create_cq() and ibv_create_cq_ex() (ibv_cq_ex_to_cq casts). */
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cq_ex;
	} ibv;
	UseCount uses;                /* QPs and SRQs that name this CQ */
	AsyncEventCounter async_events; /* IBV_EVENT_CQ_ERR */
	/* --- family-private state below (lib/cq.cpp) --- */

	struct ibv_cq *abi() { return &ibv.cq; }
	static Cq *from(struct ibv_cq *cq) { return reinterpret_cast<Cq *>(cq); }
};

} // namespace shmverbs
