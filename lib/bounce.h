/* SPDX-License-Identifier: MIT */
/*
 * Bounce buffers: the last path to a target's registered memory, for when it
 * cannot be shared (memshare.h) and CMA is blocked (cma.h).
 *
 * The target owns a "bounce file" (a memfd): a header and a ring of slots.
 * An initiator claims a free slot, fills in a request (and the data of a
 * write), rings the doorbell (futex), and waits on the slot; the target's
 * helper thread (BounceServer) copies between the slot and its own memory, or
 * does the atomic, and completes the slot. A transfer longer than a slot
 * keeps several chunks in flight (up to half the slots), so the helper, once
 * woken, serves them one after the other while the initiator fills the
 * next: a futex wake-up per burst rather than per chunk. Its last chunk is
 * posted only after every earlier one is done, so the last byte of a write
 * lands last (applications poll it). ~1000x the shared-memory floor per
 * small operation; correct everywhere.
 *
 * No lock lives in the shared file. A slot is owned by the initiator whose pid
 * its owner word holds; a slot owned by a dead process is reclaimed by the
 * next claimer. The helper never waits for an initiator, so a dead initiator
 * cannot hang the target; an initiator's waits are bounded and notice a dead
 * target. Every value read from the shared file is checked before use: a
 * faulty peer cannot make either side crash or write out of bounds.
 */
#pragma once

