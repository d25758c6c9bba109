/* SPDX-License-Identifier: MIT */
/*
 * The receive ring of a shared receive queue (basic or XRC) in the owner's
 * segment, published with the broker under the SRQ number.
 *
 * The owner posts (ibv_post_srq_recv, one producer under a mutex); senders
 * of any process consume with a CAS on the ring's head (lib/shm_layout.h
 * RecvQueue), on behalf of whichever QP the message arrived on: every QP
 * attached to the SRQ (RC, UD; XRC_RECV QPs of the same XRC domain) shares
 * the WQEs, and a QP that enters ERR flushes none of them: they belong to
 * the SRQ.
 *
 * The SRQ limit is a word in the ring: the consumer that leaves fewer WQEs
 * than the armed limit disarms it (CAS to 0) and counts the disarm; the
 * owner's progress thread then raises IBV_EVENT_SRQ_LIMIT_REACHED once per
 * disarm (srq_limit_reached), within one progress tick (10 ms), even if the
 * application armed the limit again meanwhile.
 */
#pragma once

#include "srq.h"

#include <infiniband/verbs.h>

namespace shmverbs {

/* Allocates and publishes the ring of a new SRQ (create_srq). 0 or ENOMEM;
 * a broker that cannot be reached leaves the SRQ usable in this process
 * only (logged, as for QPs). */
int srq_ring_attach(Srq &srq);
/* Withdraws and frees it (destroy_srq). */
void srq_ring_detach(Srq &srq);
/* Arms (limit > 0) or disarms the limit word (modify_srq, srq.lock held). */
void srq_ring_set_limit(Srq &srq, uint32_t limit);
/* The limit armed now: 0 once a consumer disarmed it (query_srq). */
uint32_t srq_ring_limit(const Srq &srq);
/* What a consumer does after a take that left `left` WQEs: disarms an armed
 * limit above it, for the owner's poller to raise the event (the test
 * hook shmverbs_inject_srq_posted). */
void srq_ring_note_left(Srq &srq, uint64_t left);

/* WQEs posted and not yet taken by a sender: a snapshot, since senders in
 * any process take them meanwhile. */
uint64_t srq_ring_outstanding(const Srq &srq);

/* ibv_post_srq_recv(): EINVAL for a bad SGE count, ENOMEM when max_wr WQEs
 * are outstanding; *bad_wr names the first WR not posted. */
int post_srq_recv(Srq &srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

} // namespace shmverbs
