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

#include <condition_variable>
#include <map>
#include <set>
#include <thread>

namespace shmverbs {

namespace {

std::mutex lock;
std::condition_variable wake;
std::set<QpEngine *> *engines;
std::map<void *, void (*)(void *)> *pollers;
bool started = false;
bool kicked = false;

void thread_main()
{
	std::unique_lock guard(lock);
	for (;;) {
		bool busy = false;
		for (QpEngine *e : *engines) {
			e->check_remote_errors();
			busy |= e->progress();
		}
		for (auto &[arg, fn] : *pollers)
			fn(arg);
		wake.wait_for(guard, std::chrono::milliseconds(busy ? 1 : 10), [] { return kicked; });
		kicked = false;
	}
}

/* The containers are never freed: the thread outlives main. */
void start_locked()
{
	if (!engines) {
		engines = new std::set<QpEngine *>;
		pollers = new std::map<void *, void (*)(void *)>;
	}
	if (!started) {
		started = true;
		std::thread(thread_main).detach();
	}
}

} // namespace

void progress_register(QpEngine *e)
{
	std::lock_guard guard(lock);
	start_locked();
	engines->insert(e);
}

void progress_register_poller(void *arg, void (*fn)(void *))
{
	std::lock_guard guard(lock);
	start_locked();
	(*pollers)[arg] = fn;
}

void progress_unregister_poller(void *arg)
{
	std::lock_guard guard(lock);
	pollers->erase(arg);
}

void progress_unregister(QpEngine *e)
{
	std::lock_guard guard(lock);
	engines->erase(e);
}

void progress_kick()
{
	std::lock_guard guard(lock);
	kicked = true;
	wake.notify_one();
}

} // namespace shmverbs
