/* SPDX-License-Identifier: MIT */
/*
 * lib/fast_mutex.h: mutual exclusion under contention, including the path
 * where waiters sleep on the futex and must be woken by unlock.
 */
#include <catch2/catch.hpp>

#include "fast_mutex.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

using shmverbs::FastMutex;

TEST_CASE("FastMutex: increments under the lock are never lost", "[fastmutex]")
{
	FastMutex m;
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

TEST_CASE("FastMutex: a waiter asleep on the lock is woken by unlock", "[fastmutex]")
{
	FastMutex m;
	m.lock();
	bool got = false;
	std::thread waiter([&] {
		m.lock(); /* spins, then sleeps: the holder keeps it for 50 ms */
		got = true;
		m.unlock();
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(m.try_lock());
	m.unlock();
	/* Bounded: a lost wake-up would hang the join; the suite's timeout
	 * catches it. */
	waiter.join();
	CHECK(got);
	CHECK(m.try_lock());
	m.unlock();
}
