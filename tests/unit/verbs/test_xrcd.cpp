/* SPDX-License-Identifier: MIT */
/*
 * XRC domains through the public verbs API: the ibv_open_xrcd(3) table of fd
 * and oflags as ib_uverbs implements it, shared between contexts, threads
 * and processes (with xrcd-helper as the other process).
 */
#include "cqsrq_helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace cqsrq_test;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t fd_and_oflags = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;

struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags, int *err = nullptr)
{
	struct ibv_xrcd_init_attr attr{};
	attr.comp_mask = fd_and_oflags;
	attr.fd = fd;
	attr.oflags = oflags;
	errno = 0;
	struct ibv_xrcd *x = ibv_open_xrcd(ctx, &attr);
	if (err)
		*err = x ? 0 : errno;
	return x;
}

/* errno of a failed open, 0 after a successful open (closed at once). */
int try_open(struct ibv_context *ctx, int fd, int oflags)
{
	int err;
	struct ibv_xrcd *x = open_xrcd(ctx, fd, oflags, &err);
	if (x)
		CHECK(ibv_close_xrcd(x) == 0);
	return err;
}

/* A fresh file: its inode names a domain nobody has opened yet. */
struct TempFile {
	std::string path;
	int fd = -1;

	TempFile()
	{
		const char *dir = std::getenv("TMPDIR");
		path = std::string(dir && *dir ? dir : "/tmp") + "/shmverbs-xrcd-test-XXXXXX";
		fd = mkstemp(path.data());
		REQUIRE(fd >= 0);
	}
	~TempFile()
	{
		::close(fd);
		::unlink(path.c_str());
	}
};

/* The other process: see xrcd_helper.cpp. */
struct Helper {
	pid_t pid = -1;
	int to_child = -1;
	int from_child = -1;

	Helper(const std::string &path, int oflags)
	{
		const char *exe = std::getenv("SHMVERBS_TEST_XRCD_HELPER");
		REQUIRE(exe);
		int in[2], out[2];
		REQUIRE(pipe2(in, O_CLOEXEC) == 0);
		REQUIRE(pipe2(out, O_CLOEXEC) == 0);
		std::string flags = std::to_string(oflags);
		pid = fork();
		REQUIRE(pid >= 0);
		if (pid == 0) {
			dup2(in[0], STDIN_FILENO);
			dup2(out[1], STDOUT_FILENO);
			execl(exe, exe, path.c_str(), flags.c_str(), static_cast<char *>(nullptr));
			_exit(127);
		}
		::close(in[0]);
		::close(out[1]);
		to_child = in[1];
		from_child = out[0];
	}
	~Helper()
	{
		if (pid > 0)
			finish();
	}

	void go() { REQUIRE(::write(to_child, "g", 1) == 1); }

	/* What ibv_open_xrcd() gave in the helper; -1 if it said nothing. */
	int result()
	{
		std::string line;
		char c;
		while (readable(from_child, 5000) && ::read(from_child, &c, 1) == 1 && c != '\n')
			line += c;
		return line.empty() ? -1 : std::atoi(line.c_str());
	}
	int open_now()
	{
		go();
		return result();
	}

	/* Lets the helper close its domain and exit; its exit status. */
	int finish()
	{
		if (to_child >= 0)
			::close(to_child);
		to_child = -1;
		int status = wait_exit(5000);
		::close(from_child);
		pid = -1;
		return status;
	}
	void kill9()
	{
		::kill(pid, SIGKILL);
		wait_exit(5000);
		::close(to_child);
		::close(from_child);
		to_child = -1;
		pid = -1;
	}

private:
	int wait_exit(int timeout_ms)
	{
		int status = 0;
		for (int waited = 0; waited < timeout_ms; waited += 5) {
			if (waitpid(pid, &status, WNOHANG) == pid)
				return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
			std::this_thread::sleep_for(5ms);
		}
		::kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		return -1;
	}
};

} // namespace

