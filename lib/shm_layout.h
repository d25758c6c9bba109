/* SPDX-License-Identifier: MIT */
/*
 * Every structure that lives in shared memory, in one place.
 *
 * Rules for everything here:
 *  - fixed-width types only, offsets (from the start of the owner's segment)
 *    never pointers, no locks: a peer may die at any instruction;
 *  - atomics are std::atomic of 32/64-bit integers, which are lock-free and
 *    address-free on every platform we build for (static_asserts below);
 *  - the owner writes the geometry (capacities, offsets) once before it
 *    publishes the object; a reader copies it into local variables at attach
 *    and bounds-checks it against the mapping it has, so a buggy or
 *    malicious peer can make an operation fail but never make us touch
 *    memory outside a segment;
 *  - `shm_version` changes with any layout change; a segment of another
 *    version is refused (EPROTO).
 */
#pragma once

#include "holders.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace shmverbs::shm {

constexpr uint32_t segment_magic = 0x53564d53; /* "SMVS" */
constexpr uint32_t shm_version = 11;

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

/* Number of KeyTable chunks whose offsets the header records (mr.h: 2^24
 * indices in chunks of 2^12 slots). */
constexpr uint32_t key_chunk_count = 4096;

/*
 * The start of every segment. One segment per (process, device); its memfd
 * is registered with the broker and every published object names an offset
 * in it.
 */
struct SegmentHeader {
	uint32_t magic;
	uint32_t version;
	uint64_t size;       /* bytes mapped by the owner */
	int32_t owner_pid;
	uint32_t device;
	/* The device's key table (lib/mr.h KeySlot arrays), chunk by chunk:
	 * 0 = chunk not allocated. Written once per chunk, release. */
	std::atomic<uint64_t> key_chunks[key_chunk_count];
	/* The owner's death notice: a process-shared robust pthread mutex that
	 * one thread of the owner locks at creation and holds until the
	 * process ends. Nobody else ever locks or waits on it: peers only load
	 * its futex word (the mutex's first int, glibc), whose owner-TID bits
	 * the kernel clears (setting FUTEX_OWNER_DIED) while the owner exits,
	 * before it can be reaped. So `word & FUTEX_TID_MASK` != 0 means
	 * alive, at the cost of one load instead of a kill() per operation
	 * (lib/segment.cpp). */
	alignas(8) unsigned char owner_alive[64];
};
static_assert(std::is_standard_layout_v<SegmentHeader>);

/* ---- Queue pair descriptor: what a sender needs to know about a target ---- */

constexpr uint32_t qp_magic = 0x51505154; /* "TQPQ" */

struct QpDesc {
	uint32_t magic;
	uint32_t qpn;
	uint32_t type;       /* enum ibv_qp_type */
	std::atomic<uint32_t> state; /* enum ibv_qp_state, written by the owner */
	/* Set (1) once the owner destroys the QP; senders then fail. */
	std::atomic<uint32_t> dead;
	uint32_t pdn;
	std::atomic<uint32_t> qkey;
	std::atomic<uint32_t> dest_qpn;     /* RC/UC: the connected peer */
	std::atomic<uint32_t> min_rnr_timer; /* responder's RNR NAK timer code */
	std::atomic<uint32_t> path_mtu;      /* enum ibv_mtu */
	std::atomic<uint32_t> port;
	uint32_t srqn;       /* an SRQ this QP receives from (0: its own RQ) */
	uint64_t rq_off;     /* RecvQueue, 0 when the QP has none */
	uint64_t recv_cq_off; /* CqRing of the receive completions, 0: none */
	/* Receive completions whose CQ has a channel: the owner attached the
	 * channel's eventfd to this QP's broker object, slot 0. */
	uint32_t recv_cq_has_channel;
	uint32_t reserved;
	/* Remote operations in progress on this QP, or holds kept between
	 * posts (QpEngine::held_), by processes that found no place of their
	 * own in `holders` below: destroy and reset wait (bounded) for it to
	 * drop to 0 after setting `dead` or the state. Anonymous: a count
	 * left by a process that died is waited out to the bound. */
	std::atomic<uint32_t> inflight;
	/* An error a sender found on this responder (RemoteError): the owner
	 * moves the QP to ERR and raises the event when it sees it. */
	std::atomic<uint32_t> remote_error;
	/* The responder's qp_access_flags (IBV_ACCESS_REMOTE_WRITE/READ/
	 * ATOMIC), written by the owner on every modify that sets them, 0
	 * (no remote access) from RESET. A sender checks it next to the rkey,
	 * on the line of `inflight`, which it has just written anyway. */
	std::atomic<uint32_t> access_flags;
	/* XRC_RECV: the XRC domain (Xrcd::domain) it lives in; a sender's
	 * XRC SRQ must belong to the same domain. 0 for other types. */
	uint64_t xrc_domain;
	/* Communication established (IBA 11.6.3): a sender's message found
	 * the QP (RC, UC, XRC_RECV) in RTR and set 1; the owner raises
	 * IBV_EVENT_COMM_EST and sets 2; a reset sets 0. */
	std::atomic<uint32_t> comm_est;
	/* The same count, attributed (lib/holders.h): a waiter leaves out
	 * the holds of processes that are gone and clears their entries. */
	HolderEntries holders;
};
static_assert(std::is_standard_layout_v<QpDesc>);

