/* SPDX-License-Identifier: MIT */
/* Bounce slots + target helper thread, across processes, with dead peers. */
#include <catch2/catch.hpp>

#include "bounce.h"
#include "helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

using namespace shmverbs::memshare;
using namespace memshare_test;

namespace {

double now_s()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Allows only [lo, hi). */
struct Window {
	uint64_t lo, hi;
};
BounceServer::Access only_window(void *ctx, uint64_t addr, uint64_t len, bool)
{
	auto *w = static_cast<Window *>(ctx);
	return addr >= w->lo && addr + len <= w->hi ? BounceServer::Access::allowed
						    : BounceServer::Access::refused;
}

} // namespace

TEST_CASE("bounce write, read and atomics reach a target process", "[bounce]")
{
	int sv[2];
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	constexpr int kAdds = 300;
	/* Forked from the main thread while it is the only one: a child of a
	 * multi-threaded process must not start threads (ThreadSanitizer
	 * kills it), and this child starts the helper. */
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		auto target = [&]() -> int {
			/* The target: private memory, a helper, and a thread
			 * of its own doing CPU atomics on the same counter. */
			char *mem = map_anon(2 * kPage);
			Window win{reinterpret_cast<uint64_t>(mem),
				   reinterpret_cast<uint64_t>(mem) + 2 * kPage};
			std::unique_ptr<BounceServer> srv(
				BounceServer::create(4, 1024, only_window, &win).get());
			if (!srv || send_fd(sv[1], srv->fd(), win.lo) != 0)
				return 1;
			auto *counter = reinterpret_cast<uint64_t *>(mem + kPage);
			for (int i = 0; i < kAdds; i++)
				__atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST);
			char c;
			if (read(sv[1], &c, 1) != 1)
				return 2;
			/* Check after joining the helper: that its copies came
			 * first is ordered through the initiator's process,
			 * which ThreadSanitizer cannot follow. */
			srv.reset();
			if (std::memcmp(mem + 10, "from the initiator", 19) != 0)
				return 3;
			if (*counter != 2 * kAdds + 1000)
				return 4;
			return 0;
		};
		_exit(target());
	}
	/* Only the child holds this end now: if it dies, recv_fd sees EOF. */
	close(sv[1]);
	uint64_t base;
	int fd = recv_fd(sv[0], base);
	REQUIRE(fd >= 0);
	std::unique_ptr<BounceClient> c(BounceClient::attach(fd).get());
	close(fd);
	REQUIRE(c);
	CHECK(c->target_pid() == pid);
	CHECK(bounce_write(*c, base + 10, "from the initiator", 19) == 0);
	char back[19] = {};
	CHECK(bounce_read(*c, back, base + 10, 19) == 0);
	CHECK(std::memcmp(back, "from the initiator", 19) == 0);
	/* Larger than a slot: chunked, in order. */
	std::vector<char> big(3000, 'z');
	CHECK(bounce_write(*c, base + 200, big.data(), 3000) == 0);
	/* Rejected by the target's check; unaligned atomics. */
	CHECK(bounce_write(*c, base + 2 * kPage - 4, "12345678", 8) == EACCES);
	uint64_t old;
	CHECK(bounce_atomic(*c, BounceOp::fetch_add, base + kPage + 4, 1, 0, &old) == EINVAL);
	uint64_t cnt = base + kPage;
	for (int i = 0; i < kAdds; i++)
		REQUIRE(bounce_atomic(*c, BounceOp::fetch_add, cnt, 1, 0, &old) == 0);
	/* Compare-and-swap: fails with the old value, then succeeds. */
	uint64_t cur;
	REQUIRE(bounce_read(*c, &cur, cnt, 8) == 0);
	CHECK(bounce_atomic(*c, BounceOp::cmp_swap, cnt, 7, cur + 1, &old) == 0);
	CHECK(old == cur);
	/* Wait until the target's own adds are done, then swap in a known value. */
	for (int i = 0; i < 2000 && cur != 2 * kAdds; i++) {
		usleep(1000);
		REQUIRE(bounce_read(*c, &cur, cnt, 8) == 0);
	}
	REQUIRE(cur == 2 * kAdds);
	CHECK(bounce_atomic(*c, BounceOp::cmp_swap, cnt, 2 * kAdds + 1000, cur, &old) == 0);
	CHECK(old == cur);
	REQUIRE(write(sv[0], "v", 1) == 1);
	CHECK(wait_child(pid, 20) == 0);
	close(sv[0]);
}

