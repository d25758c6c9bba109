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

inline shm::CqEntry *slot_at(shm::CqRing &ring, uint32_t capacity, uint64_t index)
{
	auto *slots = reinterpret_cast<shm::CqEntry *>(reinterpret_cast<char *>(&ring) +
						       shm::cq_slots_offset);
	return &slots[index & (capacity - 1)];
}

/* The claim when the hinted index was not free for us, from a fresh look
 * at cons (full: the overrun word, ENOSPC). The claimed entry, its index in
 * `p` and tag in `tag`; nullptr with `err` set when the ring took nothing. */
shm::CqEntry *claim_slow(shm::CqRing &ring, uint32_t capacity, uint64_t pid, uint64_t cons,
			 uint64_t &p, uint64_t &tag, bool *overrun_now, uint64_t *cons_seen,
			 int &err);
/* The publication for a ring whose CQ has a channel: the arm looked at
 * before and after the seq_cst store of `ready`, the token written by the
 * producer that disarmed it. */
void publish_with_channel(shm::CqRing &ring, shm::CqEntry &e, uint64_t ready, bool solicited,
			  CqChannel channel);
uint64_t monotonic_ns();
/* deliver_send_completion() from inside a poll batch of the CQ, and the
 * report of an overrun it caused: out of line, rare. */
int defer_send_completion(Cq &cq, uint64_t wr_id, enum ibv_wc_status status,
			  enum ibv_wc_opcode opcode, uint32_t qp_num, uint32_t byte_len);
void report_overrun_locked(Cq &cq);

/* What fill_entry() (lib/cq.cpp) writes for the Completion a
 * PlainCompletion stands for, without building it; its last word is the
 * RQ head (0 where none is given), which produce() overwrites with the
 * time in a ring that reports timestamps. */
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
	e.pkey_index = 0;
	e.slid = c.slid;
	e.sl = c.sl;
	e.dlid_path_bits = 0;
	e.solicited = c.solicited;
	e.raised_event = 0;
	e.rq_head = c.rq_head;
}

/* The producer's protocol; `fill(entry)` writes every field of a claimed
 * entry but its state (and the timestamp, unless `stamped`: fill() wrote
 * it, the test hook). `solicited`: the completion counts as solicited. */
template <typename Fill>
[[gnu::always_inline]] inline int produce(shm::CqRing &ring, uint32_t capacity, bool solicited,
					  bool stamped, Fill &&fill, CqChannel channel,
					  bool *overrun_now, uint64_t *cons_seen)
{
	if (overrun_now)
		*overrun_now = false;
	if (ring.overrun.load(std::memory_order_acquire)) [[unlikely]]
		return ENOSPC; /* an overrun CQ is in error for good */
	const uint64_t pid = own_pid();
	/* cons only grows, so a copy never overstates the room. Pairs with
	 * the consumer's release store of cons. */
	const uint64_t cons = cons_seen ? *cons_seen : ring.cons.load(std::memory_order_acquire);
	/* Where the last producer claimed (a hint: see shm_layout.h CqRing). */
	uint64_t p = ring.prod.load(std::memory_order_relaxed);
	const uint32_t limit = std::min(ring.limit.load(std::memory_order_relaxed), capacity - 1);
	uint64_t tag = shm::cq_slot_tag(p, unsigned(__builtin_ctz(capacity)));
	shm::CqEntry *e = slot_at(ring, capacity, p);
	uint64_t st = shm::cq_slot_free | tag;
	/* The claim carries our pid: if we die from here on, the consumer
	 * sees who held the slot. Acquire pairs with the consumer's release
	 * store that freed it. */
	if (p < cons || p - cons >= limit ||
	    !e->state.compare_exchange_strong(st, shm::cq_slot_claimed | tag | pid,
					      std::memory_order_acquire,
					      std::memory_order_relaxed)) [[unlikely]] {
		int err = 0;
		e = claim_slow(ring, capacity, pid, cons, p, tag, overrun_now, cons_seen, err);
		if (!e)
			return err;
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

[[gnu::always_inline]] inline int cq_ring_produce(shm::CqRing &ring, uint32_t capacity,
						  const PlainCompletion &c, CqChannel channel,
						  uint64_t *cons_seen)
{
	return cq_detail::produce(
		ring, capacity, c.solicited || c.status != IBV_WC_SUCCESS, false,
		[&](shm::CqEntry &e) { cq_detail::fill_plain(e, c); }, channel, nullptr,
		cons_seen);
}

inline int deliver_send_completion(Cq &cq, uint64_t wr_id, enum ibv_wc_status status,
				   enum ibv_wc_opcode opcode, uint32_t qp_num, uint32_t byte_len)
{
	if (cq_detail::polling_batch == &cq) [[unlikely]]
		return cq_detail::defer_send_completion(cq, wr_id, status, opcode, qp_num, byte_len);
	/* Built here and copied field by field by fill_plain(): inline, the
	 * compiler stores the constants straight into the entry. */
	const PlainCompletion c{wr_id, status, opcode, byte_len, 0, qp_num, 0, 0, false, 0, 0};
	bool overrun_now = false;
	const int err = cq_detail::produce(
		*cq.ring, cq.capacity, status != IBV_WC_SUCCESS, false,
		[&](shm::CqEntry &e) { cq_detail::fill_plain(e, c); },
		CqChannel::of(cq.channel ? cq.channel->ibv.fd : -1), &overrun_now, nullptr);
	if (overrun_now) [[unlikely]]
		cq_detail::report_overrun_locked(cq);
	return err;
}

} // namespace shmverbs
