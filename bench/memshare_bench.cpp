/* SPDX-License-Identifier: MIT */
/*
 * 8-byte writes into another process's registered memory by each path:
 * a store through a peer window (memshare), process_vm_writev (CMA), and a
 * bounce slot + target helper thread. Reference: an 8-byte memcpy into local
 * memory, measured in the same run. Five interleaved runs, medians, ratios.
 * Bounded: about a second in all.
 */
#include "bounce.h"
#include "cma.h"
#include "memshare.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

using namespace shmverbs::memshare;

namespace {

double now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

template <typename F>
double per_op(int n, F f)
{
	double t0 = now_ns();
	for (int i = 0; i < n; i++)
		f(i);
	return (now_ns() - t0) / n;
}

double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

struct Hello {
	uint64_t shared_va, private_va;
};

} // namespace

int main()
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		return 1;
	pid_t pid = fork();
	if (pid == 0) {
		/* The target: one registered (shared) buffer, one private. */
		auto *shared_buf = static_cast<char *>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
							    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
		auto *private_buf = static_cast<char *>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
							     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
		if (share(shared_buf, 4096) != Path::shared)
			_exit(2);
		std::unique_ptr<BounceServer> srv(BounceServer::create(4, 4096).get());
		Hello h{reinterpret_cast<uint64_t>(shared_buf), reinterpret_cast<uint64_t>(private_buf)};
		int fds[2] = {memory_file_fd(), srv->fd()};
		char cbuf[CMSG_SPACE(sizeof(fds))] = {};
		struct iovec iov = {&h, sizeof(h)};
		struct msghdr msg = {};
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = cbuf;
		msg.msg_controllen = sizeof(cbuf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(fds));
		std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
		if (sendmsg(sv[1], &msg, 0) != sizeof(h))
			_exit(3);
		char q;
		(void)!read(sv[1], &q, 1); /* until the initiator is done */
		_exit(0);
	}
	Hello h{};
	int fds[2] = {-1, -1};
	char cbuf[CMSG_SPACE(sizeof(fds))] = {};
	struct iovec iov = {&h, sizeof(h)};
	struct msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	if (recvmsg(sv[0], &msg, 0) != sizeof(h) || !CMSG_FIRSTHDR(&msg))
		return 1;
	std::memcpy(fds, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(fds));
	PeerWindow w;
	if (map_peer(fds[0], h.shared_va, 4096, w) != 0)
		return 1;
	std::unique_ptr<BounceClient> bc(BounceClient::attach(fds[1]).get());
	const bool cma = cma_available();
	alignas(64) static char local[4096];
	uint64_t value = 0x0123456789abcdefULL;
	auto *win = static_cast<char *>(w.at(h.shared_va));

	std::vector<double> ref, store, cmaw, bounce;
	for (int run = 0; run < 5; run++) {
		ref.push_back(per_op(1000000, [&](int i) {
			value += i;
			std::memcpy(local + (i & 7) * 8, &value, 8);
			asm volatile("" ::: "memory");
		}));
		store.push_back(per_op(1000000, [&](int i) {
			value += i;
			std::memcpy(win + (i & 7) * 8, &value, 8);
			asm volatile("" ::: "memory");
		}));
		if (cma)
			cmaw.push_back(per_op(20000, [&](int i) {
				value += i;
				cma_write(pid, h.private_va + (i & 7) * 8, &value, 8);
			}));
		if (bc)
			bounce.push_back(per_op(1000, [&](int i) {
				value += i;
				bounce_write(*bc, h.private_va + (i & 7) * 8, &value, 8);
			}));
	}
	double r = median(ref);
	std::printf("8-byte write into another process (medians of 5 runs)\n");
	std::printf("%-28s %10.2f ns  %8.1fx\n", "memcpy to local (reference)", r, 1.0);
	std::printf("%-28s %10.2f ns  %8.1fx\n", "store through peer window", median(store), median(store) / r);
	if (cma)
		std::printf("%-28s %10.2f ns  %8.1fx\n", "CMA process_vm_writev", median(cmaw), median(cmaw) / r);
	else
		std::printf("%-28s %10s\n", "CMA process_vm_writev", "blocked");
	if (bc)
		std::printf("%-28s %10.2f ns  %8.1fx\n", "bounce slot + helper", median(bounce), median(bounce) / r);
	(void)!write(sv[0], "q", 1);
	int status;
	waitpid(pid, &status, 0);
	return 0;
}
