/* SPDX-License-Identifier: MIT */
/* A child process with a bounded wait: for a test whose failure may be a
 * hang (a deadlock, a lost wake-up) or a crash, which the child takes and
 * the test binary reports. run_child() forks and runs a function; a child
 * that starts threads must be run_self() instead (a fresh exec of this
 * binary), since ThreadSanitizer refuses threads after a multi-threaded
 * fork. */
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

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

/* This test binary again, with `args` (a Catch2 test spec for the hidden
 * test that is the child), waited for as wait_child() does: its exit
 * status, 0 when that test passed. */
inline int run_self(const std::vector<std::string> &args, int timeout_s = 10)
{
	std::vector<char *> argv;
	std::string self = "/proc/self/exe";
	argv.push_back(self.data());
	std::vector<std::string> copy = args;
	for (std::string &a : copy)
		argv.push_back(a.data());
	argv.push_back(nullptr);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		execv(argv[0], argv.data());
		_exit(127);
	}
	return wait_child(pid, timeout_s);
}

} // namespace shmv_test