TEST_CASE("a dead target never hangs the initiator", "[bounce]")
{
	int sv[2];
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		char *mem = map_anon(kPage);
		std::unique_ptr<BounceServer> srv(BounceServer::create(2, 64).get());
		send_fd(sv[1], srv->fd(), reinterpret_cast<uint64_t>(mem));
		pause();
		_exit(0);
	}
	uint64_t base;
	int fd = recv_fd(sv[0], base);
	REQUIRE(fd >= 0);
	std::unique_ptr<BounceClient> c(BounceClient::attach(fd, 3000).get());
	close(fd);
	REQUIRE(c);
	CHECK(bounce_write(*c, base, "alive", 6) == 0);
	kill(pid, SIGKILL);
	REQUIRE(wait_child(pid) == 128 + SIGKILL);
	double t0 = now_s();
	CHECK(bounce_write(*c, base, "dead", 5) == EPIPE);
	CHECK(now_s() - t0 < 1.0);
	close(sv[0]);
	close(sv[1]);
}

TEST_CASE("a dead initiator never blocks the helper or the slots", "[bounce]")
{
	char *mem = map_anon(kPage);
	REQUIRE(mem);
	std::unique_ptr<BounceServer> srv(BounceServer::create(1, 64).get());
	REQUIRE(srv);
	int fd = srv->fd();
	auto base = reinterpret_cast<uint64_t>(mem);
	/* The child claims the only slot, posts a request and dies without
	 * waiting for it or releasing the slot. */
	int rc = run_child([&]() -> int {
		void *p = mmap(nullptr, bounce_file_size(1, 64), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			return 1;
		auto *slot = reinterpret_cast<BounceSlot *>(static_cast<char *>(p) + sizeof(BounceHeader));
		slot->owner.store(static_cast<uint32_t>(getpid()));
		slot->op = uint32_t(BounceOp::write);
		slot->addr = base + 100;
		slot->len = 4;
		std::memcpy(reinterpret_cast<char *>(slot + 1), "dead", 4);
		slot->phase.store(kPhaseRequest);
		/* not ringing the doorbell either: the helper's timed wait
		 * finds it */
		_exit(0);
	});
	REQUIRE(rc == 0);
	std::unique_ptr<BounceClient> c(BounceClient::attach(fd).get());
	REQUIRE(c);
	double t0 = now_s();
	for (int i = 0; i < 5; i++)
		REQUIRE(bounce_write(*c, base, "next", 5) == 0);
	CHECK(now_s() - t0 < 2.0);
	CHECK(srv->served() == 6);
	double t1 = now_s();
	srv.reset(); /* the helper stops promptly */
	CHECK(now_s() - t1 < 1.0);
	/* Read after the helper was joined: client and helper share the slots
	 * through two mappings of one file here, an ordering ThreadSanitizer
	 * cannot see (it tracks addresses); the join it does see. */
	CHECK(std::strcmp(mem, "next") == 0);
	CHECK(std::memcmp(mem + 100, "dead", 4) == 0); /* executed, harmlessly */
	munmap(mem, kPage);
}

TEST_CASE("a bounce file with a bad header is refused", "[bounce]")
{
	int fd = memfd_create("fake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	REQUIRE(ftruncate(fd, 4096) == 0);
	CHECK(BounceClient::attach(fd).error() == EINVAL); /* not sealed */
	REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
	CHECK(BounceClient::attach(fd).error() == EINVAL); /* no magic */
	BounceHeader h{};
	h.magic = kBounceMagic;
	h.version = kBounceVersion;
	h.nslots = 1000; /* larger than the file */
	h.slot_size = 4096;
	h.owner_pid = getpid();
	REQUIRE(pwrite(fd, &h, sizeof(h), 0) == sizeof(h));
	CHECK(BounceClient::attach(fd).error() == EINVAL);
	close(fd);
	CHECK(BounceServer::create(0, 64).error() == EINVAL);
	CHECK(BounceServer::create(4, 100).error() == EINVAL);
}

namespace {

/* What the helper saw, from its Validate hook: called for each request
 * before the copy, with that slot busy and the others as the initiator
 * left them. */
struct Seen {
	int calls = 0;
	int max_waiting = 0;        /* other slots requested meanwhile */
	int waiting_at_last = -1;   /* the same, for the last chunk */
	int calls_before_last = -1;
	/* The most chunks posted (doorbell rings) while a chunk other than
	 * the last was executed. */
	uint32_t max_posted_before_last = 0;
};

struct Watch {
	/* The bounce file, mapped here too; published (release) once
	 * mapped, as the helper may run before the test's thread goes on. */
	std::atomic<const char *> file{nullptr};
	uint32_t nslots, slot_size;
	uint64_t end; /* one past the transfer's last byte */
	Seen seen;
};

int requested(const Watch &w, const char *file)
{
	int n = 0;
	for (uint32_t i = 0; i < w.nslots; i++) {
		auto *s = reinterpret_cast<const BounceSlot *>(
			file + sizeof(BounceHeader) + size_t{i} * (sizeof(BounceSlot) + w.slot_size));
		n += s->phase.load() == kPhaseRequest;
	}
	return n;
}

BounceServer::Access watch(void *ctx, uint64_t addr, uint64_t len, bool)
{
	auto *w = static_cast<Watch *>(ctx);
	Seen &seen = w->seen;
	const char *file = w->file.load(std::memory_order_acquire);
	/* A slow helper: the initiator queues what it may meanwhile. */
	usleep(seen.calls++ == 0 ? 20000 : 2000);
	int waiting = requested(*w, file);
	seen.max_waiting = std::max(seen.max_waiting, waiting);
	if (addr + len == w->end) {
		seen.waiting_at_last = waiting;
		seen.calls_before_last = seen.calls - 1;
	} else {
		uint32_t posted = reinterpret_cast<const BounceHeader *>(file)->doorbell.load();
		seen.max_posted_before_last = std::max(seen.max_posted_before_last, posted);
	}
	return BounceServer::Access::allowed;
}

} // namespace

/* What the transfer test's child reports. */
struct WatchResult {
	bool wrote, read, same_after_write, same_after_read;
	Seen write, reread; /* the hook's view of each transfer */
};

/* One transfer through a server made for it; `seen` is read once the helper
 * is joined (the slots' atomics are reached through two mappings, which
 * ThreadSanitizer cannot pair). */
template <typename Move>
bool through_server(Seen &seen, uint32_t nslots, uint32_t slot_size, uint64_t end, Move &&move)
{
	Watch w;
	w.nslots = nslots;
	w.slot_size = slot_size;
	w.end = end;
	std::unique_ptr<BounceServer> server(BounceServer::create(nslots, slot_size, watch, &w).get());
	if (!server)
		return false;
	const size_t bytes = bounce_file_size(nslots, slot_size);
	void *map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, server->fd(), 0);
	if (map == MAP_FAILED)
		return false;
	w.file.store(static_cast<const char *>(map), std::memory_order_release);
	std::unique_ptr<BounceClient> client(BounceClient::attach(server->fd()).get());
	const bool ok = client && move(*client) == 0;
	client.reset();
	server.reset();
	munmap(map, bytes);
	seen = w.seen;
	return ok;
}

TEST_CASE("a long transfer keeps chunks in flight and lands its last chunk last", "[bounce]")
{
	constexpr uint32_t nslots = 16, slot_size = 4096, chunks = 40; /* slots reused */
	int fds[2];
	REQUIRE(pipe(fds) == 0);
	/* In a child, as the test above: the helper is a thread, and a
	 * process that had one may not fork children that start threads
	 * under ThreadSanitizer (the fork tests that follow). */
	int rc = run_child([&] {
		std::vector<char> target(size_t{chunks} * slot_size), src(target.size()),
			back(target.size());
		for (size_t i = 0; i < src.size(); i++)
			src[i] = char(i * 7 + 1);
		const uint64_t va = uint64_t(uintptr_t(target.data()));
		const uint64_t end = va + target.size();
		WatchResult r{};
		r.wrote = through_server(r.write, nslots, slot_size, end, [&](BounceClient &c) {
			return bounce_write(c, va, src.data(), src.size());
		});
		r.same_after_write = target == src;
		r.read = through_server(r.reread, nslots, slot_size, end, [&](BounceClient &c) {
			return bounce_read(c, back.data(), va, back.size());
		});
		r.same_after_read = back == src;
		return write(fds[1], &r, sizeof(r)) == ssize_t(sizeof(r)) ? 0 : 4;
	});
	close(fds[1]);
	WatchResult r{};
	const bool got = read(fds[0], &r, sizeof(r)) == ssize_t(sizeof(r));
	close(fds[0]);
	REQUIRE(rc == 0);
	REQUIRE(got);
	CHECK(r.wrote);
	CHECK(r.same_after_write);
	CHECK(r.read);
	CHECK(r.same_after_read);
	CHECK(r.reread.calls == int(chunks));
	const Seen &w = r.write;
	CHECK(w.calls == int(chunks));
	/* Several chunks were requested while the helper held the first. */
	CHECK(w.max_waiting >= 2);
	/* The write's last chunk came alone, after every other was done: it
	 * was not even posted while another one was executed. */
	CHECK(w.calls_before_last == int(chunks) - 1);
	CHECK(w.waiting_at_last == 0);
	CHECK(w.max_posted_before_last == chunks - 1);
}

namespace {

/* A helper whose every request takes `ms` (a slow or stuck target). */
struct Slow {
	int ms;
};
BounceServer::Access slowly(void *ctx, uint64_t, uint64_t, bool)
{
	usleep(useconds_t(static_cast<Slow *>(ctx)->ms) * 1000);
	return BounceServer::Access::allowed;
}

} // namespace

TEST_CASE("the bounce timeout runs while no chunk is answered, for all in flight together",
	  "[bounce]")
{
	/* Like a NIC's ACK timeout: a transfer that keeps being answered
	 * goes on however long it takes; one that is not fails once, after
	 * the timeout, not after a timeout per chunk in flight. */
	struct Result {
		int slow_err;
		int stuck_err;
		double stuck_s;
	};
	int fds[2];
	REQUIRE(pipe(fds) == 0);
	int rc = run_child([&] {
		constexpr uint32_t slot_size = 4096;
		std::vector<char> target(16 * slot_size), src(target.size(), 'x');
		const uint64_t va = uint64_t(uintptr_t(target.data()));
		Result r{};
		{
			Slow slow{20}; /* 16 chunks: 320 ms, each well within 100 */
			std::unique_ptr<BounceServer> srv(
				BounceServer::create(16, slot_size, slowly, &slow).get());
			if (!srv)
				return 1;
			std::unique_ptr<BounceClient> c(BounceClient::attach(srv->fd(), 100).get());
			if (!c)
				return 2;
			r.slow_err = bounce_write(*c, va, src.data(), src.size());
			c.reset();
			srv.reset();
		}
		{
			Slow stuck{1000}; /* the helper holds the first chunk 1 s */
			std::unique_ptr<BounceServer> srv(
				BounceServer::create(16, slot_size, slowly, &stuck).get());
			if (!srv)
				return 3;
			std::unique_ptr<BounceClient> c(BounceClient::attach(srv->fd(), 100).get());
			if (!c)
				return 4;
			const double t0 = now_s();
			r.stuck_err = bounce_write(*c, va, src.data(), 8 * slot_size);
			r.stuck_s = now_s() - t0;
			c.reset();
			srv.reset();
		}
		return write(fds[1], &r, sizeof(r)) == ssize_t(sizeof(r)) ? 0 : 5;
	});
	close(fds[1]);
	Result r{};
	const bool got = read(fds[0], &r, sizeof(r)) == ssize_t(sizeof(r));
	close(fds[0]);
	REQUIRE(rc == 0);
	REQUIRE(got);
	CHECK(r.slow_err == 0);
	CHECK(r.stuck_err == ETIMEDOUT);
	CAPTURE(r.stuck_s);
	/* The chunk the helper holds: the timeout and its grace (200 ms);
	 * the 7 behind it are withdrawn at once (one timeout each: 900 ms). */
	CHECK(r.stuck_s < 0.6);
}

