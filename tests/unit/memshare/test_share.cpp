/* SPDX-License-Identifier: MIT */
/* Making registered memory shareable: the switch, refcounts, unshare, what
 * is not shareable, peer windows, concurrent writers, fork(). */
#include <catch2/catch.hpp>

#include "cma.h"
#include "helpers.h"
#include "memshare.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

using namespace shmverbs::memshare;
using namespace memshare_test;

namespace {

/* The fallback share() reports for memory it cannot share, in this run. */
Path expected_fallback()
{
	return cma_available() ? Path::cma : Path::bounce;
}

/* Whether the memory file holds data anywhere in [s, e). */
bool file_has_data(uintptr_t s, uintptr_t e)
{
	off_t d = lseek(memory_file_fd(), static_cast<off_t>(s), SEEK_DATA);
	return d >= 0 && static_cast<uintptr_t>(d) < e;
}

/* A child handler registered before memshare's own (constructors with a
 * priority run before those without): it stands for glibc's own child-side
 * work (__malloc_fork_unlock_child writes every arena's header) and for
 * handlers of libraries loaded earlier. It writes one heap object. */
struct EarlyObject {
	uint64_t value;
};
EarlyObject *volatile early_object = nullptr;

__attribute__((constructor(101))) void register_early_child_handler()
{
	pthread_atfork(nullptr, nullptr, [] {
		if (early_object)
			early_object->value = 0xbad;
	});
}

} // namespace

TEST_CASE("share switches pages to the memory file and keeps their contents", "[memshare]")
{
	char *buf = map_anon(4 * kPage);
	REQUIRE(buf);
	for (size_t i = 0; i < 4 * kPage; i++)
		buf[i] = static_cast<char>(i * 7);
	/* An unaligned registration covers the pages it touches. */
	REQUIRE(share(buf + kPage + 100, kPage) == Path::shared);
	CHECK_FALSE(page_is_shared(buf));
	CHECK(page_is_shared(buf + kPage));
	CHECK(page_is_shared(buf + 2 * kPage));
	CHECK_FALSE(page_is_shared(buf + 3 * kPage));
	CHECK(perms_at(buf + kPage) == "rw-s");
	bool same = true;
	for (size_t i = 0; i < 4 * kPage; i++)
		same &= buf[i] == static_cast<char>(i * 7);
	CHECK(same);

	/* A window of our own memory file shows the same memory. */
	PeerWindow w;
	REQUIRE(map_peer(memory_file_fd(), reinterpret_cast<uint64_t>(buf + kPage), 2 * kPage, w) == 0);
	auto *view = static_cast<char *>(w.at(reinterpret_cast<uint64_t>(buf + kPage)));
	CHECK(view[5] == buf[kPage + 5]);
	poke(view + 9, 'W');
	CHECK(peek(buf + kPage + 9) == 'W');
	poke(buf + 2 * kPage + 1, 'T');
	CHECK(peek(view + kPage + 1) == 'T');

	unshare(buf + kPage + 100, kPage);
	CHECK_FALSE(page_is_shared(buf + kPage));
	CHECK(perms_at(buf + kPage) == "rw-p");
	CHECK(peek(buf + kPage + 9) == 'W');
	CHECK(peek(buf + 2 * kPage + 1) == 'T');
	/* Private again: the window no longer reaches it. */
	poke(view + 10, 'X');
	CHECK(peek(buf + kPage + 10) != 'X');
	w.reset();
	forget_peer(memory_file_fd());
	munmap(buf, 4 * kPage);
}

/* A page switched in and out keeps the objects beside the buffer, which
 * other threads go on reading: the new mappings are not stores of the
 * program's. Under ThreadSanitizer this fails with a report unless the
 * switch keeps its mmap()s out of TSan's view (its interceptor takes an
 * mmap over memory for a write to all of it; a QP's CQ on the page of a
 * buffer that pyverbs re-registered was reported so). */
