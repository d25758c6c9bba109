/* SPDX-License-Identifier: MIT */
/*
 * The producer's side of the CQ ring (protocol: shm_layout.h CqRing), inline
 * for the data path, which writes a completion or two per WR: the common
 * case (the hinted index free, no channel to kick) is a few loads, the claim
 * CAS and the stores of the entry, with nothing built on the stack and
 * copied again and no call; whatever is out of the ordinary (the hint
 * stale, the ring full, a channel whose arm must be looked at, a clock to
 * read) is out of line in lib/cq.cpp, and so is cq_ring_produce() of a
 * whole Completion (cq.h), which takes the same protocol.
 */
#pragma once

#include "cq.h"
#include "mr.h"
#include "shm_layout.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>

namespace shmverbs {

namespace cq_detail {

/* The CQ whose ibv_start_poll() batch this thread is inside, if any
 * (lib/cq.cpp deliver_completion()). */
extern thread_local __attribute__((tls_model("initial-exec"))) Cq *polling_batch;

/* A ring's slot array as its header's word names it (no check: the
 * caller's, CqTarget). */
struct RingArray {
	shm::CqEntry *slots;
	unsigned lg;   /* log2 of the capacity */
	uint64_t mask; /* the capacity - 1 */
	uint32_t capacity() const { return uint32_t(mask + 1); }
	shm::CqEntry *at(uint64_t index) const { return &slots[index & mask]; }
};

inline RingArray ring_array(const shm::CqRing &ring, uint64_t word)
{
	auto *base = const_cast<char *>(reinterpret_cast<const char *>(&ring));
	const unsigned lg = shm::cq_array_log2(word);
	return {reinterpret_cast<shm::CqEntry *>(base + shm::cq_array_delta(word)), lg,
		(uint64_t(1) << lg) - 1};
}

/* The array a ring of this process names now. Acquire: pairs with the
 * resize's release store, after which the new array's slots are set. */
inline RingArray current_array(const shm::CqRing &ring)
{
	return ring_array(ring, ring.array.load(std::memory_order_acquire));
}

/* Whether `word` names an array the target may use: 64-byte aligned, of
 * 2 to 2^30 slots, inside the owner's mapping. Taken on when it is. */
inline bool adopt_array(CqTarget &t, uint64_t word)
{
	const int64_t delta = shm::cq_array_delta(word);
	const unsigned lg = shm::cq_array_log2(word);
	if (lg < 1 || lg > 30 || (delta & 63) || delta < -t.before || delta > t.after ||
	    (int64_t(sizeof(shm::CqEntry)) << lg) > t.after - delta)
		return false;
	t.array = word;
	t.slots = ring_array(*t.ring, word).slots;
	t.lg = lg;
	t.mask = (uint64_t(1) << lg) - 1;
	return true;
}

/* The claim when the hinted index was not free for us, from a fresh look
 * at cons (full: the overrun word, ENOSPC). The claimed entry, its index in
 * `p` and tag in `tag`; nullptr with `err` set when the ring took nothing:
 * EAGAIN when the array is being moved (`p`: the slot found moved). */
shm::CqEntry *claim_slow(shm::CqRing &ring, uint64_t word, uint64_t pid, uint64_t cons,
			 uint64_t &p, uint64_t &tag, bool *overrun_now, uint64_t *cons_seen,
			 int &err);
/* After a claim found slot `p` of the array `word` moved: waits until the
 * ring names another array or the slot is free again (a resize that gave
 * up). false: neither within 10 s (the owner stopped mid-resize), or the
 * owner died (`owner_alive`: its word, nullptr for our own ring). */
bool wait_moved(const shm::CqRing &ring, uint64_t word, uint64_t p, const int *owner_alive);
/* A completion the producer cannot place (the ring is full, or stayed
 * moved: wait_moved() false): the CQ overruns, as a device's CQ that lost
 * a CQE, unless it ignores overruns; the owner raises IBV_EVENT_CQ_ERR.
 * *overrun_now: this call overran it first. ENOSPC. */
int mark_overrun(shm::CqRing &ring, bool *overrun_now);
/* The publication for a ring whose CQ has a channel: the arm looked at
 * before and after the seq_cst store of `ready`, the token written by the
 * producer that disarmed it. */
void publish_with_channel(shm::CqRing &ring, shm::CqEntry &e, uint64_t ready, bool solicited,
			  CqChannel channel);
uint64_t monotonic_ns();
/* deliver_send_completion() from inside a poll batch of the CQ, or while
 * that batch holds completions back (Cq::deferred): out of line, rare. */
int defer_send_completion(Cq &cq, uint64_t wr_id, enum ibv_wc_status status,
			  enum ibv_wc_opcode opcode, uint32_t qp_num, uint32_t byte_len, SqSeq sq,
			  uint32_t wc_flags);
/* Raises IBV_EVENT_CQ_ERR once for an overrun that any producer (maybe in
 * another process) recorded in the ring. Any thread, with or without the
 * CQ's lock. */
void report_overrun(Cq &cq);

/* What fill_entry() (lib/cq.cpp) writes for the Completion a
 * PlainCompletion stands for, without building it; its last word is the
 * time, 0 here, which produce() overwrites in a ring that reports
 * timestamps. */
inline void fill_plain(shm::CqEntry &e, const PlainCompletion &c)
{
	e.wr_id = c.wr_id;
	e.status = c.status;
	e.opcode = c.opcode;
	e.vendor_err = 0;
	e.byte_len = c.byte_len;
	e.imm_data = c.imm_data;
	e.qp_num = c.qp_num;
	e.src_qp = c.src_qp;
	e.wc_flags = c.wc_flags;
	e.pkey_index = c.pkey_index;
	e.slid = c.slid;
	e.sl = c.sl;
	e.dlid_path_bits = 0;
	e.solicited = c.solicited;
	e.raised_event = 0;
	e.timestamp_ns = 0;
}

/* The producer's protocol; `fill(entry)` writes every field of a claimed
 * entry but its state (and the timestamp, unless `stamped`: fill() wrote
 * it, the test hook). `solicited`: the completion counts as solicited. */
template <typename Fill>
[[gnu::always_inline]] inline int produce(CqTarget &t, bool solicited, bool stamped, Fill &&fill,
					  CqChannel channel, bool *overrun_now,
					  uint64_t *cons_seen)
{
	shm::CqRing &ring = *t.ring;
	if (overrun_now)
		*overrun_now = false;
	if (ring.overrun.load(std::memory_order_acquire)) [[unlikely]]
		return ENOSPC; /* an overrun CQ is in error for good */
	const uint64_t pid = own_pid();
	shm::CqEntry *e;
	uint64_t p, tag;
	for (;;) {
		/* The array, on the line of `limit` and `overrun`. Acquire:
		 * a moved ring's new slots are set before it is named. */
		const uint64_t word = ring.array.load(std::memory_order_acquire);
		if (word != t.array && !adopt_array(t, word)) [[unlikely]]
			return EFAULT; /* a corrupt peer: the completion is lost */
		const RingArray a = {t.slots, t.lg, t.mask};
		/* cons only grows, so a copy never overstates the room. Pairs
		 * with the consumer's release store of cons. */
		const uint64_t cons =
			cons_seen ? *cons_seen : ring.cons.load(std::memory_order_acquire);
		/* Where the last producer claimed (a hint: see shm_layout.h
		 * CqRing). */
		p = ring.prod.load(std::memory_order_relaxed);
		const uint32_t limit =
			std::min(ring.limit.load(std::memory_order_relaxed), a.capacity() - 1);
		tag = shm::cq_slot_tag(p, a.lg);
		e = a.at(p);
		uint64_t st = shm::cq_slot_free | tag;
		/* The claim carries our pid: if we die from here on, the
		 * consumer sees who held the slot. Acquire pairs with the
		 * consumer's release store that freed it. */
		if (p >= cons && p - cons < limit &&
		    e->state.compare_exchange_strong(st, shm::cq_slot_claimed | tag | pid,
						     std::memory_order_acquire,
						     std::memory_order_relaxed)) [[likely]]
			break;
		int err = 0;
		e = claim_slow(ring, word, pid, cons, p, tag, overrun_now, cons_seen, err);
		if (e)
			break;
		if (err != EAGAIN)
			return err;
		if (!wait_moved(ring, word, p, t.owner_alive))
			return mark_overrun(ring, overrun_now);
	}
	/* For the next producer; a plain store, as it is only a hint, not
	 * moved back when a faster producer moved it further meanwhile. */
	if (ring.prod.load(std::memory_order_relaxed) <= p)
		ring.prod.store(p + 1, std::memory_order_relaxed);
	fill(*e);
	/* The completion's time is when it is written; only CQs that report
	 * it pay for the clock. */
	if (ring.timestamps && !stamped) [[unlikely]]
		e->timestamp_ns = monotonic_ns();
	const uint64_t ready = shm::cq_slot_ready | tag;
	if (!channel.any()) {
		/* No event can be delivered: the release store pairs with the
		 * consumer's load of the state, and nothing else is ordered. */
		e->state.store(ready, std::memory_order_release);
		return 0;
	}
	publish_with_channel(ring, *e, ready, solicited, channel);
	return 0;
}

} // namespace cq_detail

[[gnu::always_inline]] inline int cq_ring_produce(CqTarget &target, const PlainCompletion &c,
						  CqChannel channel, uint64_t *cons_seen)
{
	return cq_detail::produce(
		target, c.solicited || c.status != IBV_WC_SUCCESS, false,
		[&](shm::CqEntry &e) { cq_detail::fill_plain(e, c); }, channel, nullptr,
		cons_seen);
}

inline int deliver_send_completion(Cq &cq, CqTarget &target, uint64_t wr_id,
				   enum ibv_wc_status status, enum ibv_wc_opcode opcode,
				   uint32_t qp_num, uint32_t byte_len, SqSeq sq,
				   uint32_t wc_flags = 0)
{
	if (cq_detail::polling_batch == &cq || cq.deferring.load(std::memory_order_acquire)) [[unlikely]]
		return cq_detail::defer_send_completion(cq, wr_id, status, opcode, qp_num, byte_len,
							sq, wc_flags);
	/* Built here and copied field by field by fill_plain(): inline, the
	 * compiler stores the constants straight into the entry. */
	const PlainCompletion c{wr_id,	     status,  opcode, byte_len,
				0,	     qp_num,  sq.seq, wc_flags,
				false,	     uint16_t(sq.slot >> 16), 0,
				uint16_t(sq.slot)};
	bool overrun_now = false;
	const int err = cq_detail::produce(
		target, status != IBV_WC_SUCCESS, false,
		[&](shm::CqEntry &e) { cq_detail::fill_plain(e, c); },
		CqChannel::of(cq.channel ? cq.channel->ibv.fd : -1), &overrun_now, nullptr);
	if (overrun_now) [[unlikely]]
		cq_detail::report_overrun(cq);
	return err;
}

} // namespace shmverbs
