/* SPDX-License-Identifier: MIT */
/*
 * lib/locks.h: mutual exclusion under contention (FastMutex and SpinLock),
 * and FastMutex's path where waiters sleep on the futex and must be woken
 * by unlock.
 */
#include <catch2/catch.hpp>

#include "locks.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

using shmverbs::FastMutex;
using shmverbs::SpinLock;

TEMPLATE_TEST_CASE("locks: increments under the lock are never lost", "[fastmutex][spinlock]",
		   FastMutex, SpinLock)
{
	TestType m;
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
