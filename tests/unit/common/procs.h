/* SPDX-License-Identifier: MIT */
/*
 * A group of real processes for multi-process tests: the test binary
 * re-executes itself (/proc/self/exe) once per worker, each with a
 * socketpair to the coordinator on fd 3. The coordinator never calls verbs;
 * it serves "allgather" steps: every worker sends one frame, and once all
 * have, every worker receives all frames in rank order (a barrier with a
 * payload: address exchange, phase barriers, result collection).
 *
 * Contract: every wait is bounded; a worker that fails, dies or goes silent
 * makes the coordinator kill every worker by PID and reap it; workers die
 * with the coordinator (PR_SET_PDEATHSIG), so none is ever orphaned.
 */
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace shmv_test {

/* Frames over a stream socket: a 1-byte tag, a 4-byte length, the bytes. */
enum class FrameTag : char { Gather = 'G', Fail = 'F', End = 'E' };

class FrameLink {
public:
	explicit FrameLink(int fd = -1) : fd_(fd) {}
	int fd() const { return fd_; }

	bool send(FrameTag tag, const void *data, size_t len)
	{
		char hdr[5];
		hdr[0] = char(tag);
		uint32_t n = uint32_t(len);
		std::memcpy(hdr + 1, &n, 4);
		return write_all(hdr, 5) && write_all(data, len);
	}

	/* One frame within `ms` (false: timeout, EOF or error). */
	bool recv(FrameTag &tag, std::vector<char> &out, int ms)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
		char hdr[5];
		if (!read_all(hdr, 5, end))
			return false;
		tag = FrameTag(hdr[0]);
		uint32_t n;
		std::memcpy(&n, hdr + 1, 4);
		out.resize(n);
		return read_all(out.data(), n, end);
	}

private:
	bool write_all(const void *p, size_t len)
	{
		const char *c = static_cast<const char *>(p);
		while (len) {
			ssize_t w = ::send(fd_, c, len, MSG_NOSIGNAL);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return false;
			c += w;
			len -= size_t(w);
		}
		return true;
	}
	bool read_all(void *p, size_t len, std::chrono::steady_clock::time_point end)
	{
		char *c = static_cast<char *>(p);
		while (len) {
			auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
				end - std::chrono::steady_clock::now());
			struct pollfd pf = {fd_, POLLIN, 0};
			int r = poll(&pf, 1, int(std::max<int64_t>(left.count(), 0)));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				return false;
			ssize_t n = ::read(fd_, c, len);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return false;
			c += n;
			len -= size_t(n);
		}
		return true;
	}
	int fd_;
};

/* The worker's side: its link is fd 3. */
class WorkerLink {
public:
	static constexpr int fd = 3;

	/* Sends `mine`, returns every worker's frame in rank order; empty on
	 * timeout or when the coordinator gave up. */
	std::vector<std::vector<char>> allgather(const std::vector<char> &mine, int ms)
	{
		std::vector<std::vector<char>> all;
		if (!link_.send(FrameTag::Gather, mine.data(), mine.size()))
			return all;
		FrameTag tag;
		std::vector<char> blob;
		if (!link_.recv(tag, blob, ms) || tag != FrameTag::Gather)
			return all;
		/* The blob is a sequence of (u32 length, bytes). */
		size_t at = 0;
		while (at + 4 <= blob.size()) {
			uint32_t n;
			std::memcpy(&n, blob.data() + at, 4);
			at += 4;
			if (at + n > blob.size())
				return {};
			all.emplace_back(blob.data() + at, blob.data() + at + n);
			at += n;
		}
		return all;
	}
	void fail(const std::string &why) { link_.send(FrameTag::Fail, why.data(), why.size()); }
	void end() { link_.send(FrameTag::End, nullptr, 0); }

private:
	FrameLink link_{fd};
};

