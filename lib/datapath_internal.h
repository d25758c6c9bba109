/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the send engine shared by its parts (lib/datapath.cpp: RC, UC,
 * XRC; lib/ud.cpp: UD and multicast; lib/srq_ring.cpp: SRQ rings). Not an
 * interface for anything else.
 */
#pragma once

#include "cq.h"
#include "mr.h"
#include "segment.h"
#include "shm_layout.h"

#include <infiniband/verbs.h>

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace shmverbs::dp {

/* The target's key in its segment's key table, held until the KeyRef goes
 * (the owner's dereg_mr waits for it); empty when the key is not valid. */
KeyRef acquire_key(const PeerSegment &seg, uint32_t key);

/* A CQ ring in a peer's segment, geometry validated; nullptr if bad. */
shm::CqRing *peer_cq(const PeerSegment &seg, uint64_t off, uint32_t &capacity);

/* A receive queue in a peer's segment, geometry copied and validated. */
struct PeerRq {
	shm::RecvQueue *rq = nullptr;
	uint32_t entries = 0, max_sge = 0, stride = 0;
};
bool peer_rq(const PeerSegment &seg, uint64_t off, PeerRq &out);

/* Takes one receive WQE (a copy) from a ring (CAS on head, any number of
 * consumers); false when empty. SRQ rings: checks the armed limit. */
bool consume_wqe(const PeerRq &q, shm::RecvWqe &wqe, std::vector<shm::RecvSge> &sges);

/* The producer's side (the ring's owner, under its post lock): writes
 * `wr` into `slot` as ring index `index` and publishes it (RecvWqe::seq).
 * The caller then advances tail. */
void rq_publish(char *slot, const struct ibv_recv_wr &wr, uint64_t index);

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
