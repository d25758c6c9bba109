/* SPDX-License-Identifier: MIT */
/*
 * The harness of the multi-process unit tests that drive a peer process over
 * its stdin/stdout (tests/unit/datapath, tests/unit/lifecycle) and the verbs
 * steps every such test repeats: opening the device, bringing a QP to RTS
 * toward a peer (qp_path.h), waiting (bounded) for a completion.
 * Process groups that exchange frames instead are procs.h.
 *
 * Contract: every wait is bounded; a peer is killed (SIGKILL, by PID) and
 * reaped when its PeerProc goes out of scope.
 */
#pragma once

#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include "qp_path.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace shmv_test {

/*
 * Set in a peer process, which has no Catch2 session: there a failed need
 * exits (status 10) instead of REQUIRE (which needs a session even to pass).
 */
inline bool in_peer = false;

} // namespace shmv_test

#define NEED(c)                                                                         \
	do {                                                                            \
		if (::shmv_test::in_peer) {                                             \
			if (!(c)) {                                                     \
				std::fprintf(stderr, "peer: %s failed (%s:%d)\n", #c,  \
					     __FILE__, __LINE__);                        \
				std::_Exit(10);                                         \
			}                                                               \
		} else {                                                                \
			REQUIRE(c);                                                     \
		}                                                                       \
	} while (0)

namespace shmv_test {

/* One line of `f` with its newline; false at EOF. The peer's side. */
inline bool read_line(FILE *f, std::string &line)
{
	char b[256];
	if (!std::fgets(b, sizeof(b), f))
		return false;
	line = b;
	return true;
}

/*
 * A child process (this binary as a peer, or another program) whose stdin
 * and stdout are pipes to us. Killed (SIGKILL) and reaped at scope end.
 */
struct PeerProc {
	/* What line() gives: the line as read (newline included) or trimmed. */
	enum class Lines { Raw, Trimmed };

	pid_t pid = -1;
	FILE *to = nullptr, *from = nullptr;
	Lines lines;

	/* argv[0] is the program; "self" re-executes this binary. */
	explicit PeerProc(std::vector<std::string> argv, Lines l = Lines::Raw) : lines(l)
	{
		int in[2], out[2];
		NEED(pipe2(in, O_CLOEXEC) == 0);
		NEED(pipe2(out, O_CLOEXEC) == 0);
		if (argv[0] == "self")
			argv[0] = "/proc/self/exe";
		std::vector<char *> args;
		for (std::string &a : argv)
			args.push_back(a.data());
		args.push_back(nullptr);
		/* posix_spawn, not fork + exec: nothing of this multi-threaded
		 * process (the library's threads, a sanitizer's runtime and
		 * its locks) runs in a copy of it before the exec. */
		posix_spawn_file_actions_t actions;
		NEED(posix_spawn_file_actions_init(&actions) == 0);
		posix_spawn_file_actions_adddup2(&actions, in[0], 0); /* dup2 clears O_CLOEXEC */
		posix_spawn_file_actions_adddup2(&actions, out[1], 1);
		const int err = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
		posix_spawn_file_actions_destroy(&actions);
		NEED(err == 0);
		close(in[0]);
		close(out[1]);
		to = fdopen(in[1], "w");
		from = fdopen(out[0], "r");
		setvbuf(to, nullptr, _IOLBF, 0);
	}
	~PeerProc()
	{
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, nullptr, 0);
		}
		if (to)
			std::fclose(to);
		if (from)
			std::fclose(from);
	}
	PeerProc(const PeerProc &) = delete;
	PeerProc &operator=(const PeerProc &) = delete;

	/* The next line (see Lines), "timeout" or "eof". */
	std::string line(int ms = 15000)
	{
		struct pollfd p = {fileno(from), POLLIN, 0};
		if (poll(&p, 1, ms) != 1)
			return "timeout";
		std::string l;
		if (!read_line(from, l))
			return "eof";
		if (lines == Lines::Trimmed && !l.empty() && l.back() == '\n')
			l.pop_back();
		return l;
	}
	void send(const std::string &s) { std::fprintf(to, "%s\n", s.c_str()); }
	/* send() and the answer line. */
	std::string ask(const std::string &s, int ms = 15000)
	{
		send(s);
		return line(ms);
	}

	/* Waits (bounded) for the child to stop (SIGSTOP) or exit: true if it
	 * stopped. */
	bool wait_stopped(int ms = 10000)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
		while (std::chrono::steady_clock::now() < end) {
			int status = 0;
			pid_t r = waitpid(pid, &status, WNOHANG | WUNTRACED);
			if (r == pid && WIFSTOPPED(status))
				return true;
			if (r == pid) {
				pid = -1;
				return false;
			}
			std::this_thread::sleep_for(std::chrono::milliseconds(2));
		}
		return false;
	}

	/* Reaps the child (bounded): its exit status, 128 + the signal that
	 * killed it, or -1. */
	int reap(int ms = 10000)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
		while (pid > 0 && std::chrono::steady_clock::now() < end) {
			int status = 0;
			if (waitpid(pid, &status, WNOHANG) == pid) {
				pid = -1;
				return WIFEXITED(status) ? WEXITSTATUS(status)
							 : 128 + WTERMSIG(status);
			}
			std::this_thread::sleep_for(std::chrono::milliseconds(2));
		}
		return -1;
	}
};

/*
 * A passive target's first words: "<qpn> <rkey> <addr>", its QP number and
 * the key and address of its registered buffer (print_target_address in
 * the target; TargetPeer reads them in the test).
 */
inline void print_target_address(uint32_t qpn, uint32_t rkey, const void *addr)
{
	std::printf("%u %u %llu\n", qpn, rkey, (unsigned long long)uintptr_t(addr));
}

struct TargetPeer : PeerProc {
	uint32_t qpn = 0, rkey = 0;
	uint64_t addr = 0;

	explicit TargetPeer(std::vector<std::string> argv) : PeerProc(std::move(argv))
	{
		std::string l = line();
		unsigned long long a = 0;
		REQUIRE(std::sscanf(l.c_str(), "%u %u %llu", &qpn, &rkey, &a) == 3);
		addr = a;
	}
};

/* The first device, opened (NEED-checked). */
inline struct ibv_context *open_first_device()
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	NEED((list && n > 0));
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	NEED(ctx);
	return ctx;
}

/* Port 1's LID (NEED-checked). */
inline uint16_t port_lid(struct ibv_context *ctx)
{
	struct ibv_port_attr pa{};
	NEED(ibv_query_port(ctx, 1, &pa) == 0);
	return pa.lid;
}

} // namespace shmv_test
