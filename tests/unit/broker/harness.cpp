/* SPDX-License-Identifier: MIT */
#include "harness.h"
#include "broker_client.h"
#include "broker_protocol.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

extern char **environ;

namespace broker_test {

namespace {

std::string self_exe()
{
	char buf[4096];
	ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
	if (n <= 0)
		throw std::runtime_error("readlink /proc/self/exe");
	buf[n] = 0;
	return buf;
}

struct RunDir {
	std::string path;
	RunDir()
	{
		char tmpl[] = "/tmp/shmverbs-broker-test-XXXXXX";
		if (!mkdtemp(tmpl))
			throw std::runtime_error("mkdtemp");
		path = tmpl;
	}
	~RunDir()
	{
		std::error_code ignored;
		std::filesystem::remove_all(path, ignored);
	}
};

} // namespace

const std::string &run_dir()
{
	static RunDir dir;
	return dir.path;
}

Fabric::Fabric()
{
	static std::atomic<int> counter{0};
	dir_ = run_dir() + "/fabric" + std::to_string(counter++);
	shmverbs::BrokerClient::instance().disconnect();
	setenv("SHMVERBS_RUNTIME_DIR", dir_.c_str(), 1);
}

Fabric::~Fabric()
{
	shmverbs::BrokerClient::instance().disconnect();
	shmverbs::BrokerClient::instance().set_event_handler(nullptr);
	wait_broker_gone(3000ms);
	std::error_code ignored;
	std::filesystem::remove_all(dir_, ignored);
}

std::string Fabric::socket() const
{
	return dir_ + "/" + shmverbs::broker::socket_name;
}

bool Fabric::broker_alive() const
{
	std::string path = dir_ + "/" + shmverbs::broker::daemon_lock_name;
	int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool held = flock(fd, LOCK_SH | LOCK_NB) != 0;
	close(fd);
	return held;
}

bool Fabric::wait_broker_gone(Ms timeout) const
{
	return eventually([&] { return !broker_alive() && access(socket().c_str(), F_OK) != 0; },
			  timeout);
}

Process Process::start(const std::vector<std::string> &argv, const std::vector<std::string> &extra_env,
		       bool capture_stderr)
{
	int in[2], out[2];
	if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
		throw std::runtime_error("pipe2");
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	if (capture_stderr)
		posix_spawn_file_actions_adddup2(&fa, out[1], 2);

	std::vector<std::string> env;
	for (char **e = environ; *e; e++)
		env.push_back(*e);
	for (const std::string &e : extra_env)
		env.push_back(e);
	std::vector<char *> envp, args;
	for (std::string &e : env)
		envp.push_back(e.data());
	envp.push_back(nullptr);
	std::vector<std::string> argv_copy = argv;
	for (std::string &a : argv_copy)
		args.push_back(a.data());
	args.push_back(nullptr);

	Process p;
	int err = posix_spawn(&p.pid_, args[0], &fa, nullptr, args.data(), envp.data());
	posix_spawn_file_actions_destroy(&fa);
	close(in[0]);
	close(out[1]);
	if (err) {
		close(in[1]);
		close(out[0]);
		throw std::runtime_error("posix_spawn " + argv[0] + ": " + strerror(err));
	}
	p.in_ = in[1];
	p.out_ = out[0];
	return p;
}

Process Process::peer(const std::vector<std::string> &args, const std::vector<std::string> &extra_env)
{
	std::vector<std::string> argv = {self_exe(), "--peer"};
	argv.insert(argv.end(), args.begin(), args.end());
	return start(argv, extra_env);
}

Process::Process(Process &&o) noexcept
	: pid_(std::exchange(o.pid_, -1)), in_(std::exchange(o.in_, -1)),
	  out_(std::exchange(o.out_, -1)), buffer_(std::move(o.buffer_))
{
}

Process &Process::operator=(Process &&o) noexcept
{
	if (this != &o) {
		cleanup();
		pid_ = std::exchange(o.pid_, -1);
		in_ = std::exchange(o.in_, -1);
		out_ = std::exchange(o.out_, -1);
		buffer_ = std::move(o.buffer_);
	}
	return *this;
}

Process::~Process()
{
	cleanup();
}

void Process::cleanup()
{
	if (pid_ > 0) {
		::kill(pid_, SIGKILL);
		waitpid(pid_, nullptr, 0);
		pid_ = -1;
	}
	if (in_ >= 0)
		close(std::exchange(in_, -1));
	if (out_ >= 0)
		close(std::exchange(out_, -1));
}

std::optional<std::string> Process::read_line(Ms timeout)
{
	auto end = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		size_t nl = buffer_.find('\n');
		if (nl != std::string::npos) {
			std::string line = buffer_.substr(0, nl);
			buffer_.erase(0, nl + 1);
			return line;
		}
		auto left = std::chrono::duration_cast<Ms>(end - std::chrono::steady_clock::now());
		if (out_ < 0 || left.count() <= 0)
			return std::nullopt;
		struct pollfd pfd = {out_, POLLIN, 0};
		if (poll(&pfd, 1, int(left.count())) <= 0)
			continue;
		char buf[4096];
		ssize_t n = ::read(out_, buf, sizeof(buf));
		if (n <= 0)
			return std::nullopt;
		buffer_.append(buf, size_t(n));
	}
}

std::optional<std::string> Process::expect(const std::string &prefix, Ms timeout)
{
	auto end = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		auto left = std::chrono::duration_cast<Ms>(end - std::chrono::steady_clock::now());
		auto line = read_line(left.count() > 0 ? left : Ms(0));
		if (!line)
			return std::nullopt;
		if (line->rfind(prefix, 0) == 0)
			return line->substr(prefix.size());
	}
}

std::string Process::read_all(Ms timeout)
{
	std::string all;
	while (auto line = read_line(timeout))
		all += *line + "\n";
	return all + buffer_;
}

void Process::write_line(const std::string &line)
{
	std::string l = line + "\n";
	if (in_ >= 0 && ::write(in_, l.data(), l.size()) != ssize_t(l.size()))
		throw std::runtime_error("write to peer");
}

void Process::close_stdin()
{
	if (in_ >= 0)
		close(std::exchange(in_, -1));
}

void Process::kill(int sig)
{
	if (pid_ > 0)
		::kill(pid_, sig);
}

std::optional<int> Process::wait(Ms timeout)
{
	if (pid_ <= 0)
		return std::nullopt;
	int status = 0;
	bool done = eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
	if (!done)
		return std::nullopt;
	pid_ = -1;
	return status;
}

std::vector<std::string> split(const std::string &s)
{
	std::istringstream in(s);
	std::vector<std::string> words;
	for (std::string w; in >> w;)
		words.push_back(w);
	return words;
}

} // namespace broker_test