/* Counts one hold of process `pid` on QP `t`: in an entry of
 * `t.holders` (the index returned), or anonymously in `t.inflight`
 * (holder_anonymous). seq_cst: the Dekker pair with the waiter's store of
 * `dead` or the state, which the caller checks after. */
inline int hold_qp(QpDesc &t, uint32_t pid)
{
	const int entry = count_in(t.holders, pid);
	if (entry == holder_anonymous)
		t.inflight.fetch_add(1, std::memory_order_seq_cst);
	return entry;
}

/* Gives back a hold hold_qp() returned `entry` for. */
inline void release_qp(QpDesc &t, int entry)
{
	if (entry == holder_anonymous)
		t.inflight.fetch_sub(1, std::memory_order_release);
	else
		count_out(t.holders, entry);
}

enum RemoteError : uint32_t {
	remote_error_none = 0,
	remote_error_access = 1, /* IBV_EVENT_QP_ACCESS_ERR, QP -> ERR */
	remote_error_fatal = 2,  /* a local error on a receive: QP -> ERR */
	/* A completion of the QP found its CQ overrun (IBA's Local Work Queue
	 * Catastrophic Error): QP -> ERR, IBV_EVENT_QP_FATAL. */
	remote_error_cq = 3,
	/* A request the responder found invalid (IBA's Invalid Request Local
	 * Work Queue Error): QP -> ERR, IBV_EVENT_QP_REQ_ERR. */
	remote_error_inv_req = 4,
};

/* Leaves `error` for QP `t`'s owner unless one is pending already (the
 * first stands). */
inline void leave_remote_error(QpDesc &t, RemoteError error)
{
	uint32_t none = remote_error_none;
	t.remote_error.compare_exchange_strong(none, error, std::memory_order_release,
					       std::memory_order_relaxed);
}

/* ---- Receive queues (a QP's RQ or an SRQ) ---- */

struct RecvSge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};
static_assert(sizeof(RecvSge) == 16);

struct RecvWqe {
	uint64_t wr_id;
	uint32_t num_sge;
	/* The low 32 bits of (ring index + 1) of the WQE in this slot, stored
	 * (release) by the producer after the rest: a consumer learns that
	 * index `head` is posted from the slot it reads anyway, not from the
	 * producer's `tail` line (RecvQueue). Zeroed memory: nothing posted. */
	uint32_t seq;
	/* followed by max_sge RecvSge */
};
static_assert(sizeof(RecvWqe) == 16);
static_assert(offsetof(RecvWqe, seq) % alignof(std::atomic<uint32_t>) == 0);

constexpr uint32_t rq_magic = 0x51525152; /* "RQRQ" */

