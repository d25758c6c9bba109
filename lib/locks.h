/* SPDX-License-Identifier: MIT */
/*
 * The data path's two small locks, written here because a post or a
 * receive repost takes one per call and std::mutex's pthread calls cost
 * several times their locked instructions (the CQ's recursive PollLock is
 * in lib/cq.h).
 *
 * FastMutex: for a QP's send queue. Lock and
 * unlock are inline, one locked instruction each, with no library call on
 * the uncontended path. std::mutex costs ~65 instructions for the pair here
 * (two calls into pthread_mutex_lock/unlock, which also check the mutex
 * type); a post_send takes it once per call.
 *
 * The word is 0 free, 1 locked, 2 locked with possibly a sleeper. A thread
 * that finds it locked spins briefly (the holder is usually a post of a few
 * hundred nanoseconds on the other core), then marks it 2 and sleeps on the
 * futex; unlock wakes one sleeper when the word was 2. Process-private: the
 * lock lives in private memory. Usable with std::lock_guard and
 * std::unique_lock (try_lock).
 *
 * SpinLock: for a QP's receive queue (below).
 */
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace shmverbs {

class FastMutex {
public:
	FastMutex() = default;
	FastMutex(const FastMutex &) = delete;
	FastMutex &operator=(const FastMutex &) = delete;

	void lock()
	{
		if (!try_lock())
			lock_contended();
	}
	bool try_lock()
	{
		int expected = 0;
		return word_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
						     std::memory_order_relaxed);
	}
	void unlock()
	{
		if (word_.exchange(0, std::memory_order_release) == 2)
			futex(FUTEX_WAKE_PRIVATE, 1);
	}

private:
	void lock_contended()
	{
		for (int i = 0; i < 200; i++) {
			__builtin_ia32_pause();
			if (word_.load(std::memory_order_relaxed) == 0 && try_lock())
				return;
		}
		/* From here on the word says 2 while we may sleep, so that the
		 * holder's unlock wakes us; whoever gets it this way keeps the
		 * 2 (a spurious wake-up at worst). */
		while (word_.exchange(2, std::memory_order_acquire) != 0)
			futex(FUTEX_WAIT_PRIVATE, 2);
	}
	void futex(int op, int val)
	{
		syscall(SYS_futex, reinterpret_cast<int *>(&word_), op, val, nullptr, nullptr, 0);
	}

	static_assert(sizeof(std::atomic<int>) == sizeof(int));
	std::atomic<int> word_{0};
};

/*
 * The lock of a QP's receive queue (post_recv may be called by several
 * threads): taking it is one locked instruction (an exchange) and dropping
 * it a plain release store, where std::mutex pays a locked read-modify-write
 * on both sides; a receiver reposting one WQE per message pays it per
 * message. The critical section is short and never blocks; a waiter spins
 * a little and then yields the CPU, since the holder may be preempted.
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

private:
	void wait()
	{
		for (unsigned spins = 0; flag_.load(std::memory_order_relaxed); spins++) {
			if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
				__builtin_ia32_pause();
#endif
			} else {
				sched_yield();
			}
		}
	}
	std::atomic<bool> flag_{false};
};

} // namespace shmverbs
