/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the send engine shared by its parts (lib/datapath.cpp: RC, UC,
 * XRC; lib/ud.cpp: UD and multicast; lib/srq_ring.cpp: SRQ rings). Not an
 * interface for anything else.
 */
#pragma once

#include "copy.h"
#include "cq.h"
#include "mr.h"
#include "segment.h"
#include "shm_layout.h"

#include <infiniband/verbs.h>

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace shmverbs::dp {

/* The target's key in its segment's key table, held until the KeyRef goes
 * (the owner's dereg_mr waits for it); empty when the key is not valid. */
KeyRef acquire_key(const PeerSegment &seg, uint32_t key);

/* A CQ ring in a peer's segment, geometry validated; nullptr if bad. */
CqTarget peer_cq(const PeerSegment &seg, uint64_t off);

/* A receive queue in a peer's segment, geometry copied and validated. */
struct PeerRq {
	shm::RecvQueue *rq = nullptr;
	uint32_t entries = 0, max_sge = 0, stride = 0;
};
bool peer_rq(const PeerSegment &seg, uint64_t off, PeerRq &out);

/* Takes one receive WQE (a copy) from a ring (CAS on head, any number of
 * consumers); false when empty. SRQ rings: checks the armed limit. */
bool consume_wqe(const PeerRq &q, shm::RecvWqe &wqe, std::vector<shm::RecvSge> &sges);

/* consume_wqe() for the common receive of one SGE, without the vector:
 * false when the ring is empty or when the WQE at head has another number
 * of SGEs (`other` is then set, and consume_wqe() takes it). */
inline bool consume_wqe_one_sge(const PeerRq &q, shm::RecvWqe &wqe, shm::RecvSge &sge,
				bool &other);

/* The producer's side (the ring's owner, under its post lock): writes
 * `wr` into `slot` as ring index `index` and publishes it (RecvWqe::seq).
 * The caller then advances tail. */
/* Writes receive WR `wr` into `slot` as ring index `index`. `skip_empty`:
 * without its zero-length SGEs, as libmlx5's mlx5_post_recv leaves them
 * out of a QP's WQE (their lkeys are then never looked at); its
 * mlx5_post_srq_recv keeps them. */
void rq_publish(char *slot, const struct ibv_recv_wr &wr, uint64_t index, bool skip_empty);

/* RecvWqe::seq of a slot, the word producer and consumers synchronize on. */
inline std::atomic_ref<uint32_t> rq_slot_seq(char *slot)
{
	return std::atomic_ref<uint32_t>(
		*reinterpret_cast<uint32_t *>(slot + offsetof(shm::RecvWqe, seq)));
}

} // namespace shmverbs::dp

namespace shmverbs {

/* lib/srq_ring.cpp: a consumer took the WQE before `new_head` from an SRQ
 * ring; fires the armed limit when fewer WQEs than it remain. */
void srq_ring_note_consumed(shm::RecvQueue &rq, uint64_t new_head);

} // namespace shmverbs

namespace shmverbs::dp {

/* An SRQ's ring, resolved through the broker (cached; a stale cache entry
 * is refreshed once). false when no such SRQ is published. */
bool peer_srq(uint32_t device, uint32_t srqn, PeerObject &obj, PeerRq &q);

} // namespace shmverbs::dp

namespace shmverbs::dp {

/* The consumer's side of a receive ring: copies the WQE at head with
 * `copy(wqe, slot)` (false: not for this caller, nothing taken) and then
 * CASes head past it. false when the ring is empty or copy() declined;
 * consume_wqe() and consume_wqe_one_sge() are this with their copies. */
template <typename Copy>
[[gnu::always_inline]] inline bool take_wqe(const PeerRq &q, shm::RecvWqe &wqe, Copy &&copy)
{
	char *slots = reinterpret_cast<char *>(q.rq) + shm::rq_slots_offset;
	uint64_t head = q.rq->head.load(std::memory_order_acquire);
	for (;;) {
		char *slot = slots + (head & (q.entries - 1)) * q.stride;
		/* Pairs with the producer's release store of seq (post_recv). */
		const uint32_t seq = rq_slot_seq(slot).load(std::memory_order_acquire);
		if (seq != uint32_t(head + 1)) {
			/* Not posted yet, unless head moved on meanwhile (the
			 * slot may then hold a later lap): look again. */
			const uint64_t now = q.rq->head.load(std::memory_order_acquire);
			if (now == head)
				return false;
			head = now;
			continue;
		}
		std::memcpy(&wqe, slot, offsetof(shm::RecvWqe, seq));
		wqe.seq = seq;
		if (!copy(wqe, slot))
			return false;
		/* The slot is rewritten only after head passed it: the copy
		 * is intact if this succeeds. */
		if (q.rq->head.compare_exchange_weak(head, head + 1, std::memory_order_acq_rel)) {
			if (q.rq->srqn)
				srq_ring_note_consumed(*q.rq, head + 1);
			return true;
		}
	}
}

inline bool consume_wqe_one_sge(const PeerRq &q, shm::RecvWqe &wqe, shm::RecvSge &sge,
				bool &other)
{
	other = false;
	return take_wqe(q, wqe, [&](const shm::RecvWqe &w, const char *slot) {
		if (w.num_sge != 1 || q.max_sge < 1) {
			other = true;
			return false;
		}
		std::memcpy(&sge, slot + sizeof(w), sizeof(sge));
		return true;
	});
}

} // namespace shmverbs::dp
