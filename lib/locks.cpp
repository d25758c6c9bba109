/* SPDX-License-Identifier: MIT */
/*
 * The process-wide half of the lock bias (lib/locks.h LockBias): whether
 * membarrier(2) can serve as the revoker's heavy barrier, and the barrier.
 */
#include "locks.h"

#include "log.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace shmverbs {

thread_local __attribute__((tls_model("initial-exec"))) char lock_thread_tag;

namespace {

int membarrier(int cmd) { return int(syscall(__NR_membarrier, cmd, 0, 0)); }

/* -1 not usable, 1 usable; 0 not decided yet. */
std::atomic<int> bias_state{0};

bool decide()
{
	if (const char *v = std::getenv("SHMVERBS_LOCK_BIAS"); v && std::strcmp(v, "0") == 0)
		return false;
	const int cmds = membarrier(MEMBARRIER_CMD_QUERY);
	if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
		log_debug("locks: membarrier(PRIVATE_EXPEDITED) not offered (%s): no lock bias",
			  cmds < 0 ? std::strerror(errno) : "not in the query's answer");
		return false;
	}
	if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) {
		log_debug("locks: membarrier registration: %s: no lock bias", std::strerror(errno));
		return false;
	}
	return true;
}

} // namespace

bool lock_bias_available()
{
	int s = bias_state.load(std::memory_order_relaxed);
	if (s == 0) {
		/* Racing first callers decide alike; registering twice is allowed. */
		s = decide() ? 1 : -1;
		bias_state.store(s, std::memory_order_relaxed);
	}
	return s > 0;
}

void lock_bias_barrier()
{
	if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		return;
	/* A forked child: the registration is the parent's process's, not
	 * inherited (the biases are). */
	if (errno == EPERM && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
	    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		return;
	/* The system-wide barrier needs no registration (and is slower). */
	if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0)
		return;
	/* A bias was granted, so the barrier worked in this process or its
	 * parent: without it no revocation is safe. */
	log_error("locks: membarrier failed (%s) while revoking a lock's bias", std::strerror(errno));
	std::abort();
}

} // namespace shmverbs