TEST_CASE("objects sharing a page with a registered buffer are read on across the switch",
	  "[memshare][threads]")
{
	char *page = map_anon(kPage);
	REQUIRE(page);
	auto *neighbour = reinterpret_cast<volatile long *>(page);
	*neighbour = 42; /* written before the reader starts: ordered with it */
	std::mutex m;
	std::atomic<bool> stop{false};
	std::atomic<int> reads{0};
	std::atomic<long> seen{42};
	std::thread reader([&] {
		while (!stop.load(std::memory_order_relaxed)) {
			std::lock_guard guard(m);
			seen.store(*neighbour, std::memory_order_relaxed);
			if (seen.load(std::memory_order_relaxed) != 42)
				break;
			reads.fetch_add(1, std::memory_order_relaxed);
		}
	});
	auto read_some = [&] {
		/* Nothing orders our switch with the reader's next reads: the
		 * mutex is the reader's alone from here on. */
		const int from = reads.load(std::memory_order_relaxed);
		while (reads.load(std::memory_order_relaxed) < from + 100 &&
		       seen.load(std::memory_order_relaxed) == 42)
			std::this_thread::yield();
	};
	read_some();
	REQUIRE(share(page + 256, 100) == Path::shared);
	CHECK(page_is_shared(page));
	read_some();
	unshare(page + 256, 100);
	read_some();
	stop = true;
	reader.join();
	CHECK(seen == 42);
	CHECK(*neighbour == 42);
	munmap(page, kPage);
}

TEST_CASE("never-touched pages stay holes in the memory file", "[memshare]")
{
	char *buf = map_anon(64 * kPage);
	REQUIRE(buf);
	buf[10 * kPage] = 1;
	REQUIRE(share(buf, 64 * kPage) == Path::shared);
	auto s = reinterpret_cast<uintptr_t>(buf);
	CHECK_FALSE(file_has_data(s, s + 10 * kPage));
	CHECK(file_has_data(s, s + 11 * kPage));
	CHECK(buf[10 * kPage] == 1);
	CHECK(buf[20 * kPage] == 0);
	unshare(buf, 64 * kPage);
	CHECK(buf[10 * kPage] == 1);
	munmap(buf, 64 * kPage);
}

TEST_CASE("overlapping registrations are counted per page", "[memshare]")
{
	char *buf = map_anon(4 * kPage);
	REQUIRE(buf);
	REQUIRE(share(buf, 2 * kPage) == Path::shared);         /* pages 0-1 */
	REQUIRE(share(buf + kPage, 3 * kPage) == Path::shared); /* pages 1-3 */
	REQUIRE(share(buf + kPage, 1) == Path::shared);         /* page 1 */
	CHECK(share_count_at(buf) == 1);
	CHECK(share_count_at(buf + kPage) == 3);
	CHECK(share_count_at(buf + 3 * kPage) == 1);
	buf[kPage] = 'a';
	unshare(buf, 2 * kPage);
	CHECK_FALSE(page_is_shared(buf));
	CHECK(page_is_shared(buf + kPage));
	unshare(buf + kPage, 3 * kPage);
	CHECK(page_is_shared(buf + kPage));
	CHECK_FALSE(page_is_shared(buf + 2 * kPage));
	unshare(buf + kPage, 1);
	CHECK_FALSE(page_is_shared(buf + kPage));
	CHECK(share_count_at(buf + kPage) == 0);
	CHECK(buf[kPage] == 'a');
	/* An unshare with no registration left changes nothing. */
	unshare(buf, kPage);
	CHECK(share_count_at(buf) == 0);
	munmap(buf, 4 * kPage);
}

TEST_CASE("protections are preserved across the switch", "[memshare]")
{
	char *buf = map_anon(2 * kPage, PROT_READ | PROT_WRITE | PROT_EXEC);
	if (!buf)
		{ WARN("no executable anonymous memory here"); return; }
	buf[0] = 'x';
	REQUIRE(share(buf, 2 * kPage) == Path::shared);
	CHECK(perms_at(buf) == "rwxs");
	unshare(buf, 2 * kPage);
	CHECK(perms_at(buf) == "rwxp");
	CHECK(buf[0] == 'x');
	munmap(buf, 2 * kPage);
}

