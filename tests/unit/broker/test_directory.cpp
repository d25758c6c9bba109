/* SPDX-License-Identifier: MIT */
/* The broker's bookkeeping (daemon/directory.cpp), without sockets. */
#include "directory.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

using namespace shmverbs::broker;

namespace {

constexpr uint8_t qp = uint8_t(ObjectKind::Qp);
constexpr uint8_t srq = uint8_t(ObjectKind::Srq);

ObjectName name(uint32_t device, uint8_t kind, uint32_t id)
{
	ObjectName n{};
	n.device = device;
	n.kind = kind;
	n.id = id;
	return n;
}

UniqueFd segment_fd(size_t size = 4096)
{
	UniqueFd fd(memfd_create("dir-test", MFD_CLOEXEC));
	REQUIRE(fd);
	REQUIRE(ftruncate(fd.get(), off_t(size)) == 0);
	return fd;
}

/* Number of descriptors open in this process. */
int open_fds()
{
	int n = 0;
	for (int fd = 0; fd < 1024; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

} // namespace

TEST_CASE("numbers are never 0 or 1, unique, and not reused at once", "[directory]")
{
	Directory dir;
	dir.add_client(1, 100);
	std::set<uint32_t> seen;
	uint32_t first = 0;
	for (int i = 0; i < 100; i++) {
		uint32_t id;
		REQUIRE(dir.alloc_id(1, 0, qp, &id) == 0);
		CHECK(id >= 2);
		CHECK(id < (1u << 24));
		CHECK(seen.insert(id).second);
		if (!i)
			first = id;
	}
	REQUIRE(dir.free_id(1, name(0, qp, first)) == 0);
	uint32_t next;
	REQUIRE(dir.alloc_id(1, 0, qp, &next) == 0);
	CHECK(next != first);
	CHECK(dir.stats().ids_in_use == 100);
}

TEST_CASE("each device and kind has its own number space", "[directory]")
{
	Directory dir;
	dir.add_client(1, 100);
	uint32_t a, b, c;
	REQUIRE(dir.alloc_id(1, 0, qp, &a) == 0);
	REQUIRE(dir.alloc_id(1, 1, qp, &b) == 0);
	REQUIRE(dir.alloc_id(1, 0, srq, &c) == 0);
	CHECK(a == 2);
	CHECK(b == 2);
	CHECK(c == 2);
}

TEST_CASE("a small space wraps round and then runs out", "[directory]")
{
	Directory dir(6); /* numbers 2..5 */
	dir.add_client(1, 100);
	uint32_t ids[4];
	for (uint32_t &id : ids)
		REQUIRE(dir.alloc_id(1, 0, qp, &id) == 0);
	CHECK(ids[0] == 2);
	CHECK(ids[3] == 5);
	uint32_t more;
	CHECK(dir.alloc_id(1, 0, qp, &more) == ENOSPC);
	REQUIRE(dir.free_id(1, name(0, qp, 3)) == 0);
	REQUIRE(dir.alloc_id(1, 0, qp, &more) == 0);
	CHECK(more == 3);
}

TEST_CASE("requests are checked", "[directory]")
{
	Directory dir;
	dir.add_client(1, 100);
	dir.add_client(2, 200);
	uint32_t mine, theirs;
	REQUIRE(dir.alloc_id(1, 0, qp, &mine) == 0);
	REQUIRE(dir.alloc_id(2, 0, qp, &theirs) == 0);
	uint64_t seg, size, their_seg;
	REQUIRE(dir.register_segment(1, segment_fd(), &seg, &size) == 0);
	CHECK(size == 4096);
	REQUIRE(dir.register_segment(2, segment_fd(), &their_seg, &size) == 0);
	CHECK(seg != their_seg);
	Resolution res;
	uint32_t id;
	int fd;
	pid_t pid;
	int pipefd[2];
	REQUIRE(pipe(pipefd) == 0);
	close(pipefd[1]);

	struct Row {
		const char *what;
		int got;
		int expected;
	} rows[] = {
		{"device out of range", dir.alloc_id(1, max_devices, qp, &id), EINVAL},
		{"unknown kind", dir.alloc_id(1, 0, 7, &id), EINVAL},
		{"free QPN 1", dir.free_id(1, name(0, qp, 1)), EINVAL},
		{"free a number nobody has", dir.free_id(1, name(0, qp, 1000)), ENOENT},
		{"free another client's number", dir.free_id(1, name(0, qp, theirs)), EPERM},
		{"publish in another client's segment", dir.publish(1, name(0, qp, mine), their_seg, 0), EPERM},
		{"publish another client's number", dir.publish(1, name(0, qp, theirs), seg, 0), EPERM},
		{"publish in an unknown segment", dir.publish(1, name(0, qp, mine), 999, 0), ENOENT},
		{"publish past the segment's end", dir.publish(1, name(0, qp, mine), seg, 4096), EINVAL},
		{"resolve an unpublished number", dir.resolve(1, name(0, qp, theirs), &res), ENOENT},
		{"resolve a free number", dir.resolve(1, name(0, qp, 1000), &res), ENOENT},
		{"register a pipe", dir.register_segment(1, UniqueFd(pipefd[0]), &seg, &size), EINVAL},
		{"register no descriptor", dir.register_segment(1, UniqueFd(), &seg, &size), EBADF},
		{"drop another client's segment", dir.unregister_segment(1, their_seg), EPERM},
		{"drop an unknown segment", dir.unregister_segment(1, 999), ENOENT},
		{"attach to slot 4", dir.attach_fd(1, name(0, qp, mine), fd_slots, segment_fd()), EINVAL},
		{"attach to another client's number", dir.attach_fd(1, name(0, qp, theirs), 0, segment_fd()), EPERM},
		{"fetch an empty slot", dir.fetch_fd(1, name(0, qp, mine), 0, &fd, &pid), ENODATA},
		{"fetch from a free number", dir.fetch_fd(1, name(0, qp, 1000), 0, &fd, &pid), ENOENT},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		CHECK(r.got == r.expected);
	}
}

TEST_CASE("a segment holding a published object cannot be dropped", "[directory]")
{
	Directory dir;
	dir.add_client(1, 100);
	uint32_t id;
	uint64_t seg, size;
	REQUIRE(dir.alloc_id(1, 0, qp, &id) == 0);
	REQUIRE(dir.register_segment(1, segment_fd(), &seg, &size) == 0);
	REQUIRE(dir.publish(1, name(0, qp, id), seg, 64) == 0);
	CHECK(dir.unregister_segment(1, seg) == EBUSY);
	REQUIRE(dir.free_id(1, name(0, qp, id)) == 0);
	CHECK(dir.unregister_segment(1, seg) == 0);
	CHECK(dir.stats().segments == 0);
	CHECK(dir.stats().published == 0);
}

TEST_CASE("resolve and fetch name the owner and watch it", "[directory]")
{
	Directory dir;
	dir.add_client(1, 100); /* owner */
	dir.add_client(2, 200); /* resolves */
	dir.add_client(3, 300); /* fetches */
	dir.add_client(4, 400); /* does neither */
	uint32_t id;
	uint64_t seg, size;
	REQUIRE(dir.alloc_id(1, 0, qp, &id) == 0);
	REQUIRE(dir.register_segment(1, segment_fd(8192), &seg, &size) == 0);
	REQUIRE(dir.publish(1, name(0, qp, id), seg, 4096) == 0);
	REQUIRE(dir.attach_fd(1, name(0, qp, id), 2, segment_fd()) == 0);

	Resolution res;
	REQUIRE(dir.resolve(2, name(0, qp, id), &res) == 0);
	CHECK(res.owner_pid == 100);
	CHECK(res.segment == seg);
	CHECK(res.offset == 4096);
	CHECK(res.size == 8192);
	CHECK(res.fd >= 0);
	int fd;
	pid_t pid;
	REQUIRE(dir.fetch_fd(3, name(0, qp, id), 2, &fd, &pid) == 0);
	CHECK(pid == 100);
	/* The owner looking at its own object watches nobody. */
	REQUIRE(dir.resolve(1, name(0, qp, id), &res) == 0);

	std::vector<ClientId> notify = dir.remove_client(1);
	std::sort(notify.begin(), notify.end());
	CHECK(notify == std::vector<ClientId>{2, 3});
	CHECK(dir.resolve(2, name(0, qp, id), &res) == ENOENT);
}

TEST_CASE("removing a client frees its numbers, segments and descriptors", "[directory]")
{
	int before = open_fds();
	{
		Directory dir;
		dir.add_client(1, 100);
		dir.add_client(2, 200);
		uint64_t seg, size;
		REQUIRE(dir.register_segment(1, segment_fd(), &seg, &size) == 0);
		for (int i = 0; i < 10; i++) {
			uint32_t id;
			REQUIRE(dir.alloc_id(1, 0, i % 2 ? qp : srq, &id) == 0);
			REQUIRE(dir.publish(1, name(0, i % 2 ? qp : srq, id), seg, 0) == 0);
			REQUIRE(dir.attach_fd(1, name(0, i % 2 ? qp : srq, id), 0, segment_fd()) == 0);
		}
		CHECK(open_fds() == before + 11);
		/* A client that dies before it is told about another. */
		Resolution res;
		REQUIRE(dir.resolve(2, name(0, qp, 2), &res) == 0);
		CHECK(dir.remove_client(2).empty());

		CHECK(dir.remove_client(1).empty());
		DirectoryStats s = dir.stats();
		CHECK(s.clients == 0);
		CHECK(s.ids_in_use == 0);
		CHECK(s.segments == 0);
		CHECK(s.published == 0);
		CHECK(s.ids_handed_out == 10);
		CHECK(open_fds() == before);
	}
}

/* A process attaches its memory file to every object it publishes and a CQ
 * channel to each QP of that CQ: thousands of QPs must not cost the broker
 * a descriptor each. */
TEST_CASE("a file attached to many objects is held once", "[directory]")
{
	UniqueFd memory = segment_fd();
	UniqueFd channel_a(eventfd(0, EFD_CLOEXEC)), channel_b(eventfd(0, EFD_CLOEXEC));
	REQUIRE((channel_a && channel_b));
	pid_t self = getpid();
	bool kcmp_works = syscall(SYS_kcmp, self, self, KCMP_FILE, channel_a.get(),
				  channel_a.get()) == 0;
	int before = open_fds();
	{
		Directory dir;
		dir.add_client(1, 100);
		dir.add_client(2, 200);
		constexpr int objects = 300;
		std::vector<uint32_t> ids;
		for (int i = 0; i < objects; i++) {
			uint32_t id;
			REQUIRE(dir.alloc_id(1, 0, qp, &id) == 0);
			ids.push_back(id);
			const UniqueFd &ch = i % 2 ? channel_a : channel_b;
			REQUIRE(dir.attach_fd(1, name(0, qp, id), 1, UniqueFd(dup(memory.get()))) == 0);
			REQUIRE(dir.attach_fd(1, name(0, qp, id), 0, UniqueFd(dup(ch.get()))) == 0);
		}
		/* One memory file; the two channels are told apart (they share
		 * an anonymous inode), each held once where kcmp(2) works. */
		CHECK(open_fds() == before + (kcmp_works ? 3 : 1 + objects));
		for (int i : {0, 1, objects - 1}) {
			int fd;
			pid_t pid;
			REQUIRE(dir.fetch_fd(2, name(0, qp, ids[size_t(i)]), 0, &fd, &pid) == 0);
			/* A token through the fetched descriptor reaches its channel. */
			uint64_t one = 1, got = 0;
			REQUIRE(write(fd, &one, sizeof(one)) == sizeof(one));
			const UniqueFd &ch = i % 2 ? channel_a : channel_b;
			REQUIRE(read(ch.get(), &got, sizeof(got)) == sizeof(got));
			CHECK(got == 1);
			REQUIRE(dir.fetch_fd(2, name(0, qp, ids[size_t(i)]), 1, &fd, &pid) == 0);
			struct stat a, b;
			REQUIRE((fstat(fd, &a) == 0 && fstat(memory.get(), &b) == 0));
			CHECK(a.st_ino == b.st_ino);
		}
		/* Shared descriptors live as long as one object holds them. */
		for (int i = 0; i < objects - 1; i++)
			REQUIRE(dir.free_id(1, name(0, qp, ids[size_t(i)])) == 0);
		CHECK(open_fds() == before + 2);
		CHECK(dir.remove_client(1).size() == 1);
		CHECK(open_fds() == before);
	}
}

TEST_CASE("a directory that replaces a dead one hands out none of its numbers again",
	  "[directory]")
{
	/* The first saves its marks before it hands a number out beyond
	 * those it saved; the second starts from them. */
	constexpr uint32_t limit = 3 * Directory::mark_step;
	IdMarks saved;
	unsigned saves = 0;
	std::set<uint32_t> first_ids;
	{
		Directory first(limit, {}, [&](const IdMarks &m) {
			saved = m;
			saves++;
		});
		first.add_client(1, 100);
		for (uint32_t i = 0; i < Directory::mark_step + 10; i++) {
			uint32_t id;
			REQUIRE(first.alloc_id(1, 0, qp, &id) == 0);
			first_ids.insert(id);
		}
		uint32_t other;
		REQUIRE(first.alloc_id(1, 1, srq, &other) == 0); /* a space of its own */
	}
	CHECK(saves == 3); /* QPs at the first and the mark_step-th number, the SRQ */
	REQUIRE(saved.size() == 2);
	Directory second(limit, saved);
	second.add_client(2, 200);
	for (uint32_t i = 0; i < 100; i++) {
		uint32_t id;
		REQUIRE(second.alloc_id(2, 0, qp, &id) == 0);
		CHECK(first_ids.count(id) == 0);
	}
	uint32_t srq_id;
	REQUIRE(second.alloc_id(2, 1, srq, &srq_id) == 0);
	CHECK(srq_id != first_object_id);
	/* A mark out of the space counts for nothing. */
	Directory third(limit, {{saved.begin()->first, limit + 5}});
	third.add_client(1, 100);
	uint32_t id;
	REQUIRE(third.alloc_id(1, 0, qp, &id) == 0);
	CHECK(id == first_object_id);
}

TEST_CASE("a client republishing a number the broker never handed out takes it", "[directory]")
{
	/* After its broker died: the new one learns the number from the
	 * publish, and resolves it for others. */
	Directory dir;
	dir.add_client(1, 100);
	dir.add_client(2, 200);
	uint64_t seg, size;
	REQUIRE(dir.register_segment(1, segment_fd(), &seg, &size) == 0);
	CHECK(dir.publish(1, name(0, qp, 4242), 999, 0) == ENOENT); /* nothing taken */
	CHECK(dir.stats().ids_in_use == 0);
	REQUIRE(dir.publish(1, name(0, qp, 4242), seg, 64) == 0);
	CHECK(dir.stats().ids_in_use == 1);
	Resolution res;
	REQUIRE(dir.resolve(2, name(0, qp, 4242), &res) == 0);
	CHECK(res.owner_pid == 100);
	CHECK(res.offset == 64);
	uint64_t their_seg;
	REQUIRE(dir.register_segment(2, segment_fd(), &their_seg, &size) == 0);
	CHECK(dir.publish(2, name(0, qp, 4242), their_seg, 0) == EPERM); /* held now */
	REQUIRE(dir.free_id(1, name(0, qp, 4242)) == 0);
	CHECK(dir.stats().ids_in_use == 0);
}

