/* SPDX-License-Identifier: MIT */
/*
 * The per-process progress thread: retries send queues that wait (RNR,
 * dead-peer timeouts) and applies errors that senders recorded in the
 * descriptors of our QPs (a passive target learns of them here).
 *
 * Its cost must not grow with the number of idle QPs (thousands per
 * process): it keeps `waiting`, the engines whose last progress() said WRs
 * remain queued, and retries only those, every millisecond while any wait.
 * The post that leaves work behind lists its engine there itself
 * (progress_wait) and wakes the thread for a pass at once: from then on the
 * application's own empty polls retry it too (progress_poll_waiting), which
 * matters when the thread cannot get a CPU soon (a busy-polling sender and
 * receiver on 2 cores: a sender that met RNR stalled for milliseconds,
 * until the thread ran and listed it). The remote-error check (a load of
 * one descriptor word, and of the QP's receive CQ's overrun word) and the
 * pollers run every 10 ms over all of them.
 *
 * It also ends the holds that engines keep between posts (a target QP's
 * in-flight count, a remote key: QpEngine::held_), which the target's
 * destroy_qp and dereg_mr wait for: `holding` lists the engines that keep
 * some, and every sweep period the thread lets go of those of an engine
 * that posted nothing since its last look. The holds of a busy engine
 * stay: its posts check that the target still wants them. The period is
 * hold_sweep_period (1 ms) after an engine is listed or let go, and doubles
 * up to hold_sweep_period_max (8 ms) while every listed engine stays busy:
 * each wake-up costs a busy application on 2 cores a context switch
 * (ib_send_bw 1 MiB, medians of 6: 40 GB/s with a fixed 1 ms period, 43
 * without sweeps; noisy), and a stream's holds still go at most 16 ms
 * after its last post.
 *
 * Engines register at creation and unregister in their destructor; the
 * thread calls them under `lock`, so an engine is never used after its
 * unregistration returned.
 */
#include "datapath.h"
#include "fork.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <set>
#include <thread>