TEST_CASE("memory that cannot be shared reports the fallback and is left alone", "[memshare]")
{
	SECTION("file-backed private mapping") {
		char path[] = "/tmp/memshare-test-XXXXXX";
		int fd = mkstemp(path);
		REQUIRE(fd >= 0);
		unlink(path);
		REQUIRE(ftruncate(fd, 2 * kPage) == 0);
		void *p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		REQUIRE(p != MAP_FAILED);
		CHECK(share(p, kPage) == expected_fallback());
		CHECK(perms_at(p) == "rw-p");
		munmap(p, 2 * kPage);
		close(fd);
	}
	SECTION("shared anonymous mapping made by the application") {
		void *p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		REQUIRE(p != MAP_FAILED);
		CHECK(share(p, kPage) == expected_fallback());
		munmap(p, kPage);
	}
	SECTION("read-only mapping") {
		char *p = map_anon(kPage, PROT_READ);
		REQUIRE(p);
		CHECK(share(p, kPage) == expected_fallback());
		CHECK(perms_at(p) == "r--p");
		munmap(p, kPage);
	}
	SECTION("the main thread's stack") {
		volatile char local[64] = {1};
		CHECK(share(const_cast<char *>(local), sizeof(local)) == expected_fallback());
		CHECK(local[0] == 1);
	}
	SECTION("hugetlb mapping") {
		void *p = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (p == MAP_FAILED)
			{ WARN("no huge pages reserved"); return; }
		CHECK(share(p, 4096) == expected_fallback());
		munmap(p, 2 << 20);
	}
	SECTION("a range with a hole, or partly not shareable: nothing switches") {
		char *buf = map_anon(3 * kPage);
		REQUIRE(buf);
		REQUIRE(munmap(buf + kPage, kPage) == 0);
		CHECK(share(buf, 3 * kPage) == expected_fallback());
		CHECK_FALSE(page_is_shared(buf));
		REQUIRE(mprotect(buf + 2 * kPage, kPage, PROT_READ) == 0);
		CHECK(share(buf + 2 * kPage - 1, 2) == expected_fallback());
		CHECK_FALSE(page_is_shared(buf + 2 * kPage));
		CHECK(share_count_at(buf) == 0);
		munmap(buf, 3 * kPage);
	}
}

