/* SPDX-License-Identifier: MIT */
/*
 * lib/copy_helper.h: a large copy shared with the helper thread moves every
 * byte, whatever its length and alignment, with posters on several threads
 * at once; the helper takes part on a machine with a second CPU, and takes
 * none with SHMVERBS_COPY_HELPER=0.
 */
#include <catch2/catch.hpp>

#include "copy_helper.h"
#include "fork.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

using shmverbs::copy_split;
using shmverbs::copy_split_helper_chunks;
using shmverbs::copy_split_min;

namespace {

bool more_than_one_cpu()
{
	cpu_set_t set;
	return sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1;
}

std::vector<char> random_bytes(size_t n, unsigned seed)
{
	std::vector<char> v(n);
	std::mt19937 gen(seed);
	for (auto &c : v)
		c = char(gen());
	return v;
}

/* Copies for up to `bound`, until the helper has copied a chunk (whether
 * it runs at once depends on what else holds the other CPU): the chunks it
 * copied, or -1 when a copy came out wrong. */
long helper_chunks_within(std::chrono::milliseconds bound)
{
	const size_t n = 4 * copy_split_min;
	std::vector<char> from = random_bytes(n, 7), to(n);
	const uint64_t before = copy_split_helper_chunks();
	const auto give_up = std::chrono::steady_clock::now() + bound;
	while (copy_split_helper_chunks() == before && std::chrono::steady_clock::now() < give_up) {
		std::memset(to.data(), 0, n);
		copy_split(to.data(), from.data(), n);
		if (std::memcmp(to.data(), from.data(), n) != 0)
			return -1;
	}
	return long(copy_split_helper_chunks() - before);
}

} // namespace

TEST_CASE("copy_split: every byte, at lengths and offsets around the chunks", "[copy]")
{
	const size_t chunk = 64 * 1024;
	const size_t lengths[] = {copy_split_min,	  copy_split_min + 1, 1024 * 1024 - 3,
				  1024 * 1024 + chunk + 7, 4 * 1024 * 1024};
	for (size_t n : lengths)
		for (size_t offset : {0, 1, 13}) {
			CAPTURE(n, offset);
			const std::vector<char> from = random_bytes(n + offset, unsigned(n + offset));
			/* Guard bytes on both sides of the destination. */
			std::vector<char> to(n + 2 * 64, '\x5a');
			for (int round = 0; round < 20; round++)
				copy_split(to.data() + 64, from.data() + offset, n);
			CHECK(std::memcmp(to.data() + 64, from.data() + offset, n) == 0);
			CHECK(std::all_of(to.begin(), to.begin() + 64, [](char c) { return c == 0x5a; }));
			CHECK(std::all_of(to.end() - 64, to.end(), [](char c) { return c == 0x5a; }));
		}
}

TEST_CASE("copy_split: posters on several threads at once each get their own bytes", "[copy]")
{
	constexpr int threads = 3, rounds = 60;
	const size_t n = 1024 * 1024 + 5;
	std::vector<std::thread> ts;
	std::vector<int> wrong(threads, 0);
	for (int t = 0; t < threads; t++)
		ts.emplace_back([&, t] {
			std::vector<char> to(n);
			for (int i = 0; i < rounds; i++) {
				/* A new source each round: a chunk copied
				 * from an older one would show. */
				const std::vector<char> from = random_bytes(n, unsigned(t * 1000 + i));
				copy_split(to.data(), from.data(), n);
				wrong[t] += std::memcmp(to.data(), from.data(), n) != 0;
			}
		});
	for (auto &t : ts)
		t.join();
	for (int t = 0; t < threads; t++)
		CHECK(wrong[t] == 0);
}

TEST_CASE("copy_split: the helper thread copies part of a large copy", "[copy]")
{
	if (!more_than_one_cpu()) {
		WARN("skipped: this process may run on one CPU only, the helper never starts");
		return;
	}
	CHECK(helper_chunks_within(std::chrono::seconds(10)) > 0);
}

TEST_CASE("copy_split: SHMVERBS_COPY_HELPER=0 copies without the helper", "[copy]")
{
	/* A forked child starts its own helper on first use, reading the
	 * environment then. */
	shmverbs::install_fork_child_handler();
	setenv("SHMVERBS_COPY_HELPER", "0", 1);
	const pid_t pid = fork();
	if (pid == 0)
		_exit(helper_chunks_within(std::chrono::milliseconds(500)) == 0 ? 0 : 1);
	unsetenv("SHMVERBS_COPY_HELPER");
	REQUIRE(pid > 0);
	int status = 0;
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);
}