namespace shmverbs {

/* The size of `waiting` as last stored under the lock. A forked child's
 * copy may count the parent's engines: its first look finds its own
 * `waiting` empty and stores 0. */
std::atomic<size_t> progress_waiting_engines{0};

namespace {

/*
 * The thread is detached and runs until the process ends, so everything it
 * touches lives as long: the state is allocated once and never destroyed.
 * (As plain statics, the condition variable and containers were destroyed by
 * exit()'s static destructors while the thread still waited on them.)
 */
struct ProgressState {
	std::mutex lock;
	std::condition_variable wake;
	std::set<QpEngine *> engines;
	std::set<QpEngine *> waiting; /* a subset of engines */
	std::set<QpEngine *> holding; /* a subset of engines */
	std::map<void *, void (*)(void *)> pollers;
	bool started = false;
	bool waiting_grew = false; /* wake up to retry at once */
	bool holding_grew = false; /* wake up to schedule the hold sweeps */
};

ProgressState *&state_ptr()
{
	static ProgressState *s = new ProgressState; /* never freed, see above */
	return s;
}

ProgressState &state() { return *state_ptr(); }

void thread_main()
{
	using Clock = std::chrono::steady_clock;
	constexpr auto slow_period = std::chrono::milliseconds(10);
	constexpr auto retry_period = std::chrono::milliseconds(1);
	ProgressState &st = state();
	std::unique_lock guard(st.lock);
	auto next_sweep = Clock::now();
	auto next_hold_sweep = Clock::now();
	auto hold_period = hold_sweep_period;
	for (;;) {
		st.waiting_grew = false;
		for (auto it = st.waiting.begin(); it != st.waiting.end();)
			it = (*it)->progress() ? std::next(it) : st.waiting.erase(it);
		if (Clock::now() >= next_sweep) {
			for (QpEngine *e : st.engines)
				e->check_remote_errors();
			for (auto &[arg, fn] : st.pollers)
				fn(arg);
			next_sweep = Clock::now() + slow_period;
		}
		if (st.holding_grew) {
			st.holding_grew = false;
			hold_period = hold_sweep_period;
			next_hold_sweep = std::min(next_hold_sweep, Clock::now() + hold_period);
		}
		/* Not skipped when engines were just listed: a steady stream
		 * of listings must not starve the sweep. */
		if (!st.holding.empty() && Clock::now() >= next_hold_sweep) {
			const size_t listed = st.holding.size();
			for (auto it = st.holding.begin(); it != st.holding.end();)
				it = (*it)->sweep_holds() ? std::next(it) : st.holding.erase(it);
			hold_period = st.holding.size() < listed
				? hold_sweep_period
				: std::min(2 * hold_period, hold_sweep_period_max);
			next_hold_sweep = Clock::now() + hold_period;
		}
		progress_waiting_engines.store(st.waiting.size(), std::memory_order_relaxed);
		auto until = st.waiting.empty() ? next_sweep : Clock::now() + retry_period;
		if (!st.holding.empty())
			until = std::min(until, next_hold_sweep);
		st.wake.wait_until(guard, until, [&st] { return st.waiting_grew || st.holding_grew; });
	}
}

void start_locked(ProgressState &st)
{
	if (!st.started) {
		st.started = true;
		std::thread(thread_main).detach();
	}
}

} // namespace

/* A forked child has no progress thread: a new state starts one on first
 * use; the parent's engines stay in the old one, never run here. */
void fork_child::progress()
{
	/* The parent's engines stay in the child, their holds counted in the
	 * parent's name: forgotten, so that nothing here counts them out.
	 * (Defensive: the child's verbs refuse inherited QPs with EIO.) Only
	 * this thread runs now, but the set may have been in a parent
	 * thread's hands at fork(): left alone then. */
	ProgressState &old = state();
	if (old.lock.try_lock()) {
		for (QpEngine *e : old.engines)
			e->forget_holds();
		old.lock.unlock();
	}
	state_ptr() = new ProgressState;
}

void for_each_engine(const std::function<void(QpEngine &)> &fn)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	for (QpEngine *e : st.engines)
		fn(*e);
}

void progress_register(QpEngine *e)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	start_locked(st);
	st.engines.insert(e);
}

void progress_register_poller(void *arg, void (*fn)(void *))
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	start_locked(st);
	st.pollers[arg] = fn;
}

void progress_unregister_poller(void *arg)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	st.pollers.erase(arg);
}

void progress_hold(QpEngine *e)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	start_locked(st);
	if (st.holding.insert(e).second) {
		st.holding_grew = true;
		st.wake.notify_one();
	}
}

void progress_unregister(QpEngine *e)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	st.engines.erase(e);
	st.waiting.erase(e);
	st.holding.erase(e);
	progress_waiting_engines.store(st.waiting.size(), std::memory_order_relaxed);
}

void progress_poll_waiting_slow()
{
	ProgressState &st = state();
	/* Never wait for the progress thread: it is at it already. */
	std::unique_lock guard(st.lock, std::try_to_lock);
	if (!guard.owns_lock())
		return;
	const unsigned misses = rnr_early_misses;
	for (auto it = st.waiting.begin(); it != st.waiting.end();)
		it = (*it)->progress() ? std::next(it) : st.waiting.erase(it);
	progress_waiting_engines.store(st.waiting.size(), std::memory_order_relaxed);
	guard.unlock();
	/* A receiver that reposted nothing for a look period may be waiting
	 * for this very CPU (more busy pollers than cores: the scheduler put
	 * sender and receiver on one): let it run now rather than at the end
	 * of our time slice, which we would spend polling in vain. */
	if (rnr_early_misses != misses)
		sched_yield();
}

void progress_wait(QpEngine *e)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	start_locked(st);
	if (st.waiting.insert(e).second) {
		progress_waiting_engines.store(st.waiting.size(), std::memory_order_relaxed);
		st.waiting_grew = true;
		st.wake.notify_one();
	}
}

} // namespace shmverbs
