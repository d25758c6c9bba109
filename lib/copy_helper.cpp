/* SPDX-License-Identifier: MIT */
#include "copy_helper.h"
#include "fork.h"
#include "locks.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace shmverbs {

namespace {

/*
 * One job at a time: a poster that finds another one's job running copies
 * alone. The job's chunks are claimed through one word, gen:32 front:16
 * back:16: the poster takes chunks from the front, the helper from the
 * back, each by a compare-and-swap that also checks the generation, so a
 * helper that looked at an older job claims nothing of a newer one. Taking
 * the two ends keeps each CPU on the same half of a buffer copied again and
 * again, its lines in that CPU's cache.
 *
 * The job's pointers are plain fields: the poster writes them before it
 * publishes the generation (release), the helper reads them only after a
 * claim in that generation (acquire), and the poster rewrites them only
 * after every claimed chunk is counted done (release by the helper,
 * acquire by the poster).
 */
constexpr size_t chunk = 64 * 1024;
static_assert(copy_split_min / chunk >= 2);
/* The most chunks the 16-bit ends can count. */
constexpr size_t max_chunks = 0xffff;

/* How long the helper waits for the next job before it sleeps: a stream
 * of large WRs posts the next one within microseconds, while a futex
 * wake-up costs ~55 us on this class of machine (more than a 1 MiB copy).
 * For the first `hot_window` it spins; then it waits yielding its CPU, so
 * that a thread with work there (the peer of a ping-pong, whose reply
 * starts when our copy ends) runs first. */
constexpr auto hot_window = std::chrono::microseconds(5);
constexpr auto spin_window = std::chrono::microseconds(100);
/* The helper is worth having only while its CPU is free. A poster copies
 * alone for a rest of some jobs when it waited `stall_limit` for the
 * helper's chunk (the helper lost its CPU halfway through it), or when
 * the helper, awake, took no part in `max_misses` jobs in a row (it did
 * not get its CPU in time); the helper sleeps meanwhile. The rest doubles from
 * `min_rest` to `max_rest` while it keeps happening (a peer polling on
 * the helper's CPU) and is back to `min_rest` after a job the helper
 * shared without a stall (one preemption costs little). */
constexpr auto stall_limit = std::chrono::microseconds(50);
constexpr uint32_t max_misses = 4;
constexpr uint32_t min_rest = 8, max_rest = 256;

struct Helper {
	alignas(64) std::atomic<uint64_t> claim{0};
	alignas(64) std::atomic<uint32_t> done{0};
	/* Chunks the helper copied (for tests). */
	std::atomic<uint64_t> helper_chunks{0};
	/* 1 while the helper sleeps (its futex word) or has yet to start;
	 * the poster that finds it 1 takes it to 0 and wakes it. */
	alignas(64) std::atomic<uint32_t> sleeping{1};
	/* Owned by the poster that holds `busy`. */
	alignas(64) std::atomic<bool> busy{false};
	uint32_t gen = 0;
	uint32_t copy_alone = 0;
	uint32_t misses = 0;
	uint32_t next_rest = min_rest;
	bool started = false;
	bool usable = true;
	char *to = nullptr;
	const char *from = nullptr;
	size_t n = 0;
};

Helper *&helper_ptr()
{
	static Helper *h = new Helper; /* never freed: the thread outlives exit handlers */
	return h;
}

constexpr uint64_t pack(uint32_t gen, uint32_t front, uint32_t back)
{
	return uint64_t(gen) << 32 | uint64_t(front) << 16 | back;
}

/* A chunk of job `gen`, from the front or the back; false when none is left
 * or the job is another one. */
bool take(Helper &h, uint32_t gen, bool front, uint32_t &index)
{
	uint64_t c = h.claim.load(std::memory_order_acquire);
	for (;;) {
		const uint32_t f = uint32_t(c >> 16) & 0xffff, b = uint32_t(c) & 0xffff;
		if (uint32_t(c >> 32) != gen || f >= b)
			return false;
		index = front ? f : b - 1;
		const uint64_t next = front ? pack(gen, f + 1, b) : pack(gen, f, b - 1);
		if (h.claim.compare_exchange_weak(c, next, std::memory_order_acquire,
						  std::memory_order_acquire))
			return true;
	}
}

void copy_chunk(Helper &h, uint32_t index)
{
	const size_t at = size_t(index) * chunk;
	std::memcpy(h.to + at, h.from + at, std::min(chunk, h.n - at));
	h.done.fetch_add(1, std::memory_order_release);
}

long futex(std::atomic<uint32_t> &word, int op, uint32_t value)
{
	return syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), op | FUTEX_PRIVATE_FLAG,
		       value, nullptr, nullptr, 0);
}