/*
 * A ring of receive WQEs. The owner is the only producer (tail); senders
 * consume (head), by CAS so that several may (SRQ, UD, XRC). A consumer
 * copies the WQE at `head` and only then CASes head forward: the producer
 * never rewrites a slot until head has passed it, so a copy taken before a
 * successful CAS is intact. Whether index `head` is posted, a consumer
 * reads in the slot (RecvWqe::seq): per message it touches the head line
 * (its own) and the slot, never the owner's tail line.
 *   producer: write slot tail; slot.seq.store(tail+1, release);
 *             tail.store(tail+1, release)
 *   consumer: h = head; slot(h).seq.load(acquire) == h+1: copy slot, head
 *             CAS h -> h+1 (acq_rel); otherwise empty if head is still h
 * `tail` stays for the owner (room) and the SRQ limit (consumers read it
 * only while a limit is armed).
 */
struct RecvQueue {
	uint32_t magic;
	uint32_t entries;  /* power of two */
	uint32_t max_sge;
	uint32_t stride;   /* bytes per slot: sizeof(RecvWqe) + 16 * max_sge */
	/* SRQs: the armed low watermark (low 32 bits, 0: not armed) and the
	 * arm it belongs to (high 32 bits, counted by the owner at each
	 * modify). A consumer that leaves fewer WQEs than the watermark CASes
	 * the low half to 0 and then counts the disarm in limit_hits; the
	 * owner raises one IBV_EVENT_SRQ_LIMIT_REACHED per disarm counted
	 * (lib/srq_ring.cpp), whatever it armed since. */
	std::atomic<uint64_t> limit;
	std::atomic<uint64_t> limit_hits;
	uint32_t srqn;     /* SRQs: their number; 0 for a QP's RQ */
	uint32_t pdn;      /* SRQs: the PD their receive buffers must be in */
	uint64_t cq_off;   /* XRC SRQs: the CqRing of their completions */
	uint32_t cq_has_channel; /* XRC SRQs: eventfd attached to the SRQ, slot 0 */
	uint32_t srq_type; /* SRQs: enum ibv_srq_type */
	uint64_t xrc_domain; /* XRC SRQs: Xrcd::domain */
	/* The indices, each on its own cache line: consumers CAS head, the
	 * owner stores tail, and neither disturbs the geometry above, which
	 * every consumer reads (a line that stays shared). */
	alignas(64) std::atomic<uint64_t> head;
	alignas(64) std::atomic<uint64_t> tail;
	/* slots follow at rq_slots_offset */
};
static_assert(offsetof(RecvQueue, head) == 64); /* the geometry fills one line */
static_assert(sizeof(RecvQueue) <= 192);
constexpr uint64_t rq_slots_offset = 192;

/* ---- Completion queue ring ---- */

/*
 * One completion as it travels through shared memory: an ibv_wc plus what
 * the ibv_cq_ex readers can report.
 */
struct CqEntry {
	/* Slot state (cq_slot_* below), for ring index i of lap L = i / capacity:
	 *   free    | tag(L)        the slot takes index i next (zeroed memory
	 *                           is free for lap 0)
	 *   claimed | tag(L) | pid  a producer owns index i and is filling it
	 *   ready   | tag(L)        published, for the consumer at index i
	 * The claim itself is a CAS free|tag -> claimed|tag|pid, so no index
	 * is ever reserved without its producer's pid on it. The producer
	 * publishes with a release store (seq_cst when the CQ has a channel:
	 * see CqRing); the consumer reads it and frees the slot for the next
	 * lap (release) after copying. The states of the slots are the ring's
	 * truth: which index is next to claim, and whether the ring is empty,
	 * is read from them, never from an index word. */
	std::atomic<uint64_t> state;
	/* The completion, laid out as struct ibv_wc (verbs.h; lib/cq.cpp
	 * asserts it field by field), so that ibv_poll_cq() copies it out in
	 * one 48-byte move and then checks `status`, which a peer wrote.
	 * `solicited` sits where ibv_wc has padding. */
	uint64_t wr_id;
	uint32_t status;     /* enum ibv_wc_status */
	uint32_t opcode;     /* enum ibv_wc_opcode */
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;   /* network order, as in ibv_wc */
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;   /* enum ibv_wc_flags */
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
	uint8_t solicited;   /* IBV_SEND_SOLICITED was set */
	/* 1: this entry raised the CQ's completion event (its producer
	 * disarmed the CQ before publishing it; see CqRing). */
	uint8_t raised_event;
	/* CLOCK_MONOTONIC ns; meaningful only in rings whose CQ reports
	 * completion timestamps (CqRing::timestamps), the only ones whose
	 * producers are bound to write it; 0 elsewhere. */
	uint64_t timestamp_ns;
};
/* One cache line per completion: a producer and the consumer exchange
 * exactly one line per entry (slots start 64-byte aligned). */
