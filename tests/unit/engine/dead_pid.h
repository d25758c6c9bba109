/* SPDX-License-Identifier: MIT */
/* The pid of a process that existed and is gone (forked, exited, reaped):
 * what a CQ slot claimed by a producer that died carries. */
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

inline uint32_t dead_pid()
{
	pid_t pid = fork();
	if (pid == 0)
		_exit(0);
	waitpid(pid, nullptr, 0);
	return uint32_t(pid);
}
