/* SPDX-License-Identifier: MIT */
/* A forked child with a bounded wait: for a test whose failure may be a
 * hang (a deadlock, a lost wake-up) or a crash, which the child takes and
 * the test binary reports. */
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace shmv_test {

/* Waits for pid for up to timeout_s: its exit status, 128+signal if it
 * was killed, or -1 after the timeout (then it is killed). */
inline int wait_child(pid_t pid, int timeout_s = 10)
{
	for (int i = 0; i < timeout_s * 1000; i++) {
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		usleep(1000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, nullptr, 0);
	return -1;
}

/* Runs fn in a forked child, whose exit status is fn's return value (99
 * if it threw), and waits for it as wait_child() does. */
inline int run_child(const std::function<int()> &fn, int timeout_s = 10, pid_t *out_pid = nullptr)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int rc = 99;
		try {
			rc = fn();
		} catch (...) {
		}
		_exit(rc);
	}
	if (out_pid)
		*out_pid = pid;
	return wait_child(pid, timeout_s);
}

} // namespace shmv_test
