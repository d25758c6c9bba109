/* SPDX-License-Identifier: MIT */
/*
 * The per-process progress thread: retries send queues that wait (RNR,
 * dead-peer timeouts) and applies errors that senders recorded in the
 * descriptors of our QPs (a passive target learns of them here). It wakes
 * every millisecond while some queue waits, every 10 ms otherwise.
 *
 * Engines register at creation and unregister in their destructor; the
 * thread calls them under `lock`, so an engine is never used after its
 * unregistration returned.
 */
#include "datapath.h"
#include "fork.h"

#include <condition_variable>
#include <map>
#include <set>
#include <thread>

namespace shmverbs {

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
	std::map<void *, void (*)(void *)> pollers;
	bool started = false;
	bool kicked = false;
};

ProgressState *&state_ptr()
{
	static ProgressState *s = new ProgressState; /* never freed, see above */
	return s;
}

ProgressState &state() { return *state_ptr(); }

void thread_main()
{
	ProgressState &st = state();
	std::unique_lock guard(st.lock);
	for (;;) {
		bool busy = false;
		for (QpEngine *e : st.engines) {
			e->check_remote_errors();
			busy |= e->progress();
		}
		for (auto &[arg, fn] : st.pollers)
			fn(arg);
		st.wake.wait_for(guard, std::chrono::milliseconds(busy ? 1 : 10),
				 [&st] { return st.kicked; });
		st.kicked = false;
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
void fork_child::progress() { state_ptr() = new ProgressState; }

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

void progress_unregister(QpEngine *e)
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	st.engines.erase(e);
}

void progress_kick()
{
	ProgressState &st = state();
	std::lock_guard guard(st.lock);
	st.kicked = true;
	st.wake.notify_one();
}

} // namespace shmverbs
