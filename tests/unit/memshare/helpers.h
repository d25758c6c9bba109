/* SPDX-License-Identifier: MIT */
/* Small helpers for the memshare tests: child processes with bounded waits
 * (../common/child.h), fd passing, and a look at /proc/self/maps. */
#pragma once

#include "../common/child.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace memshare_test {

using shmv_test::run_child;
using shmv_test::wait_child;

inline int send_fd(int sock, int fd, uint64_t value)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = {};
	struct iovec iov = {&value, sizeof(value)};
	struct msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == sizeof(value) ? 0 : -1;
}

/* Receives an fd and a value; -1 on failure. */
inline int recv_fd(int sock, uint64_t &value)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = {};
	struct iovec iov = {&value, sizeof(value)};
	struct msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	if (recvmsg(sock, &msg, 0) != sizeof(value))
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return -1;
	int fd;
	std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

/* The permission string ("rw-p") of the mapping holding addr, "" if none. */
inline std::string perms_at(const void *addr)
{
	auto a = reinterpret_cast<uintptr_t>(addr);
	FILE *f = std::fopen("/proc/self/maps", "re");
	char line[1024];
	std::string out;
	while (f && std::fgets(line, sizeof(line), f)) {
		uintptr_t lo, hi;
		char perms[8];
		if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= a && a < hi) {
			out = perms;
			break;
		}
	}
	if (f)
		std::fclose(f);
	return out;
}

inline char *map_anon(size_t len, int prot = PROT_READ | PROT_WRITE)
{
	void *p = mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

constexpr size_t kPage = 4096;

/* Byte-wise write/read with a single instruction each, so the compiler keeps
 * every access. */
inline void poke(void *p, char v) { *static_cast<volatile char *>(p) = v; }
inline char peek(const void *p) { return *static_cast<const volatile char *>(p); }

} // namespace memshare_test