TEST_CASE("ibv_open_xrcd argument errors", "[xrcd]")
{
	Device d;
	struct {
		const char *what;
		uint32_t comp_mask;
		int err;
	} const table[] = {
		{"no FD bit", IBV_XRCD_INIT_ATTR_OFLAGS, EINVAL},
		{"no OFLAGS bit", IBV_XRCD_INIT_ATTR_FD, EINVAL},
		{"empty comp_mask", 0, EINVAL},
		{"unknown comp_mask bit", fd_and_oflags | IBV_XRCD_INIT_ATTR_RESERVED, EOPNOTSUPP},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		struct ibv_xrcd_init_attr attr{};
		attr.comp_mask = t.comp_mask;
		attr.fd = -1;
		attr.oflags = O_CREAT;
		errno = 0;
		CHECK(ibv_open_xrcd(d.ctx, &attr) == nullptr);
		CHECK(errno == t.err);
	}
	errno = 0;
	CHECK(ibv_open_xrcd(d.ctx, nullptr) == nullptr);
	CHECK(errno == EINVAL);

	/* An fd that is not open. */
	int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0);
	::close(fd);
	CHECK(try_open(d.ctx, fd, O_CREAT) == EBADF);
	CHECK(try_open(d.ctx, -2, O_CREAT) == EBADF);
}

TEST_CASE("fd -1 opens a new anonymous domain whatever the oflags", "[xrcd]")
{
	Device d;
	for (int oflags : {0, O_CREAT, O_CREAT | O_EXCL, O_EXCL}) {
		CAPTURE(oflags);
		struct ibv_xrcd *a = open_xrcd(d.ctx, -1, oflags);
		struct ibv_xrcd *b = open_xrcd(d.ctx, -1, oflags);
		REQUIRE(a);
		REQUIRE(b);
		CHECK(a != b);
		CHECK(a->context == d.ctx);
		CHECK(ibv_close_xrcd(a) == 0);
		CHECK(ibv_close_xrcd(b) == 0);
	}
}

TEST_CASE("named domains: the O_CREAT/O_EXCL table within a process", "[xrcd]")
{
	Device d, d2;
	TempFile f;
	TempFile g;

	/* Opening without O_CREAT needs an existing domain. */
	CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	CHECK(try_open(d.ctx, f.fd, O_EXCL) == EAGAIN);

	struct ibv_xrcd *first = open_xrcd(d.ctx, f.fd, O_CREAT | O_EXCL);
	REQUIRE(first);
	struct {
		const char *what;
		struct ibv_context *ctx;
		int oflags;
		int err;
	} const table[] = {
		{"existing, no flags", d.ctx, 0, 0},
		{"existing, O_CREAT has no effect", d.ctx, O_CREAT, 0},
		{"existing, O_CREAT|O_EXCL", d.ctx, O_CREAT | O_EXCL, EINVAL},
		{"existing, O_EXCL alone", d.ctx, O_EXCL, EINVAL},
		{"another context shares it", d2.ctx, 0, 0},
		{"another context, O_CREAT|O_EXCL", d2.ctx, O_CREAT | O_EXCL, EINVAL},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		CHECK(try_open(t.ctx, f.fd, t.oflags) == t.err);
	}

	/* The inode names the domain, not the fd or the path. */
	int again = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
	REQUIRE(again >= 0);
	CHECK(try_open(d.ctx, again, O_CREAT | O_EXCL) == EINVAL);
	std::string link = f.path + ".link";
	REQUIRE(::link(f.path.c_str(), link.c_str()) == 0);
	int linked = ::open(link.c_str(), O_RDONLY | O_CLOEXEC);
	REQUIRE(linked >= 0);
	CHECK(try_open(d.ctx, linked, 0) == 0);
	::close(linked);
	::unlink(link.c_str());
	/* Another file is another domain. */
	CHECK(try_open(d.ctx, g.fd, 0) == EAGAIN);

	/* The domain lives while any handle does. */
	struct ibv_xrcd *second = open_xrcd(d2.ctx, again, 0);
	REQUIRE(second);
	CHECK(ibv_close_xrcd(first) == 0);
	CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
	CHECK(ibv_close_xrcd(second) == 0);
	CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == 0);
	::close(again);
}

