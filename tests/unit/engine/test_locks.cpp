/* SPDX-License-Identifier: MIT */
/*
 * lib/locks.h: SpinLock's mutual exclusion under contention, waiters
 * spinning and yielding while the holder is preempted; the bias of
 * SpinLock and of the CQ's PollLock (lib/cq.h): given to the thread that
 * takes a lock alone, revoked by any other, claimed back by its owner only,
 * and never letting two threads in (also across fork()).
 */
#include <catch2/catch.hpp>

#include "cq.h"
#include "locks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

using shmverbs::LockBias;
using shmverbs::PollLock;
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

namespace {

/* Takes and drops `m` often enough in a row for its bias. */
template <typename Lock>
void take_alone(Lock &m, uint32_t times = LockBias::claim_after + 1)
{
	for (uint32_t i = 0; i < times; i++) {
		m.lock();
		m.unlock();
	}
}

/* Whether this process may bias its locks; without membarrier, or with
 * SHMVERBS_LOCK_BIAS=0 (the unit-engine-nobias run), the locks must work
 * unbiased, which the tests then check instead. */
bool bias_here()
{
	if (const char *v = std::getenv("SHMVERBS_LOCK_BIAS"); v && std::strcmp(v, "0") == 0) {
		CHECK_FALSE(shmverbs::lock_bias_available());
		return false;
	}
	if (shmverbs::lock_bias_available())
		return true;
	WARN("membarrier(PRIVATE_EXPEDITED) unavailable: locks are never biased here");
	return false;
}

} // namespace

TEST_CASE("SpinLock: the thread that takes it alone is given its bias, no other", "[spinlock][bias]")
{
	SpinLock m;
	take_alone(m, LockBias::claim_after - 1);
	CHECK_FALSE(m.biased_to_this_thread()); /* a streak, not yet long enough */
	take_alone(m, 2);
	CHECK(m.biased_to_this_thread() == bias_here());
	bool other_biased = true;
	std::thread([&] { other_biased = m.biased_to_this_thread(); }).join();
	CHECK_FALSE(other_biased);
}

