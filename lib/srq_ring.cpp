/* SPDX-License-Identifier: MIT */
#include "srq_ring.h"

#include "cq_produce.h"
#include "datapath.h"
#include "datapath_internal.h"
#include "device.h"
#include "log.h"
#include "segment.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>

namespace shmverbs {

struct SrqRing {
	Srq &srq;
	Segment &seg;
	uint64_t off = 0, bytes = 0;
	shm::RecvQueue *rq = nullptr;
	uint32_t entries = 0, max_sge = 0, stride = 0;
	bool published = false;
	uint64_t hits_seen = 0; /* rq->limit_hits the events were raised for */
	std::mutex post_lock; /* the single producer */

	SrqRing(Srq &s, Segment &g) : srq(s), seg(g) {}
};

namespace {

/* The owner's side of the limit: consumers (any process) disarmed the
 * word; raise their events here, where the SRQ's context lives. Runs on
 * the progress thread. */
void poll_limit(void *arg)
{
	auto *r = static_cast<SrqRing *>(arg);
	const uint64_t hits = r->rq->limit_hits.load(std::memory_order_acquire);
	if (hits != r->hits_seen) {
		srq_limit_reached(r->srq, hits - r->hits_seen);
		r->hits_seen = hits;
	}
	/* An XRC SRQ's CQ, which senders reach through no QP of ours: an
	 * overrun they caused is raised here, as QpEngine's sweep does for
	 * the CQs of QPs. */
	const Cq *cq = r->srq.cq;
	if (cq && cq->ring && cq->ring->overrun.load(std::memory_order_relaxed)) [[unlikely]]
		cq_detail::report_overrun(*r->srq.cq);
}

} // namespace

int srq_ring_attach(Srq &srq)
{
	Segment &seg = Segment::of(srq.ctx->device->index);
	auto *r = new (std::nothrow) SrqRing(srq, seg);
	if (!r)
		return ENOMEM;
	uint32_t e = 1;
	while (e < srq.max_wr)
		e <<= 1;
	r->entries = e;
	r->max_sge = std::max(srq.max_sge, 1u);
	r->stride = uint32_t(sizeof(shm::RecvWqe) + sizeof(shm::RecvSge) * r->max_sge);
	r->bytes = shm::rq_slots_offset + uint64_t(r->entries) * r->stride;
	r->off = seg.alloc(r->bytes);
	if (!r->off) {
		delete r;
		return ENOMEM;
	}
	shm::RecvQueue *rq = seg.at<shm::RecvQueue>(r->off);
	rq->entries = r->entries;
	rq->max_sge = r->max_sge;
	rq->stride = r->stride;
	rq->srqn = srq.srq_num;
	rq->pdn = srq.pd ? srq.pd->pdn : 0;
	rq->srq_type = srq.srq_type;
	rq->limit.store(srq.srq_limit, std::memory_order_relaxed); /* arm 0 */
	if (srq.srq_type == IBV_SRQT_XRC) {
		rq->xrc_domain = srq.xrcd->domain;
		rq->cq_off = srq.cq->ring_off;
		rq->cq_has_channel = srq.cq->channel != nullptr;
	}
	/* Geometry first, then the magic. Other processes find the ring only
	 * through the broker's publish below (a system call, hence a full
	 * barrier); this process's senders only through srq.ring, set after. */
	rq->magic = shm::rq_magic;
	r->rq = rq;
	srq.ring = r;
	if (int err = seg.publish(broker::ObjectKind::Srq, srq.srq_num, r->off)) {
		log_debug("SRQ %u not published (%d): reachable by no peer", srq.srq_num, err);
	} else {
		r->published = true;
		if (srq.srq_type == IBV_SRQT_XRC && srq.cq->channel)
			seg.attach_fd(broker::ObjectKind::Srq, srq.srq_num, 0,
				      srq.cq->channel->ibv.fd);
	}
	progress_register_poller(r, poll_limit);
	return 0;
}

void srq_ring_detach(Srq &srq)
{
	SrqRing *r = srq.ring;
	if (!r)
		return;
	progress_unregister_poller(r);
	/* Senders check the magic before they consume. */
	r->rq->magic = 0;
	if (r->published)
		r->seg.withdraw(broker::ObjectKind::Srq, srq.srq_num);
	forget_object(srq.ctx->device->index, broker::ObjectKind::Srq, srq.srq_num);
	r->seg.free(r->off, r->bytes);
	srq.ring = nullptr;
	delete r;
}

void srq_ring_set_limit(Srq &srq, uint32_t limit)
{
	if (!srq.ring)
		return;
	/* A new arm: a consumer's CAS of the previous one fails from here
	 * on, and one that won before counted its disarm already or will. */
	std::atomic<uint64_t> &word = srq.ring->rq->limit;
	const uint64_t arm = (word.load(std::memory_order_relaxed) >> 32) + 1;
	word.store(arm << 32 | limit, std::memory_order_release);
}

uint32_t srq_ring_limit(const Srq &srq)
{
	if (!srq.ring)
		return srq.srq_limit;
	return uint32_t(srq.ring->rq->limit.load(std::memory_order_acquire));
}

namespace {

/* `left` WQEs remain after a consumption under the arm in `word`. */
void disarm_below(shm::RecvQueue &rq, uint64_t word, uint64_t left)
{
	if (left >= uint32_t(word))
		return;
	/* One consumer wins the disarm of this arm and counts it; the owner
	 * raises the event once. */
	if (rq.limit.compare_exchange_strong(word, word & ~uint64_t(0xffffffff),
					     std::memory_order_acq_rel))
		rq.limit_hits.fetch_add(1, std::memory_order_release);
}

} // namespace

void srq_ring_note_consumed(shm::RecvQueue &rq, uint64_t new_head)
{
	const uint64_t word = rq.limit.load(std::memory_order_acquire);
	if (!uint32_t(word))
		return;
	disarm_below(rq, word, rq.tail.load(std::memory_order_acquire) - new_head);
}

void srq_ring_note_left(Srq &srq, uint64_t left)
{
	if (!srq.ring)
		return;
	shm::RecvQueue &rq = *srq.ring->rq;
	const uint64_t word = rq.limit.load(std::memory_order_acquire);
	if (uint32_t(word))
		disarm_below(rq, word, left);
}

uint64_t srq_ring_outstanding(const Srq &srq)
{
	const SrqRing *r = srq.ring;
	if (!r)
		return 0;
	/* head first: it never passes the tail, so a later tail bounds it. */
	const uint64_t head = r->rq->head.load(std::memory_order_acquire);
	return r->rq->tail.load(std::memory_order_acquire) - head;
}

int post_srq_recv(Srq &srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	SrqRing *r = srq.ring;
	if (!r) {
		*bad_wr = wr;
		return ENOMEM;
	}
	shm::RecvQueue *rq = r->rq;
	char *slots = reinterpret_cast<char *>(rq) + shm::rq_slots_offset;
	const uint32_t max_wr = std::min(srq.max_wr, r->entries);
	std::lock_guard guard(r->post_lock);
	for (; wr; wr = wr->next) {
		/* libmlx5's order: the SGE count, then room. */
		if (wr->num_sge < 0 || uint32_t(wr->num_sge) > srq.max_sge) {
			*bad_wr = wr;
			return EINVAL;
		}
		uint64_t tail = rq->tail.load(std::memory_order_relaxed);
		/* A WQE holds its place until its completion is polled
		 * (mlx5_post_srq_recv), which the QPs' CQs count (a basic
		 * SRQ's room); never past what senders took. */
		uint64_t freed = rq->head.load(std::memory_order_acquire);
		if (srq.room)
			freed = std::min(freed, srq.room->freed.load(std::memory_order_acquire));
		if (tail - freed >= max_wr) {
			*bad_wr = wr;
			return ENOMEM;
		}
		dp::rq_publish(slots + (tail & (r->entries - 1)) * r->stride, *wr, tail, false);
		/* Pairs with the limit check's acquire load of tail. */
		rq->tail.store(tail + 1, std::memory_order_release);
	}
	return 0;
}

} // namespace shmverbs

namespace shmverbs::dp {

bool peer_srq(uint32_t device, uint32_t srqn, PeerObject &obj, PeerRq &q)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		if (resolve_object(device, broker::ObjectKind::Srq, srqn, obj, attempt == 1))
			return false;
		if (peer_rq(*obj.seg, obj.off, q) && q.rq->srqn == srqn)
			return true;
	}
	return false;
}

} // namespace shmverbs::dp
