/* SPDX-License-Identifier: MIT */
/*
 * The data path's small locks, written here because a post or a receive
 * repost takes one per call and std::mutex's pthread calls cost several
 * times their locked instructions (the CQ's recursive PollLock, which may
 * sleep, is in lib/cq.h). Both are biased (LockBias below): the thread that
 * keeps taking a lock alone takes it with plain stores.
 */
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>

namespace shmverbs {

/* This thread's identity for the locks (its address; initial-exec: one
 * %fs-relative lea, no __tls_get_addr). A thread that exits leaves its
 * address to a later one, which then counts as the same thread: harmless,
 * the first can no longer be inside a lock. */
extern thread_local __attribute__((tls_model("initial-exec"))) char lock_thread_tag;
inline const void *this_thread_tag() { return &lock_thread_tag; }

/* Whether locks may be biased in this process: membarrier(2)'s private
 * expedited barrier is registered (tried once), and SHMVERBS_LOCK_BIAS is
 * not 0. */
bool lock_bias_available();
/* A full memory barrier in every thread of this process that is running
 * (membarrier); after fork() it registers the child first. */
void lock_bias_barrier();

inline void cpu_pause()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/*
 * The bias of a process-local lock towards one thread, its owner, which then
 * takes and drops the lock with plain stores and loads. A lock and unlock
 * cost 2.1 ns with the locked instruction and 1.1 ns so, 4.2 and 2.4 ns
 * with a 64-byte store before and inside each (a loop of 2M, medians of 15),
 * and a post or a poll takes two or three locks (queue-bench, UD SEND
 * signaled each with every lock's locked instruction removed: 50.0 -> 45.5
 * ns per WR).
 *
 * The owner enters by storing busy = 1 and then reading `revoked`; another
 * thread revokes the bias by storing revoked = 1, running a heavy barrier
 * (membarrier: a full fence in every running thread of the process) and
 * then waiting for busy = 0. The heavy barrier does for both sides what a
 * fence between the store and the load would do on the owner's side only:
 * either the owner read `revoked` after the barrier and saw it (and took
 * the lock's own word instead), or its store of busy was visible when the
 * revoker read it (the asymmetric Dekker of liburcu's and folly's
 * membarrier-based barriers). The revoker holds the lock's own word
 * meanwhile, so revocations and other users of the word are serialised.
 *
 * The owner is the first thread seen to take the lock's word `claim_after`
 * times in a row, and it stays the owner for the lock's life: after a
 * revocation only it may claim the bias again (once more after that many
 * takes in a row). A thread that may still be between its load of `owner`
 * and its store of `busy` is therefore always the owner itself: a bias
 * handed to another thread could see its `busy` overwritten by a stale
 * former owner. Threads that alternate never build the streak, so a shared
 * lock costs its locked instruction and no barriers; a burst of another
 * thread costs one barrier (~0.4 us alone, a few us with IPIs).
 *
 * Every member but the owner's entry and leave() is used with the lock's
 * word held.
 */
class LockBias {
public:
	static constexpr uint32_t claim_after = 1024;

	/* The owner's way in: true when this thread holds the lock through
	 * its bias (leave() it). */
	[[gnu::always_inline]] bool enter(const void *me)
	{
		if (owner_.load(std::memory_order_relaxed) != me ||
		    busy_.load(std::memory_order_relaxed)) /* none, or ours already */
			return false;
		busy_.store(1, std::memory_order_relaxed);
		/* The CPU may let the load below pass the store above (its store
		 * buffer): the revoker's heavy barrier orders them. The compiler
		 * must not, nor hoist the critical section above the load. */
		std::atomic_signal_fence(std::memory_order_seq_cst);
		if (!revoked_.load(std::memory_order_acquire)) [[likely]]
			return true;
		busy_.store(0, std::memory_order_release);
		return false;
	}
	void leave() { busy_.store(0, std::memory_order_release); }