static_assert(sizeof(CqEntry) == 64);
constexpr uint64_t cq_entry_wc_offset = 8; /* where the ibv_wc image starts */
constexpr uint64_t cq_entry_wc_bytes = 48;  /* sizeof(struct ibv_wc) */
static_assert(offsetof(CqEntry, timestamp_ns) == cq_entry_wc_offset + cq_entry_wc_bytes);

constexpr uint64_t cq_slot_free = 0;
constexpr uint64_t cq_slot_claimed = 1ull << 62;
constexpr uint64_t cq_slot_ready = 1ull << 63;
/* A slot of an array the owner is moving away from (ibv_resize_cq): no
 * claim succeeds on it; the producer looks at CqRing::array again. */
constexpr uint64_t cq_slot_moved = 3ull << 62;
constexpr uint64_t cq_slot_kind_mask = 3ull << 62;
constexpr uint64_t cq_slot_tag_mask = ((1ull << 30) - 1) << 32;
constexpr uint64_t cq_slot_pid_mask = 0xffffffffull;
/* The lap tag of ring index `index` in a ring of 2^`capacity_log2` slots. */
constexpr uint64_t cq_slot_tag(uint64_t index, unsigned capacity_log2)
{
	return ((index >> capacity_log2) << 32) & cq_slot_tag_mask;
}
/* The tag of the index one lap after the one tagged `tag`: cq_slot_tag(index
 * + capacity) from cq_slot_tag(index), without the shifts. */
constexpr uint64_t cq_slot_next_lap(uint64_t tag)
{
	return (tag + (1ull << 32)) & cq_slot_tag_mask;
}
static_assert(cq_slot_next_lap(cq_slot_tag(5, 2)) == cq_slot_tag(5 + 4, 2) &&
	      cq_slot_next_lap(cq_slot_tag((1ull << 32) - 1, 2)) == cq_slot_tag(1ull << 32, 2) &&
	      cq_slot_next_lap(cq_slot_tag(((1ull << 30) - 1) << 3, 3)) == cq_slot_tag(1ull << 33, 3));

constexpr uint32_t cq_magic = 0x51435143; /* "CQCQ" */

/* CqRing::array: where the ring's slots are, as one word that a resize
 * replaces at once: log2 of their number in the top 8 bits, the signed
 * byte distance from the ring's header to the first slot in the low 56. */
constexpr uint64_t cq_array_word(int64_t delta, unsigned capacity_log2)
{
	return (uint64_t(capacity_log2) << 56) | (uint64_t(delta) & ((1ull << 56) - 1));
}
constexpr int64_t cq_array_delta(uint64_t word) { return int64_t(word << 8) >> 8; }
constexpr unsigned cq_array_log2(uint64_t word) { return unsigned(word >> 56); }
static_assert(cq_array_delta(cq_array_word(-4096, 5)) == -4096 &&
	      cq_array_log2(cq_array_word(-4096, 5)) == 5 &&
	      cq_array_delta(cq_array_word(256, 31)) == 256);

enum CqArmWord : uint32_t { cq_arm_none = 0, cq_arm_solicited = 1, cq_arm_next = 2 };