#include "result.h"

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace shmverbs::memshare {

/* ---- The shared layout (one version; both sides check it) ---- */

constexpr uint64_t kBounceMagic = 0x31434e554f424853ULL; /* "SHBOUNC1" */
constexpr uint32_t kBounceVersion = 1;

struct BounceHeader {
	uint64_t magic;
	uint32_t version;
	uint32_t nslots;
	uint32_t slot_size;    /* bytes of data per slot */
	int32_t owner_pid;     /* the target */
	std::atomic<uint32_t> doorbell; /* bumped by initiators, futex for the helper */
	uint32_t reserved0;
	uint64_t reserved[4];
};
static_assert(sizeof(BounceHeader) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

enum class BounceOp : uint32_t { write = 1, read = 2, fetch_add = 3, cmp_swap = 4 };

enum BouncePhase : uint32_t {
	kPhaseIdle = 0,    /* owned, being filled in */
	kPhaseRequest = 1, /* ready for the helper */
	kPhaseBusy = 2,    /* the helper is executing it */
	kPhaseDone = 3,    /* status/result/data valid */
};

struct BounceSlot {
	std::atomic<uint32_t> owner; /* 0 free, else the claiming initiator's pid */
	std::atomic<uint32_t> phase; /* BouncePhase; futex for the initiator */
	uint32_t op;                 /* BounceOp */
	int32_t status;              /* 0 or a positive errno */
	uint64_t addr;               /* target virtual address */
	uint64_t len;
	uint64_t operand;            /* add value, or swap value */
	uint64_t compare;
	uint64_t result;             /* the old value of an atomic */
	uint64_t reserved[1];
	/* followed by slot_size bytes of data */
};
static_assert(sizeof(BounceSlot) == 64);
static_assert(offsetof(BounceSlot, addr) == 16);

/* Bytes of the bounce file for a geometry. */
constexpr size_t bounce_file_size(uint32_t nslots, uint32_t slot_size)
{
	return sizeof(BounceHeader) + size_t{nslots} * (sizeof(BounceSlot) + slot_size);
}

/* ---- Target side ---- */

class BounceServer {
public:
	/* Whether the initiator may access [addr, addr + len) (write: store
	 * into it), and how. The data path passes its MR table check: the
	 * helper only touches memory a live registration allows. by_kernel:
	 * the pages may be absent (on-demand paging), so copies are made by
	 * the kernel and atomics fault the page in first, and a hole is
	 * EFAULT, never SIGSEGV. nullptr allows all (tests). */
	enum class Access { refused, allowed, by_kernel };
	using Validate = Access (*)(void *ctx, uint64_t addr, uint64_t len, bool write);

	/* Creates the bounce file and starts the helper thread. nslots 1-1024,
	 * slot_size a multiple of 64 in [64, 1 MiB]; EINVAL otherwise. */
	static Result<BounceServer> create(uint32_t nslots = 16, uint32_t slot_size = 64 * 1024,
					   Validate validate = nullptr, void *ctx = nullptr);
	/* Stops and joins the helper, unmaps, closes the fd. */
	~BounceServer();
	BounceServer(const BounceServer &) = delete;
	BounceServer &operator=(const BounceServer &) = delete;

	/* The bounce file, to pass to initiators (broker). Owned here. */
	int fd() const { return fd_; }
	/* Requests served so far. */
	uint64_t served() const { return served_.load(std::memory_order_relaxed); }

private:
	BounceServer() = default;
	void run();
	void execute(BounceSlot *slot);

	int fd_ = -1;
	char *base_ = nullptr;
	size_t size_ = 0;
	uint32_t nslots_ = 0, slot_size_ = 0;
	Validate validate_ = nullptr;
	void *ctx_ = nullptr;
	std::atomic<bool> stop_{false};
	std::atomic<uint64_t> served_{0};
	std::thread helper_;
};

/* ---- Initiator side ---- */

class BounceClient {
public:
	/* Maps the bounce file fd (not kept) after checking its header and size;
	 * EINVAL for anything inconsistent. timeout_ms bounds every operation. */
	static Result<BounceClient> attach(int fd, unsigned timeout_ms = 5000);
	~BounceClient();
	BounceClient(const BounceClient &) = delete;
	BounceClient &operator=(const BounceClient &) = delete;

	pid_t target_pid() const { return target_; }

private:
	friend int bounce_write(BounceClient &, uint64_t, const void *, size_t, const int *);
	friend int bounce_read(BounceClient &, void *, uint64_t, size_t, const int *);
	friend int bounce_atomic(BounceClient &, BounceOp, uint64_t, uint64_t, uint64_t,
				 uint64_t *, const int *);
	BounceClient() = default;
	/* What one operation waits for: a deadline (timeout_ms without an
	 * answer: from its start, then from its last chunk done, for all
	 * the chunks in flight) and the target's owner-alive word
	 * (shm_layout.h SegmentHeader::owner_alive, or nullptr), which tells
	 * a target that died but is not reaped yet, as kill(0) cannot. */
	struct Watch {
		uint64_t deadline_ns;
		const int *alive;
	};
	Watch watch(const int *alive) const;
	bool target_gone(const Watch &w) const;
	/* Claims a slot: 0, or ETIMEDOUT / EPIPE (target gone). */
	int claim(BounceSlot *&slot, const Watch &w);
	/* Hands the filled-in slot to the helper. */
	void post(BounceSlot *slot);
	/* Waits for a posted slot: its status, EPIPE (target gone) or ESTALE
	 * (the helper is stuck in it). */
	int wait(BounceSlot *slot, const Watch &w);
	/* Lets go of a waited-for slot, unless the target died with it or its
	 * helper still holds it; the error to report (ESTALE: ETIMEDOUT). */
	int let_go(BounceSlot *slot, int err);
	/* Moves `len` bytes at the target's `va` in slot-size chunks of `op`,
	 * pipelined (see the top of this file): fill(slot, offset, n) puts a
	 * chunk's data into its slot (a write's), done(slot, offset, n) takes
	 * a finished one's (a read's). The first error. */
	template <typename Fill, typename Done>
	int transfer(BounceOp op, uint64_t va, size_t len, Fill &&fill, Done &&done,
		     const int *alive);
	BounceSlot *slot_at(uint32_t i) const;

	char *base_ = nullptr;
	size_t size_ = 0;
	uint32_t nslots_ = 0, slot_size_ = 0;
	pid_t target_ = 0;
	unsigned timeout_ms_ = 5000;
	std::atomic<uint32_t> next_{0};
};

/* Copies len bytes to/from the target's address va through the bounce slots
 * (in slot_size chunks, in order). 0, or a positive errno: EFAULT/EACCES
 * (rejected by the target's Validate), ETIMEDOUT (no chunk done within the
 * client's timeout), EPIPE (target died). `alive`: the
 * target's owner-alive word, when the caller has its segment mapped. */
int bounce_write(BounceClient &c, uint64_t va, const void *src, size_t len,
		 const int *alive = nullptr);
int bounce_read(BounceClient &c, void *dst, uint64_t va, size_t len, const int *alive = nullptr);
/* An 8-byte atomic (op fetch_add or cmp_swap) on the 8-byte aligned va,
 * executed by the target as a CPU atomic, so it is atomic against CPU atomics
 * on that memory. *old receives the previous value. EINVAL when unaligned. */
int bounce_atomic(BounceClient &c, BounceOp op, uint64_t va, uint64_t operand, uint64_t compare,
		  uint64_t *old, const int *alive = nullptr);

} // namespace shmverbs::memshare
