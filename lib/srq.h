/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues (basic and XRC) and XRC domains.
 */
#pragma once

#include "context.h"
#include "cq.h"
#include "pd.h"

#include <infiniband/verbs.h>

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace shmverbs {

struct SrqRing; /* lib/srq_ring.h */

/* Names the kernel-side XRC domain an fd's inode stands for: the inode on
 * one device (the kernel keeps one inode -> xrcd table per device). */
struct XrcdKey {
	uint32_t device_index;
	dev_t st_dev;
	ino_t st_ino;

	bool operator<(const XrcdKey &o) const
	{
		if (device_index != o.device_index)
			return device_index < o.device_index;
		if (st_dev != o.st_dev)
			return st_dev < o.st_dev;
		return st_ino < o.st_ino;
	}
};

struct Xrcd {
	struct ibv_xrcd ibv; /* first: ibv_xrcd* <-> Xrcd* */
	UseCount uses;       /* XRC SRQs and XRC_RECV QPs in this domain */
	/* Identifies the shared domain: handles opened on the same file (same
	 * inode) in any context of this process share it, as they share one
	 * kernel xrcd; an anonymous domain (fd -1) gets a fresh value. */
	uint64_t domain;
	/* --- family-private state below (lib/srq.cpp) --- */

	Context *ctx;
	bool named;      /* opened on a file (fd != -1) */
	XrcdKey key;     /* named domains only */
	/* Named domains: this handle's open file description of the domain's
	 * marker file, holding a shared lock that tells other processes the
	 * domain exists (see lib/srq.cpp); -1 when no runtime directory. */
	int marker_fd;

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

	Context *ctx;
	std::mutex lock;       /* guards the attributes below */
	uint32_t max_wr;       /* granted capacity (what query returns) */
	uint32_t max_sge;      /* granted scatter entries per WR */
	uint32_t requested_sge; /* what was asked for, for resizing */
	/* The low watermark last armed (0: none). When the posted receive
	 * WQEs drop below it, IBV_EVENT_SRQ_LIMIT_REACHED is raised once and
	 * the limit disarms (ibv_modify_srq(3)): the ring's word says whether
	 * it still is armed (srq_ring_limit). */
	uint32_t srq_limit;
	SrqRing *ring; /* the receive ring in shared memory (lib/srq_ring.h) */
	/* A basic SRQ's WQEs given back by the polls of its QPs' receive
	 * completions (libmlx5's mlx5_post_srq_recv counts room from them);
	 * none for an XRC SRQ, whose room is what senders left. */
	std::shared_ptr<RqRoom> room;
	HugeChunks::Lease huge; /* MLX_SRQ_ALLOC_TYPE's (lib/huge_pages.h) */

	struct ibv_srq *abi() { return &ibv; }
	static Srq *from(struct ibv_srq *s) { return reinterpret_cast<Srq *>(s); }
};

/* --- XRC domains --- */

/* ibv_open_xrcd(): fd -1 opens a new anonymous domain; a file names a domain
 * shared by every context and process that opens the same inode, created
 * with O_CREAT (EAGAIN without it when none exists) and refused with O_EXCL
 * when one exists (EINVAL), exactly as ib_uverbs. */
Result<Xrcd> open_xrcd(Context &ctx, const struct ibv_xrcd_init_attr &attr);
/* EBUSY while XRC SRQs or XRC_RECV QPs opened through this handle exist. */
int close_xrcd(Xrcd &xrcd);

/* --- Shared receive queues --- */

/* ibv_create_srq() and ibv_create_srq_ex(): validation, errno and rounding
 * as libmlx5 + mlx5_ib (or the device profile). Updates attr.attr with the
 * granted max_wr and max_sge. Takes uses on the PD and, for XRC, on the
 * XRCD and the CQ. */
Result<Srq> create_srq(Context &ctx, struct ibv_srq_init_attr_ex &attr);
int modify_srq(Srq &srq, const struct ibv_srq_attr &attr, int attr_mask);
int query_srq(Srq &srq, struct ibv_srq_attr &attr);
int get_srq_num(Srq &srq, uint32_t &srq_num);
/* EBUSY while QPs use the SRQ; otherwise waits until its async events are
 * acknowledged, releases its PD/XRCD/CQ and frees it. */
int destroy_srq(Srq &srq);

/*
 * The SRQ limit's owner side: consumers disarmed `events` arms of the limit
 * word since the last call (lib/srq_ring.cpp); raises
 * IBV_EVENT_SRQ_LIMIT_REACHED for each, as the device queues one per arm
 * when it consumes below the limit.
 */
void srq_limit_reached(Srq &srq, uint64_t events);

} // namespace shmverbs
