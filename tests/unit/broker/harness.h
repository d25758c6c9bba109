/* SPDX-License-Identifier: MIT */
/*
 * Multi-process test helpers for the broker tests: a private runtime
 * directory per test case (a fabric of its own), and child processes with
 * pipes on their stdin/stdout. Peers are this test binary re-executed with
 * "--peer <command>" (peer.cpp). Every wait is bounded; a child still
 * running when its Process object goes away is killed and reaped.
 */
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace broker_test {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

/* A fresh runtime directory under the run's temporary directory, selected
 * with SHMVERBS_RUNTIME_DIR for this process (its broker client is
 * disconnected first) and for the peers it starts. On destruction it waits
 * for the broker to exit (idle) and removes the directory. */
class Fabric {
public:
	Fabric();
	~Fabric();
	Fabric(const Fabric &) = delete;
	Fabric &operator=(const Fabric &) = delete;

	const std::string &dir() const { return dir_; }
	std::string socket() const;
	/* True while a daemon holds the daemon lock. */
	bool broker_alive() const;
	/* Waits until no daemon holds the lock and the socket is gone. */
	bool wait_broker_gone(Ms timeout) const;

private:
	std::string dir_;
};

/* The temporary directory of this test run (created on first use). */
const std::string &run_dir();

class Process {
public:
	/* Starts `argv` with extra environment entries ("NAME=value"). */
	static Process start(const std::vector<std::string> &argv,
			     const std::vector<std::string> &extra_env = {}, bool capture_stderr = false);
	/* Starts this test binary as a peer: "--peer" command args... */
	static Process peer(const std::vector<std::string> &args,
			    const std::vector<std::string> &extra_env = {});

	Process() = default;
	Process(Process &&o) noexcept;
	Process &operator=(Process &&o) noexcept;
	~Process();

	pid_t pid() const { return pid_; }
	/* The next line of stdout (or stderr if captured), without '\n';
	 * nothing on timeout or end of output. */
	std::optional<std::string> read_line(Ms timeout);
	/* Reads lines until one starts with `prefix`; returns the rest. */
	std::optional<std::string> expect(const std::string &prefix, Ms timeout);
	/* Everything it writes until it closes its output (bounded). */
	std::string read_all(Ms timeout);
	void write_line(const std::string &line);
	void close_stdin();
	void kill(int sig);
	/* Exit status (as from waitpid), or nothing on timeout. */
	std::optional<int> wait(Ms timeout);

private:
	void cleanup();

	pid_t pid_ = -1;
	int in_ = -1;
	int out_ = -1;
	std::string buffer_;
};

/* Polls `pred` every few milliseconds until it holds or the timeout ends. */
template <typename Pred>
bool eventually(Pred pred, Ms timeout)
{
	auto end = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		if (pred())
			return true;
		if (std::chrono::steady_clock::now() > end)
			return false;
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, nullptr);
	}
}

std::vector<std::string> split(const std::string &s);

/* The peer commands, run by main() for "--peer". */
int run_peer(int argc, char **argv);

} // namespace broker_test
