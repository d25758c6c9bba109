/* SPDX-License-Identifier: MIT */
/*
 * lib/locks.h: SpinLock's mutual exclusion under contention, waiters
 * spinning and yielding while the holder is preempted.
 */
#include <catch2/catch.hpp>

#include "locks.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

using shmverbs::SpinLock;

TEST_CASE("SpinLock: increments under the lock are never lost", "[spinlock]")
{
	SpinLock m;
	/* A plain (non-atomic) read-modify-write with a pause inside: two
	 * holders at once would lose updates. */
	volatile uint64_t counter = 0;
	constexpr int threads = 4, rounds = 20000;
	std::vector<std::thread> ts;
	for (int t = 0; t < threads; t++)
		ts.emplace_back([&] {
			for (int i = 0; i < rounds; i++) {
				std::lock_guard guard(m);
				uint64_t v = counter;
				if (i % 64 == 0)
					std::this_thread::yield(); /* let others pile up */
				counter = v + 1;
			}
		});
	for (auto &t : ts)
		t.join();
	CHECK(counter == uint64_t(threads) * rounds);
}

TEST_CASE("SpinLock: a waiter past its spins gets the lock when the holder lets go", "[spinlock]")
{
	SpinLock m;
	m.lock();
	std::atomic<bool> got{false};
	std::thread waiter([&] {
		m.lock(); /* spins, then yields: the holder keeps it for 50 ms */
		got = true;
		m.unlock();
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(got);
	CHECK_FALSE(m.try_lock());
	m.unlock();
	waiter.join();
	CHECK(got);
	CHECK(m.try_lock());
	m.unlock();
}