TEST_CASE("close_xrcd is EBUSY only for the handle an SRQ was made through", "[xrcd][destroy]")
{
	Device d;
	TempFile f;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 4, nullptr, nullptr, 0);
	struct ibv_xrcd *a = open_xrcd(d.ctx, f.fd, O_CREAT);
	struct ibv_xrcd *b = open_xrcd(d.ctx, f.fd, 0);
	REQUIRE(pd);
	REQUIRE(cq);
	REQUIRE(a);
	REQUIRE(b);
	struct ibv_srq_init_attr_ex attr{};
	attr.attr.max_wr = 4;
	attr.attr.max_sge = 1;
	attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			 IBV_SRQ_INIT_ATTR_CQ;
	attr.srq_type = IBV_SRQT_XRC;
	attr.pd = pd;
	attr.xrcd = a;
	attr.cq = cq;
	struct ibv_srq *srq = ibv_create_srq_ex(d.ctx, &attr);
	REQUIRE(srq);
	CHECK(ibv_close_xrcd(a) == EBUSY);
	CHECK(ibv_close_xrcd(b) == 0);
	/* The busy handle still holds the domain. */
	CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_close_xrcd(a) == 0);
	CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("threads racing O_CREAT|O_EXCL: exactly one creates", "[xrcd][threads]")
{
	Device d, d2;
	TempFile f;
	for (int round = 0; round < 20; round++) {
		std::atomic<int> created{0}, refused{0}, other{0};
		std::vector<struct ibv_xrcd *> got(8, nullptr);
		std::vector<std::thread> threads;
		for (int t = 0; t < 8; t++)
			threads.emplace_back([&, t] {
				int err;
				got[t] = open_xrcd(t % 2 ? d.ctx : d2.ctx, f.fd, O_CREAT | O_EXCL, &err);
				(err == 0 ? created : err == EINVAL ? refused : other)++;
			});
		for (auto &t : threads)
			t.join();
		CHECK(created == 1);
		CHECK(refused == 7);
		CHECK(other == 0);
		for (auto *x : got)
			if (x)
				CHECK(ibv_close_xrcd(x) == 0);
	}
}

TEST_CASE("named domains are shared between processes", "[xrcd][process]")
{
	Device d;
	TempFile f;

	SECTION("created elsewhere, opened here")
	{
		Helper h(f.path, O_CREAT | O_EXCL);
		REQUIRE(h.open_now() == 0);
		CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
		struct ibv_xrcd *mine = open_xrcd(d.ctx, f.fd, 0);
		REQUIRE(mine);
		CHECK(h.finish() == 0);
		/* Still ours after the creator left. */
		CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
		CHECK(ibv_close_xrcd(mine) == 0);
		CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	}
	SECTION("created here, opened elsewhere")
	{
		struct ibv_xrcd *mine = open_xrcd(d.ctx, f.fd, O_CREAT);
		REQUIRE(mine);
		Helper excl(f.path, O_CREAT | O_EXCL);
		CHECK(excl.open_now() == EINVAL);
		CHECK(excl.finish() == 0);
		Helper plain(f.path, 0);
		CHECK(plain.open_now() == 0);
		CHECK(ibv_close_xrcd(mine) == 0);
		/* The other process keeps the domain alive. */
		CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
		CHECK(plain.finish() == 0);
		CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	}
	SECTION("nobody has it: no O_CREAT fails elsewhere too")
	{
		Helper h(f.path, 0);
		CHECK(h.open_now() == EAGAIN);
		CHECK(h.finish() == 0);
	}
	SECTION("a process that dies releases its domain")
	{
		Helper h(f.path, O_CREAT);
		REQUIRE(h.open_now() == 0);
		CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == EINVAL);
		h.kill9();
		CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
		CHECK(try_open(d.ctx, f.fd, O_CREAT | O_EXCL) == 0);
	}
	SECTION("processes racing O_CREAT|O_EXCL: exactly one creates")
	{
		std::vector<std::unique_ptr<Helper>> hs;
		for (int i = 0; i < 4; i++)
			hs.push_back(std::make_unique<Helper>(f.path, O_CREAT | O_EXCL));
		for (auto &h : hs)
			h->go();
		int created = 0, refused = 0;
		for (auto &h : hs) {
			int r = h->result();
			created += r == 0;
			refused += r == EINVAL;
		}
		CHECK(created == 1);
		CHECK(refused == 3);
		for (auto &h : hs)
			CHECK(h->finish() == 0);
		CHECK(try_open(d.ctx, f.fd, 0) == EAGAIN);
	}
}
