/* SPDX-License-Identifier: MIT */
/*
 * A mutex for the data path's per-call locks (a QP's send queue): lock and
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
 */
#pragma once

#include <linux/futex.h>
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

} // namespace shmverbs
