/* SPDX-License-Identifier: MIT */
/*
 * The data path's small lock, written here because a post or a receive
 * repost takes one per call and std::mutex's pthread calls cost several
 * times their locked instructions (the CQ's recursive PollLock, which may
 * sleep, is in lib/cq.h).
 */
#pragma once

#include <sched.h>

#include <atomic>

namespace shmverbs {

/* The pause of a spin-wait loop (lets the other hyperthread run). */
inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/*
 * The lock of a QP's send queue, of its ibv_wr_start()..ibv_wr_complete()
 * batch and of its receive queue: taking it is one locked instruction (an
 * exchange) and dropping it a plain release store, where std::mutex pays a
 * locked read-modify-write on both sides (and a call into pthread on each).
 * A post takes it once, so a sender pays the pair per WR (or per message
 * with the builders, per batch); a locked instruction also waits for the
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
	void lock()
	{
		while (flag_.exchange(true, std::memory_order_acquire))
			wait();
	}
	bool try_lock()
	{
		return !flag_.load(std::memory_order_relaxed) &&
		       !flag_.exchange(true, std::memory_order_acquire);
	}
	void unlock() { flag_.store(false, std::memory_order_release); }
	/* Whether some thread holds it (a look, no order: the caller's
	 * next lock() is what counts). */
	bool held() const { return flag_.load(std::memory_order_relaxed); }

private:
	void wait()
	{
		for (unsigned spins = 0; flag_.load(std::memory_order_relaxed); spins++) {
			if (spins < 64)
				cpu_relax();
			else
				sched_yield();
		}
	}
	std::atomic<bool> flag_{false};
};

} // namespace shmverbs
