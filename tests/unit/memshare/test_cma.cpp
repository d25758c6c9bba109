/* SPDX-License-Identifier: MIT */
/* CMA: the probe, copies to another process, and a process where a seccomp
 * filter really blocks process_vm_readv/writev. Path policy entries. */
#include <catch2/catch.hpp>

#include "bounce.h"
#include "cma.h"
#include "helpers.h"
#include "memshare.h"

#include "../common/seccomp.h"

#include <cstdlib>
#include <memory>
#include <thread>

using namespace shmverbs::memshare;
using namespace memshare_test;
using shmv_test::block_cma_with_seccomp;

/* Run in a fresh process (re-executed test binary) under the filter: the
 * probe must see CMA blocked, non-shareable memory must go to bounce, and
 * bounce must work across processes there. Exit code: bit per failure. */
int seccomp_inner_main()
{
	int rc = 0;
	if (cma_available())
		rc |= 1;
	uint64_t x = 1, y = 0;
	if (cma_read(getpid(), &y, reinterpret_cast<uint64_t>(&x), 8) != EPERM)
		rc |= 2;
	/* Not shareable (read-only): auto picks bounce, since CMA is blocked. */
	char *ro = map_anon(kPage, PROT_READ);
	if (!ro || share(ro, kPage) != Path::bounce)
		rc |= 4;
	/* Shareable memory still takes the fast path. */
	char *rw = map_anon(kPage);
	if (!rw || share(rw, kPage) != Path::shared)
		rc |= 8;
	else
		unshare(rw, kPage);
	/* The bounce path works between two processes under the filter. */
	std::unique_ptr<BounceServer> srv(BounceServer::create(4, 4096).get());
	if (!srv)
		return rc | 16;
	int fd = srv->fd();
	auto target = reinterpret_cast<uint64_t>(rw);
	int child = run_child([&]() -> int {
		std::unique_ptr<BounceClient> c(BounceClient::attach(fd).get());
		return c && bounce_write(*c, target, "bounced", 8) == 0 ? 0 : 1;
	});
	/* Read after joining the helper: the order of its copy before the
	 * child's exit goes through another process, out of TSan's sight. */
	srv.reset();
	if (child != 0 || std::strcmp(rw, "bounced") != 0)
		rc |= 32;
	return rc;
}

TEST_CASE("the CMA probe sees CMA working here, and copies reach another process", "[cma]")
{
	if (!cma_probe())
		{ WARN("CMA is blocked in this environment"); return; }
	CHECK(cma_available());
	char *buf = map_anon(kPage);
	REQUIRE(buf);
	int p2c[2], c2p[2];
	REQUIRE(pipe(p2c) == 0);
	REQUIRE(pipe(c2p) == 0);
	pid_t pid;
	std::strcpy(buf, "original");
	int sync = 0;
	std::thread t([&] {
		sync = run_child(
			[&]() -> int {
				char c;
				pid_t self = getpid();
				if (write(c2p[1], &self, sizeof(self)) != sizeof(self) ||
				    read(p2c[0], &c, 1) != 1)
					return 2;
				return std::strcmp(buf, "written by CMA") == 0 ? 0 : 1;
			},
			10);
	});
	/* The child says who it is (the thread's copy of the pid may lag). */
	REQUIRE(read(c2p[0], &pid, sizeof(pid)) == sizeof(pid));
	auto va = reinterpret_cast<uint64_t>(buf);
	char got[16] = {};
	CHECK(cma_read(pid, got, va, 9) == 0);
	CHECK(std::strcmp(got, "original") == 0);
	CHECK(cma_write(pid, va, "written by CMA", 15) == 0);
	CHECK(cma_write(pid, 8, "x", 1) == EFAULT);
	REQUIRE(write(p2c[1], "g", 1) == 1);
	t.join();
	CHECK(sync == 0);
	CHECK(cma_write(pid, va, "x", 1) == ESRCH); /* reaped */
	for (int fd : {p2c[0], p2c[1], c2p[0], c2p[1]})
		close(fd);
	munmap(buf, kPage);
}

TEST_CASE("a seccomp filter that blocks CMA: probe says no, auto uses bounce", "[cma][seccomp]")
{
	int rc = run_child([]() -> int {
		if (int err = block_cma_with_seccomp())
			return 100 + (err & 63);
		char *argv[] = {const_cast<char *>("/proc/self/exe"),
				const_cast<char *>("--seccomp-inner"), nullptr};
		unsetenv("SHMVERBS_MEMORY_PATH");
		execv("/proc/self/exe", argv);
		return 99;
	}, 30);
	if (rc >= 100 && rc < 164)
		{ WARN("cannot install a seccomp filter here"); return; }
	CHECK(rc == 0);
}

/* Policies: each runs as its own test() entry with SHMVERBS_MEMORY_PATH set. */
TEST_CASE("SHMVERBS_MEMORY_PATH=cma never shares", "[.][policy-cma]")
{
	REQUIRE(policy() == Policy::cma);
	char *buf = map_anon(kPage);
	Path want = cma_available() ? Path::cma : Path::bounce;
	CHECK(share(buf, kPage) == want);
	CHECK_FALSE(page_is_shared(buf));
	munmap(buf, kPage);
}

TEST_CASE("SHMVERBS_MEMORY_PATH=bounce always bounces", "[.][policy-bounce]")
{
	REQUIRE(policy() == Policy::bounce);
	char *buf = map_anon(kPage);
	CHECK(share(buf, kPage) == Path::bounce);
	CHECK_FALSE(page_is_shared(buf));
	munmap(buf, kPage);
}

TEST_CASE("SHMVERBS_MEMORY_PATH=shared shares, else bounces (never CMA)", "[.][policy-shared]")
{
	REQUIRE(policy() == Policy::shared);
	char *buf = map_anon(kPage);
	CHECK(share(buf, kPage) == Path::shared);
	unshare(buf, kPage);
	char *ro = map_anon(kPage, PROT_READ);
	CHECK(share(ro, kPage) == Path::bounce);
	munmap(buf, kPage);
	munmap(ro, kPage);
}

TEST_CASE("an unknown SHMVERBS_MEMORY_PATH means auto", "[.][policy-bad]")
{
	CHECK(policy() == Policy::automatic);
}