TEST_CASE("unshare leaves a range the application unmapped or replaced alone", "[memshare]")
{
	forget_peer(memory_file_fd()); /* no window of ours keeps file pages */
	char *buf = map_anon(2 * kPage);
	REQUIRE(buf);
	REQUIRE(share(buf, 2 * kPage) == Path::shared);
	buf[0] = 'o';
	/* The application replaces page 0 with new memory of its own. */
	void *p = mmap(buf, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	REQUIRE(p == buf);
	buf[0] = 'n';
	buf[kPage] = 'k';
	/* A new registration over replaced pages is refused, not mixed up. */
	CHECK(share(buf, kPage) == expected_fallback());
	unshare(buf, 2 * kPage);
	CHECK(buf[0] == 'n');
	CHECK(perms_at(buf) == "rw-p");
	CHECK(buf[kPage] == 'k');
	CHECK_FALSE(page_is_shared(buf + kPage));
	auto s = reinterpret_cast<uintptr_t>(buf);
	CHECK_FALSE(file_has_data(s, s + 2 * kPage));
	munmap(buf, 2 * kPage);
}

TEST_CASE("MADV_DONTNEED: kept while registered, zero-fill once private again", "[memshare]")
{
	/* On a shared mapping MADV_DONTNEED only drops our page-table entries:
	 * the data stays in the memory file, so the application and its peers
	 * keep seeing the same memory (an allocator may only discard memory the
	 * program freed, and freeing registered memory before dereg_mr is a bug
	 * with real hardware too). After unshare the pages are private anonymous
	 * again and MADV_DONTNEED zero-fills them as usual. */
	char *buf = map_anon(2 * kPage);
	REQUIRE(buf);
	std::memset(buf, 'd', 2 * kPage);
	REQUIRE(share(buf, 2 * kPage) == Path::shared);
	PeerWindow w;
	REQUIRE(map_peer(memory_file_fd(), reinterpret_cast<uint64_t>(buf), 2 * kPage, w) == 0);
	REQUIRE(madvise(buf, 2 * kPage, MADV_DONTNEED) == 0);
	CHECK(buf[0] == 'd');
	poke(w.at(reinterpret_cast<uint64_t>(buf) + 1), 'p');
	CHECK(peek(buf + 1) == 'p');
	w.reset();
	unshare(buf, 2 * kPage);
	CHECK(buf[1] == 'p');
	REQUIRE(madvise(buf, 2 * kPage, MADV_DONTNEED) == 0);
	CHECK(buf[0] == 0);
	CHECK(buf[1] == 0);
	munmap(buf, 2 * kPage);
}

TEST_CASE("peer windows are cached, refcounted and checked", "[memshare]")
{
	char *buf = map_anon(4 * kPage);
	REQUIRE(buf);
	REQUIRE(share(buf, 4 * kPage) == Path::shared);
	auto va = reinterpret_cast<uint64_t>(buf);
	int fd = memory_file_fd();
	forget_peer(fd);
	size_t before = peer_window_count();
	PeerWindow a, b;
	REQUIRE(map_peer(fd, va, 4 * kPage, a) == 0);
	REQUIRE(map_peer(fd, va + kPage + 8, 16, b) == 0); /* inside a: reused */
	CHECK(peer_window_count() == before + 1);
	CHECK(b.at(va + kPage + 8) == a.at(va + kPage + 8));
	a.reset();
	b.reset();
	CHECK(peer_window_count() == before + 1); /* idle, cached */
	forget_peer(fd);
	CHECK(peer_window_count() == before);

	PeerWindow c;
	CHECK(map_peer(fd, (1ULL << 47) - kPage, 2 * kPage, c) == EINVAL);
	int plain = memfd_create("not-sealed", MFD_CLOEXEC);
	REQUIRE(ftruncate(plain, kPage) == 0);
	CHECK(map_peer(plain, 0, kPage, c) == EINVAL);
	close(plain);
	CHECK_FALSE(c);
	unshare(buf, 4 * kPage);
	munmap(buf, 4 * kPage);
}

TEST_CASE("another process stores and CPU atomics land in the registered pages", "[memshare]")
{
	char *buf = map_anon(2 * kPage);
	REQUIRE(buf);
	REQUIRE(share(buf, 2 * kPage) == Path::shared);
	auto va = reinterpret_cast<uint64_t>(buf);
	auto *counter = reinterpret_cast<uint64_t *>(buf + kPage);
	int sv[2];
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	constexpr int kAdds = 20000;
	pid_t pid;
	/* The peer receives the fd as it will from the broker. */
	std::thread sender([&] { send_fd(sv[0], memory_file_fd(), va); });
	int rc_holder = 0;
	std::thread runner([&] {
		rc_holder = run_child(
			[&]() -> int {
				uint64_t target_va;
				int fd = recv_fd(sv[1], target_va);
				PeerWindow w;
				if (fd < 0 || map_peer(fd, target_va, 2 * kPage, w) != 0)
					return 1;
				std::memcpy(w.at(target_va), "hello", 6);
				auto *c = static_cast<uint64_t *>(w.at(target_va + kPage));
				for (int i = 0; i < kAdds; i++)
					__atomic_fetch_add(c, 1, __ATOMIC_SEQ_CST);
				return 0;
			},
			10, &pid);
	});
	for (int i = 0; i < kAdds; i++)
		__atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST);
	sender.join();
	runner.join();
	CHECK(rc_holder == 0);
	CHECK(std::strcmp(buf, "hello") == 0);
	CHECK(__atomic_load_n(counter, __ATOMIC_SEQ_CST) == 2 * kAdds);
	close(sv[0]);
	close(sv[1]);
	unshare(buf, 2 * kPage);
	munmap(buf, 2 * kPage);
}