/* The coordinator's side. */
class ProcessGroup {
public:
	/* Starts `n` workers: /proc/self/exe with args(rank). */
	template <typename ArgsFn> ProcessGroup(int n, ArgsFn args)
	{
		for (int rank = 0; rank < n; rank++) {
			int sv[2];
			if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
				error_ = "socketpair failed";
				return;
			}
			std::vector<std::string> a = args(rank);
			pid_t parent = getpid();
			pid_t pid = fork();
			if (pid == 0) {
				/* Dies with the coordinator, even one killed by a
				 * test timeout. */
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() != parent)
					_exit(126);
				dup2(sv[1], WorkerLink::fd); /* clears CLOEXEC */
				std::vector<char *> argv;
				for (std::string &s : a)
					argv.push_back(s.data());
				argv.push_back(nullptr);
				execv("/proc/self/exe", argv.data());
				_exit(127);
			}
			close(sv[1]);
			if (pid < 0) {
				close(sv[0]);
				error_ = "fork failed";
				return;
			}
			workers_.push_back({pid, FrameLink(sv[0]), false});
		}
	}
	~ProcessGroup() { kill_all(); }
	ProcessGroup(const ProcessGroup &) = delete;
	ProcessGroup &operator=(const ProcessGroup &) = delete;

	/*
	 * Serves allgather steps until every worker sent End. Returns "" when
	 * all ended and exited with status 0; otherwise what went wrong (the
	 * workers are then killed). `step_ms` bounds each step.
	 */
	std::string serve(int step_ms)
	{
		if (!error_.empty())
			return error_;
		const size_t n = workers_.size();
		for (;;) {
			std::vector<std::vector<char>> frames(n);
			std::vector<bool> got(n, false);
			size_t ended = 0, have = 0;
			auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(step_ms);
			/* Whichever worker speaks first: a failure report is
			 * acted on at once, not after the others' timeouts. */
			while (have < n) {
				std::vector<struct pollfd> pf;
				std::vector<size_t> idx;
				for (size_t i = 0; i < n; i++)
					if (!got[i]) {
						pf.push_back({workers_[i].link.fd(), POLLIN, 0});
						idx.push_back(i);
					}
				auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
					end - std::chrono::steady_clock::now());
				int r = poll(pf.data(), pf.size(), int(std::max<int64_t>(left.count(), 0)));
				if (r < 0 && errno == EINTR)
					continue;
				if (r <= 0)
					return fail_all("worker " + std::to_string(idx[0]) +
							" went silent (" + status_of(idx[0]) + ")");
				for (size_t k = 0; k < pf.size(); k++) {
					if (!pf[k].revents)
						continue;
					size_t i = idx[k];
					FrameTag tag;
					if (!workers_[i].link.recv(tag, frames[i], step_ms))
						return fail_all("worker " + std::to_string(i) + " died (" +
								status_of(i) + ")");
					if (tag == FrameTag::Fail)
						return fail_all("worker " + std::to_string(i) + " failed: " +
								std::string(frames[i].begin(), frames[i].end()));
					if (tag == FrameTag::End)
						ended++;
					got[i] = true;
					have++;
				}
			}
			if (ended == n)
				return reap(step_ms);
			if (ended)
				return fail_all("workers disagree on the number of steps");
			std::vector<char> blob;
			for (auto &f : frames) {
				uint32_t len = uint32_t(f.size());
				blob.insert(blob.end(), reinterpret_cast<char *>(&len),
					    reinterpret_cast<char *>(&len) + 4);
				blob.insert(blob.end(), f.begin(), f.end());
			}
			for (size_t i = 0; i < n; i++)
				if (!workers_[i].link.send(FrameTag::Gather, blob.data(), blob.size()))
					return fail_all("worker " + std::to_string(i) + " unreachable");
		}
	}

	/* SIGKILL to every live worker, by PID, and reap it. */
	void kill_all()
	{
		for (Worker &w : workers_) {
			if (!w.reaped) {
				kill(w.pid, SIGKILL);
				waitpid(w.pid, nullptr, 0);
				w.reaped = true;
			}
			if (w.link.fd() >= 0)
				close(w.link.fd());
			w.link = FrameLink(-1);
		}
	}

private:
	struct Worker {
		pid_t pid;
		FrameLink link;
		bool reaped;
	};

	std::string status_of(size_t i)
	{
		int st = 0;
		Worker &w = workers_[i];
		if (w.reaped || waitpid(w.pid, &st, WNOHANG) != w.pid)
			return "still running";
		w.reaped = true;
		if (WIFSIGNALED(st))
			return "killed by signal " + std::to_string(WTERMSIG(st));
		return "exit status " + std::to_string(WEXITSTATUS(st));
	}
	std::string fail_all(const std::string &why)
	{
		kill_all();
		return why;
	}
	/* Every worker sent End: each must exit 0 within `ms`. */
	std::string reap(int ms)
	{
		auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
		for (size_t i = 0; i < workers_.size(); i++) {
			Worker &w = workers_[i];
			int st = 0;
			pid_t r = 0;
			while ((r = waitpid(w.pid, &st, WNOHANG)) == 0 &&
			       std::chrono::steady_clock::now() < end)
				usleep(1000);
			if (r != w.pid)
				return fail_all("worker " + std::to_string(i) + " did not exit");
			w.reaped = true;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				return fail_all("worker " + std::to_string(i) + " exited badly (status " +
						std::to_string(st) + ")");
		}
		return "";
	}

	std::vector<Worker> workers_;
	std::string error_;
};

} // namespace shmv_test