	/* `me` took the lock's word: revoke the bias of another thread (when
	 * live) and wait until that thread is out, or count `me`'s streak
	 * towards claiming it. */
	void settle(const void *me) { settle(me, true); }
	/* settle() for try_lock(): false when the owner is inside (the bias
	 * revoked all the same); it does not wait for it. */
	bool settle_nowait(const void *me) { return settle(me, false); }
	/* Whether `me` holds the bias now (tests). */
	bool biased_to(const void *me) const
	{
		return owner_.load(std::memory_order_relaxed) == me &&
		       !revoked_.load(std::memory_order_relaxed);
	}

private:
	bool settle(const void *me, bool wait)
	{
		const void *owner = owner_.load(std::memory_order_relaxed);
		/* Another thread's bias, or `me`'s own while `me` holds the
		 * lock through it already (taking it again is a self-deadlock,
		 * as with any SpinLock; try_lock() fails). */
		if (owner && (owner != me || busy_.load(std::memory_order_relaxed))) {
			if (!revoked_.load(std::memory_order_relaxed)) {
				revoked_.store(true, std::memory_order_relaxed);
				lock_bias_barrier();
			}
			/* Revoked now or before: the owner may still be inside
			 * (a try_lock() revoked it without waiting), and its
			 * store of busy is visible since that barrier. Pairs with
			 * its release in leave(). */
			for (unsigned spins = 0; busy_.load(std::memory_order_acquire); spins++) {
				if (!wait)
					return false;
				if (spins < 64)
					cpu_pause();
				else
					sched_yield(); /* its holder may be preempted */
			}
			if (owner != me)
				return true;
		}
		count_streak(me);
		return true;
	}
	/* The streak of `me`, the owner or (none yet) a candidate. */
	void count_streak(const void *me)
	{
		if (last_ != me) {
			last_ = me;
			streak_ = 0;
		}
		if (++streak_ >= claim_after && lock_bias_available()) {
			streak_ = 0;
			revoked_.store(false, std::memory_order_relaxed);
			owner_.store(me, std::memory_order_relaxed);
		}
	}

	std::atomic<const void *> owner_{nullptr};
	std::atomic<uint8_t> busy_{0};
	std::atomic<bool> revoked_{false};
	/* The streak: who took the word last and how many times in a row. */
	const void *last_ = nullptr;
	uint32_t streak_ = 0;
};

/*
 * The lock of a QP's send queue, of its ibv_wr_start()..ibv_wr_complete()
 * batch and of its receive queue: taking it is one locked instruction (an
 * exchange) and dropping it a plain release store, where std::mutex pays a
 * locked read-modify-write on both sides (and a call into pthread on each).
 * A post takes it once, so a sender pays the pair per WR (or per message
 * with the builders, per batch), unless the lock is biased to it (LockBias:
 * then two plain stores); a locked instruction also waits for the
 * stores before it (the payload, the completion) to drain, so the plain
 * store on unlock matters: the QP's SQ lock as a futex mutex, whose unlock
 * is an exchange, cost 2-9 ns more per post + poll (queue-bench, 6
 * interleaved runs: RC WRITE signaled each 44 -> 35 ns, UD SEND every 16th
 * 44 -> 36). libmlx5 takes a spinlock there too.
 * The critical sections are short but for a large copy, a lookup at the
 * broker or one bounded wait (flush() waiting for senders into an SRQ QP,
 * 100 ms at most), and the batch lock is held by the application between
 * its builder calls; so a waiter spins a little and then yields the CPU
 * each time it looks rather than spin on (the holder may also be
 * preempted: 2 cores, oversubscribed).
 */
class SpinLock {
public:
	[[gnu::always_inline]] void lock()
	{
		const void *me = this_thread_tag();
		if (bias_.enter(me)) [[likely]]
			biased_ = true;
		else
			lock_word(me);
	}
	bool try_lock()
	{
		const void *me = this_thread_tag();
		if (bias_.enter(me)) {
			biased_ = true;
			return true;
		}
		if (flag_.load(std::memory_order_relaxed) ||
		    flag_.exchange(true, std::memory_order_acquire))
			return false;
		if (!bias_.settle_nowait(me)) {
			flag_.store(false, std::memory_order_release);
			return false;
		}
		biased_ = false;
		return true;
	}
	[[gnu::always_inline]] void unlock()
	{
		if (biased_)
			bias_.leave();
		else
			flag_.store(false, std::memory_order_release);
	}
	bool biased_to_this_thread() const { return bias_.biased_to(this_thread_tag()); }

private:
	/* Out of line: inline, the whole of it made the callers' frames
	 * larger than the locked instruction it saves. */
	[[gnu::noinline]] void lock_word(const void *me)
	{
		while (flag_.exchange(true, std::memory_order_acquire)) {
			for (unsigned spins = 0; flag_.load(std::memory_order_relaxed); spins++) {
				if (spins < 64)
					cpu_pause();
				else
					sched_yield();
			}
		}
		bias_.settle(me);
		biased_ = false;
	}

	std::atomic<bool> flag_{false};
	/* How the holder holds it: read and written by the holder only. */
	bool biased_ = false;
	LockBias bias_;
};

} // namespace shmverbs