/* Tagged [write-barrier]: not run under ThreadSanitizer (tests/meson.build). */
TEST_CASE("no write by another thread is lost while pages are switched",
	  "[memshare][threads][write-barrier]")
{
	constexpr int kThreads = 3;
	char *buf = map_anon(4 * kPage);
	REQUIRE(buf);
	std::atomic<bool> stop{false};
	std::atomic<int> started{0};
	uint64_t local[kThreads] = {};
	auto *shared_counter = reinterpret_cast<uint64_t *>(buf + 2 * kPage + 2048);
	std::vector<std::thread> threads;
	for (int t = 0; t < kThreads; t++)
		threads.emplace_back([&, t] {
			/* Each thread owns a plain counter (load, add, store: a
			 * lost store shows) in page t and shares an atomic one. */
			auto *mine = reinterpret_cast<volatile uint64_t *>(buf + t * kPage + 64 * t);
			started++;
			while (!stop.load(std::memory_order_relaxed)) {
				*mine = *mine + 1;
				local[t]++;
				__atomic_fetch_add(shared_counter, 1, __ATOMIC_RELAXED);
			}
		});
	while (started.load() < kThreads)
		std::this_thread::yield();
	for (int i = 0; i < 150; i++) {
		/* Overlapping registrations, released in another order. */
		REQUIRE(share(buf, 2 * kPage) == Path::shared);
		REQUIRE(share(buf + kPage, 3 * kPage) == Path::shared);
		unshare(buf, 2 * kPage);
		REQUIRE(page_is_shared(buf + 2 * kPage));
		unshare(buf + kPage, 3 * kPage);
	}
	stop = true;
	for (auto &t : threads)
		t.join();
	uint64_t total = 0;
	for (int t = 0; t < kThreads; t++) {
		CHECK(*reinterpret_cast<uint64_t *>(buf + t * kPage + 64 * t) == local[t]);
		CHECK(local[t] > 0);
		total += local[t];
	}
	CHECK(*shared_counter == total);
	CHECK_FALSE(page_is_shared(buf + kPage));
	munmap(buf, 4 * kPage);
}

TEST_CASE("fork: the child gets a private copy, the parent stays shared with its peers", "[memshare][fork]")
{
	char *buf = map_anon(2 * kPage);
	REQUIRE(buf);
	std::memset(buf, 'A', 2 * kPage);
	REQUIRE(share(buf, 2 * kPage) == Path::shared);
	auto va = reinterpret_cast<uint64_t>(buf);
	PeerWindow w; /* stands for a peer's window onto the parent */
	REQUIRE(map_peer(memory_file_fd(), va, 2 * kPage, w) == 0);
	int to_child[2], to_parent[2];
	REQUIRE(pipe(to_child) == 0);
	REQUIRE(pipe(to_parent) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		char c;
		int rc = 0;
		if (buf[0] != 'A' || buf[kPage] != 'A')
			rc |= 1;
		if (perms_at(buf) != "rw-p") /* private anonymous now */
			rc |= 2;
		buf[0] = 'C';
		if (write(to_parent[1], "x", 1) != 1 || read(to_child[0], &c, 1) != 1)
			rc |= 4;
		if (peek(buf + 100) != 'A' || peek(buf + 200) != 'A') /* parent's writes */
			rc |= 8;
		_exit(rc);
	}
	REQUIRE(pid > 0);
	char c;
	REQUIRE(read(to_parent[0], &c, 1) == 1);
	CHECK(peek(buf) == 'A'); /* the child's write stays in the child */
	poke(buf + 100, 'P');
	poke(w.at(va + 200), 'W'); /* a peer's store still reaches the parent */
	CHECK(peek(buf + 200) == 'W');
	CHECK(page_is_shared(buf));
	REQUIRE(write(to_child[1], "x", 1) == 1);
	CHECK(wait_child(pid) == 0);
	for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]})
		close(fd);
	w.reset();
	unshare(buf, 2 * kPage);
	munmap(buf, 2 * kPage);
}

TEST_CASE("fork while another thread writes registered pages loses no write", "[memshare][fork][threads]")
{
	char *buf = map_anon(kPage);
	REQUIRE(buf);
	REQUIRE(share(buf, kPage) == Path::shared);
	std::atomic<bool> stop{false};
	uint64_t local = 0;
	std::thread writer([&] {
		/* Load, add, store (not one atomic RMW), so a lost store
		 * shows; relaxed atomics because the main thread reads it. */
		auto *c = reinterpret_cast<uint64_t *>(buf + 8);
		while (!stop.load(std::memory_order_relaxed)) {
			__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
			local++;
		}
	});
	int bad = 0;
	for (int i = 0; i < 20; i++) {
		uint64_t seen_before =
			__atomic_load_n(reinterpret_cast<uint64_t *>(buf + 8), __ATOMIC_RELAXED);
		pid_t pid = fork();
		if (pid == 0) {
			/* The child's copy is the fork-time state: at least what
			 * the parent saw before, and it no longer moves. */
			auto *c = reinterpret_cast<volatile uint64_t *>(buf + 8);
			uint64_t v = *c;
			usleep(2000);
			_exit(v >= seen_before && *c == v ? 0 : 1);
		}
		bad += wait_child(pid) != 0;
	}
	stop = true;
	writer.join();
	CHECK(bad == 0);
	CHECK(*reinterpret_cast<uint64_t *>(buf + 8) == local);
	unshare(buf, kPage);
	munmap(buf, kPage);
}