/*
 * A CQ's ring: multi-producer (the owner's own send completions and any
 * process's receive completions), single consumer (the owner, under its
 * in-process CQ lock).
 *   producer: p = max(prod, cons); if p - cons >= limit (cons re-read):
 *             overrun; CAS slot[p].state free|tag(p) -> claimed|tag(p)|pid;
 *             when the slot is taken for p (claimed or ready, or already
 *             of a later lap): p + 1 and again; prod = p + 1 (a plain
 *             store); fill; state = ready|tag(p) (release)
 *   consumer: slot[cons].state == ready|tag(cons): copy;
 *             state = free|tag(cons + capacity) (release);
 *             cons = cons + 1 (release; once per poll call)
 *             free|tag(cons): empty
 * Indices are claimed in order with no gap: every index below cons was
 * claimed, and `prod` is only a hint, a producer's (maybe stale, maybe
 * moved back by a slower producer) note of the claimed index + 1, from
 * where the next producer looks for the first free slot. So a producer
 * that dies at any point, after its claim or before moving prod, leaves
 * its pid in the slot, and the consumer skips a slot claimed by a pid that
 * no longer exists; no index word ever waits for a producer. Claiming
 * costs one locked instruction, the slot CAS.
 * Resizing beyond the array (the owner, under its CQ lock): a new array is
 * allocated; every slot of the old one that is free for its index in
 * [cons, cons + capacity) is CASed to `moved` (a producer's claim of it
 * fails, and it looks at `array` again, waiting while the word is
 * unchanged); claims that won are waited for (published, or their
 * producer dead); the published entries are copied into the new array
 * at the same indices from cons on, in order, the rest of it set free for
 * its index; prod = cons + copied; then `array` names it (release). An
 * old array is kept until the CQ is destroyed: a producer may still load
 * its slots (and fail its claim there).
 * Arming is a word here so that a producer in any process can disarm and
 * fire: it CASes `arm` to none and, if it won, bumps `fired` and then writes
 * one token to the channel's eventfd. The owner's channel code takes one
 * event per token (`fired` counts them per CQ). Only a producer that has a
 * channel to write to looks at `arm`, and only it orders its publication
 * before that look (seq_cst store of the state, against req_notify_cq's
 * seq_cst store of `arm` and its later poll): without a channel no event
 * can be delivered and the release store suffices.
 * A producer that finds the CQ armed before it publishes disarms it, bumps
 * `fired` and marks its entry (`raised_event`) first, then publishes and
 * writes the token; one that finds it armed only after publishing (the
 * arm came meanwhile) fires unmarked. The consumer returns a marked entry
 * whose event is still unread only as the first of a poll call or batch,
 * so that an application that drains a bounded number of completions per
 * event does not take, in the drain after one event, the completion of
 * the next (which would leave that event with nothing to poll).
 */
struct CqRing {
	uint32_t magic;
	uint32_t reserved0;
	std::atomic<uint32_t> limit;  /* cqe: completions held at most */
	std::atomic<uint32_t> overrun; /* 1 once the CQ overflowed */
	std::atomic<uint32_t> ignore_overrun;
	std::atomic<uint32_t> arm;     /* CqArmWord */
	std::atomic<uint64_t> fired;   /* completion events raised */
	/* 1: the CQ reports IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK),
	 * producers stamp each entry; 0: they skip the clock read. Written by
	 * the owner before the ring is used. */
	uint32_t timestamps;
	/* Resizes that gave up and freed the slots they had closed: a
	 * producer waiting on a moved slot starts its wait over when this
	 * moves (lib/cq.cpp wait_moved). */
	std::atomic<uint32_t> moves_abandoned;
	/* The slot array (cq_array_word()): right after the header at first
	 * (cq_slots_offset), elsewhere in the owner's segment once a resize
	 * outgrew it. The header never moves, so producers that found it
	 * keep it; they read this word, on the line they read `limit` and
	 * `overrun` from, at each completion. */
	std::atomic<uint64_t> array;
	/* Producers move prod, the consumer cons: one cache line each. The
	 * consumer never reads prod (it reads the slot at cons); a producer
	 * that keeps a copy of cons re-reads it only when the copy says the
	 * ring is full (cq_ring_produce's cons_seen). */
	alignas(64) std::atomic<uint64_t> prod;
	alignas(64) std::atomic<uint64_t> cons;
	/* When the CQ's recent events fired (CLOCK_MONOTONIC ns), event k
	 * at [k % 4], written by the producer that fires it before it bumps
	 * `fired`: the channel hands out the oldest first across its CQs,
	 * as the uverbs channel's event list does. */
	alignas(64) std::atomic<uint64_t> fired_ns[4];
	/* the first slot array follows at cq_slots_offset */
};
static_assert(sizeof(CqRing) <= 256);
constexpr uint64_t cq_slots_offset = 256;

static_assert(std::is_standard_layout_v<CqRing> && std::is_standard_layout_v<CqEntry> &&
	      std::is_standard_layout_v<RecvQueue> && std::is_standard_layout_v<QpDesc>);

} // namespace shmverbs::shm