[[noreturn]] void helper_main(Helper *h)
{
	pthread_setname_np(pthread_self(), "shmverbs-copy");
	h->sleeping.store(0, std::memory_order_relaxed);
	uint32_t seen = uint32_t(h->claim.load(std::memory_order_acquire) >> 32);
	for (;;) {
		const auto idle_since = std::chrono::steady_clock::now();
		uint32_t gen;
		while ((gen = uint32_t(h->claim.load(std::memory_order_acquire) >> 32)) == seen) {
			const auto idle = std::chrono::steady_clock::now() - idle_since;
			if (idle < hot_window) {
				cpu_relax();
				continue;
			}
			if (idle < spin_window) {
				sched_yield();
				continue;
			}
			/* Asleep: a poster that publishes after the store
			 * below sees it and wakes us; one that published
			 * before it is seen by the check. */
			h->sleeping.store(1, std::memory_order_seq_cst);
			if (uint32_t(h->claim.load(std::memory_order_seq_cst) >> 32) == seen)
				futex(h->sleeping, FUTEX_WAIT, 1);
			h->sleeping.store(0, std::memory_order_relaxed);
		}
		seen = gen;
		uint32_t index;
		while (take(*h, gen, false, index)) {
			copy_chunk(*h, index);
			h->helper_chunks.fetch_add(1, std::memory_order_relaxed);
		}
	}
}

bool more_than_one_cpu()
{
	cpu_set_t set;
	return sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1;
}

bool wanted()
{
	const char *v = std::getenv("SHMVERBS_COPY_HELPER");
	if (v && std::strcmp(v, "0") == 0)
		return false;
	return more_than_one_cpu();
}

/* Starts the helper with every signal blocked but those a fault raises: it
 * takes no signal meant for the application's threads, and a chunk that
 * faults (memory the application write-protects to track its writes, a
 * page memshare is switching) runs the handler as the posting thread
 * would; blocked, the kernel would kill the process. False when it cannot
 * run. */
bool start(Helper &h)
{
	sigset_t all, old;
	sigfillset(&all);
	for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL})
		sigdelset(&all, sig);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	bool ok = true;
	try {
		std::thread(helper_main, &h).detach();
	} catch (const std::system_error &) {
		ok = false;
	}
	pthread_sigmask(SIG_SETMASK, &old, nullptr);
	return ok;
}

} // namespace

void copy_split(void *to, const void *from, size_t n)
{
	Helper &h = *helper_ptr();
	if (n / chunk > max_chunks || h.busy.exchange(true, std::memory_order_acquire)) {
		std::memcpy(to, from, n);
		return;
	}
	if (!h.started) {
		h.started = true;
		h.usable = wanted() && start(h);
	}
	if (!h.usable || h.copy_alone) {
		h.copy_alone -= h.copy_alone ? 1 : 0;
		h.busy.store(false, std::memory_order_release);
		std::memcpy(to, from, n);
		return;
	}
	h.to = static_cast<char *>(to);
	h.from = static_cast<const char *>(from);
	h.n = n;
	const uint32_t chunks = uint32_t((n + chunk - 1) / chunk);
	h.done.store(0, std::memory_order_relaxed);
	const uint32_t gen = ++h.gen;
	h.claim.store(pack(gen, 0, chunks), std::memory_order_seq_cst);
	/* A helper woken now arrives late for this job (maybe the next): not
	 * a miss. */
	const bool woken = h.sleeping.load(std::memory_order_seq_cst) && h.sleeping.exchange(0);
	if (woken)
		futex(h.sleeping, FUTEX_WAKE, 1);

	uint32_t index, mine = 0;
	while (take(h, gen, true, index)) {
		copy_chunk(h, index);
		mine++;
	}
	/* The helper's chunks: each was claimed by a running helper, done
	 * within microseconds unless its CPU was taken from it. */
	bool stalled = false;
	if (h.done.load(std::memory_order_acquire) != chunks) {
		const auto since = std::chrono::steady_clock::now();
		for (unsigned spins = 1; h.done.load(std::memory_order_acquire) != chunks; spins++) {
			if (stalled) {
				sched_yield();
			} else {
				cpu_relax();
				stalled = spins % 64 == 0 &&
					  std::chrono::steady_clock::now() - since > stall_limit;
			}
		}
	}
	if (mine != chunks)
		h.misses = 0;
	else if (!woken)
		h.misses++;
	if (stalled || h.misses == max_misses) {
		h.misses = 0;
		h.copy_alone = h.next_rest;
		h.next_rest = std::min(2 * h.next_rest, max_rest);
	} else if (mine != chunks) {
		h.next_rest = min_rest;
	}
	h.busy.store(false, std::memory_order_release);
}

uint64_t copy_split_helper_chunks()
{
	return helper_ptr()->helper_chunks.load(std::memory_order_relaxed);
}

/* The parent's helper thread is not in the child, and the job may have been
 * in another thread's hands: a new one, started on first use. */
void fork_child::copy_helper() { helper_ptr() = new Helper; }

} // namespace shmverbs