TEST_CASE("fork: a child's writes before memshare's handler runs never reach the parent",
	  "[memshare][fork]")
{
	/* Registered pages on the heap hold other objects too. A child writes
	 * them before any handler of ours has run (glibc's arena headers,
	 * earlier handlers): the parent must not see it. */
	for (bool app_handler : {false, true}) {
		CAPTURE(app_handler);
		auto *obj = new EarlyObject{1};
		auto *neighbour = new std::vector<char>(3000, 'n');
		REQUIRE(share(obj, sizeof(*obj)) == Path::shared);
		/* The application set its own SIGSEGV action since our switch. */
		struct sigaction dfl = {}, saved = {};
		dfl.sa_handler = SIG_DFL;
		if (app_handler)
			REQUIRE(sigaction(SIGSEGV, &dfl, &saved) == 0);
		early_object = obj;
		int rc = run_child([&] {
			if (obj->value != 0xbad) /* the child sees its own write */
				return 1;
			return (*neighbour)[2999] == 'n' ? 0 : 2;
		});
		early_object = nullptr;
		if (app_handler)
			sigaction(SIGSEGV, &saved, nullptr);
		CHECK(rc == 0);
		CHECK(obj->value == 1);
		unshare(obj, sizeof(*obj));
		CHECK(obj->value == 1);
		delete neighbour;
		delete obj;
	}
}

TEST_CASE("heap pages switched while their allocating thread keeps using the heap",
	  "[memshare][threads][write-barrier]")
{
	/* Registered buffers on glibc's heap share their pages with whatever
	 * the allocator put beside them: chunk headers, free lists, other
	 * objects. The thread that allocated them keeps allocating, filling,
	 * checking and freeing in the same arena while another thread switches
	 * the pages in and out; none of its writes may be lost. */
	std::atomic<char *> handoff{nullptr};
	std::atomic<size_t> handoff_len{0};
	std::atomic<int> phase{0}; /* 0 idle, 1 buffer posted, 2 switched in and out */
	std::atomic<bool> stop{false};
	std::atomic<int> shared_count{0};
	std::thread switcher([&] {
		while (!stop.load()) {
			if (phase.load() != 1) {
				std::this_thread::yield();
				continue;
			}
			char *b = handoff.load();
			size_t n = handoff_len.load();
			if (share(b, n) == Path::shared) {
				shared_count++;
				unshare(b, n);
			}
			phase.store(2);
		}
	});
	std::vector<std::pair<unsigned char *, size_t>> live;
	unsigned seed = 1234u;
	uint64_t bad = 0, ops = 0;
	for (int i = 0; i < 1000; i++) {
		std::vector<char> v(4096 + (i % 7) * 100, 'r');
		handoff_len.store(v.size());
		handoff.store(v.data());
		phase.store(1);
		while (phase.load() != 2) {
			seed = seed * 1103515245u + 12345u;
			size_t n = 16 + (seed >> 8) % 3000;
			ops++;
			if (live.size() < 200 && (seed & 1)) {
				auto *p = static_cast<unsigned char *>(std::malloc(n));
				std::memset(p, static_cast<int>(n & 0xff), n);
				live.emplace_back(p, n);
			} else if (!live.empty()) {
				size_t k = (seed >> 4) % live.size();
				auto [p, len] = live[k];
				for (size_t j = 0; j < len; j++)
					if (p[j] != static_cast<unsigned char>(len & 0xff)) {
						bad++;
						break;
					}
				std::free(p);
				live[k] = live.back();
				live.pop_back();
			}
		}
		phase.store(0);
		REQUIRE(v[10] == 'r');
	}
	stop = true;
	switcher.join();
	for (auto [p, len] : live)
		std::free(p);
	CHECK(shared_count.load() == 1000);
	CHECK(ops > 1000);
	CHECK(bad == 0);
}