TEST_CASE("SpinLock: another thread's lock() revokes the bias and waits for its owner to leave",
	  "[spinlock][bias]")
{
	SpinLock m;
	take_alone(m);
	const bool biased = bias_here();
	CHECK(m.biased_to_this_thread() == biased);
	m.lock(); /* through the bias */
	std::atomic<bool> got{false};
	std::thread other([&] {
		m.lock();
		got = true;
		m.unlock();
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(got); /* the owner is inside */
	m.unlock();
	other.join();
	CHECK(got);
	CHECK_FALSE(m.biased_to_this_thread()); /* revoked */
	/* The owner goes through the word now, as the others do. */
	m.lock();
	std::thread([&] { CHECK_FALSE(m.try_lock()); }).join();
	m.unlock();
}

TEST_CASE("SpinLock: try_lock() fails, without waiting, while the biased owner is inside",
	  "[spinlock][bias]")
{
	SpinLock m;
	take_alone(m);
	const bool biased = bias_here();
	m.lock();
	CHECK_FALSE(m.try_lock()); /* the owner itself: taking it twice is refused */
	auto t0 = std::chrono::steady_clock::now();
	bool took = true;
	std::thread([&] { took = m.try_lock(); }).join();
	CHECK_FALSE(took);
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
	CHECK_FALSE(m.biased_to_this_thread()); /* the failed try revoked it all the same */
	m.unlock();
	if (biased) {
		/* Now free, and an ordinary lock: the other thread takes it. */
		std::thread([&] {
			took = m.try_lock();
			if (took)
				m.unlock();
		}).join();
		CHECK(took);
	}
}

TEST_CASE("SpinLock: after a revocation only the first owner claims the bias back",
	  "[spinlock][bias]")
{
	SpinLock m;
	take_alone(m);
	const bool biased = bias_here();
	bool other_biased = true;
	std::thread([&] {
		take_alone(m, 3 * LockBias::claim_after);
		other_biased = m.biased_to_this_thread();
	}).join();
	CHECK_FALSE(other_biased); /* a long streak, but not the owner */
	CHECK_FALSE(m.biased_to_this_thread());
	take_alone(m);
	CHECK(m.biased_to_this_thread() == biased);
}

TEST_CASE("SpinLock: no update is lost while the bias is revoked and claimed back over and over",
	  "[spinlock][bias]")
{
	SpinLock m;
	volatile uint64_t counter = 0;
	constexpr int bursts = 12;
	constexpr uint32_t owner_burst = LockBias::claim_after + 200, other_burst = 50;
	auto add = [&](uint32_t n, bool slow) {
		for (uint32_t i = 0; i < n; i++) {
			std::lock_guard guard(m);
			uint64_t v = counter;
			if (slow && i % 16 == 0)
				std::this_thread::yield(); /* inside: the revoker must wait */
			counter = v + 1;
		}
	};
	std::atomic<int> owner_done{0};
	std::thread owner([&] {
		for (int b = 0; b < bursts; b++) {
			add(owner_burst, true);
			owner_done = b + 1;
		}
	});
	std::thread other([&] {
		for (int b = 0; b < bursts; b++) {
			while (owner_done.load() <= b && owner_done.load() < bursts)
				std::this_thread::yield();
			add(other_burst, false);
		}
	});
	owner.join();
	other.join();
	CHECK(counter == uint64_t(bursts) * (owner_burst + other_burst));
}

TEST_CASE("PollLock: recursive through its bias, and another thread waits for the outermost unlock",
	  "[polllock][bias]")
{
	PollLock m;
	take_alone(m);
	CHECK(m.biased_to_this_thread() == bias_here());
	m.lock();
	m.lock(); /* recursion: the same thread */
	std::atomic<bool> got{false};
	std::thread other([&] {
		m.lock();
		got = true;
		m.unlock();
	});
	m.unlock();
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(got); /* still held once */
	m.unlock();
	other.join();
	CHECK(got);
	CHECK_FALSE(m.biased_to_this_thread());
}

TEST_CASE("PollLock: no update is lost between a biased owner and sleeping waiters", "[polllock][bias]")
{
	PollLock m;
	take_alone(m);
	volatile uint64_t counter = 0;
	constexpr int threads = 3, rounds = 5000;
	std::vector<std::thread> ts;
	auto add = [&] {
		for (int i = 0; i < rounds; i++) {
			std::lock_guard guard(m);
			uint64_t v = counter;
			if (i % 64 == 0)
				std::this_thread::yield();
			counter = v + 1;
		}
	};
	for (int t = 0; t < threads; t++)
		ts.emplace_back(add);
	add(); /* the owner, with the others */
	for (auto &t : ts)
		t.join();
	CHECK(counter == uint64_t(threads + 1) * rounds);
}

TEST_CASE("SpinLock: a forked child revokes the bias it inherited (membarrier registers anew)",
	  "[spinlock][bias][fork]")
{
	SpinLock m;
	take_alone(m);
	const bool biased = bias_here();
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		alarm(20); /* a hang fails the test rather than the suite's timeout */
		/* This thread is the owner here too (same thread address). */
		bool ok = m.biased_to_this_thread() == biased;
		volatile uint64_t counter = 0;
		auto add = [&](int n) {
			for (int i = 0; i < n; i++) {
				std::lock_guard guard(m);
				counter = counter + 1;
			}
		};
		m.lock();
		std::thread other([&] { add(1000); });
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
		counter = counter + 1;
		m.unlock();
		add(1000);
		other.join();
		ok = ok && counter == 2001 && !m.biased_to_this_thread();
		_exit(ok ? 0 : 1);
	}
	int status = 0;
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);
}
