/* SPDX-License-Identifier: MIT */
/* ForkRanges: the per-page registration counts behind ibv_dontfork_range(),
 * with a recording madvise so that every advice can be checked. */
#include "fork.h"

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cerrno>
#include <tuple>
#include <vector>

using shmverbs::ForkRanges;

namespace {

constexpr uintptr_t P = 4096;

struct Call {
	uintptr_t addr;
	size_t len;
	int advice;
	bool operator==(const Call &o) const
	{
		return std::tie(addr, len, advice) == std::tie(o.addr, o.len, o.advice);
	}
};

std::vector<Call> calls;
uintptr_t fail_at = 0; /* advising a range containing this address fails */

int recording_advise(void *addr, size_t len, int advice)
{
	auto a = reinterpret_cast<uintptr_t>(addr);
	calls.push_back({a, len, advice});
	if (fail_at && a <= fail_at && fail_at < a + len) {
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

size_t page_4k(const void *) { return P; }

void *at(uintptr_t a) { return reinterpret_cast<void *>(a); }

/* An initialised instance; the probe calls of init() are dropped. */
struct Initialised : ForkRanges {
	Initialised() : ForkRanges(recording_advise, page_4k)
	{
		calls.clear();
		fail_at = 0;
		REQUIRE(init(false) == 0);
		calls.clear();
	}
};

} // namespace

TEST_CASE("fork ranges: init probes the kernel once; too late after a range", "[fork]")
{
	calls.clear();
	fail_at = 0;
	ForkRanges r(recording_advise, page_4k);
	CHECK_FALSE(r.initialized());
	CHECK(r.dontfork(at(0x10000), 10) == 0); /* before init: only remembered */
	CHECK(calls.empty());
	CHECK(r.init(false) == EINVAL);
	CHECK_FALSE(r.initialized());

	ForkRanges fresh(recording_advise, page_4k);
	calls.clear();
	CHECK(fresh.init(false) == 0);
	REQUIRE(calls.size() == 2);
	CHECK(calls[0].advice == MADV_DONTFORK);
	CHECK(calls[1].advice == MADV_DOFORK);
	CHECK(fresh.init(false) == 0); /* idempotent, no second probe */
	CHECK(calls.size() == 2);
}

TEST_CASE("fork ranges: a kernel without MADV_DONTFORK gives ENOSYS", "[fork]")
{
	calls.clear();
	ForkRanges r(
		[](void *, size_t, int) {
			errno = EINVAL;
			return -1;
		},
		page_4k);
	CHECK(r.init(false) == ENOSYS);
	CHECK_FALSE(r.initialized());
}

TEST_CASE("fork ranges: pages are advised on first and last use only", "[fork]")
{
	Initialised r;
	/* A sub-page range covers whole pages. */
	REQUIRE(r.dontfork(at(0x10000 + 100), 2 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x10000, 3 * P, MADV_DONTFORK}});
	CHECK(r.count_at(0x10000) == 1);
	CHECK(r.count_at(0x10000 + 3 * P) == 0);

	/* Overlap: only the uncovered tail is advised. */
	calls.clear();
	REQUIRE(r.dontfork(at(0x10000 + P), 4 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x10000 + 3 * P, 2 * P, MADV_DONTFORK}});
	CHECK(r.count_at(0x10000) == 1);
	CHECK(r.count_at(0x10000 + P) == 2);
	CHECK(r.count_at(0x10000 + 2 * P) == 2);
	CHECK(r.count_at(0x10000 + 4 * P) == 1);
	CHECK(r.segments() == 3);

	/* Releasing the first range: only its unshared page gets DOFORK. */
	calls.clear();
	REQUIRE(r.dofork(at(0x10000 + 100), 2 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x10000, P, MADV_DOFORK}});
	CHECK(r.count_at(0x10000) == 0);
	CHECK(r.count_at(0x10000 + P) == 1);
	CHECK(r.segments() == 1); /* equal neighbours merged */

	calls.clear();
	REQUIRE(r.dofork(at(0x10000 + P), 4 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x10000 + P, 4 * P, MADV_DOFORK}});
	CHECK(r.segments() == 0);

	/* Releasing what was never registered does nothing. */
	calls.clear();
	REQUIRE(r.dofork(at(0x40000), P) == 0);
	CHECK(calls.empty());
	CHECK(r.count_at(0x40000) == 0);
}

TEST_CASE("fork ranges: holes between registrations are advised separately", "[fork]")
{
	Initialised r;
	REQUIRE(r.dontfork(at(0x20000), P) == 0);
	REQUIRE(r.dontfork(at(0x20000 + 2 * P), P) == 0);
	calls.clear();
	REQUIRE(r.dontfork(at(0x20000 - P), 5 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x20000 - P, P, MADV_DONTFORK},
					 {0x20000 + P, P, MADV_DONTFORK},
					 {0x20000 + 3 * P, P, MADV_DONTFORK}});
	CHECK(r.count_at(0x20000) == 2);
	CHECK(r.count_at(0x20000 + P) == 1);
	CHECK(r.count_at(0x20000 + 2 * P) == 2);
}

TEST_CASE("fork ranges: a failed advice is undone and counts nothing", "[fork]")
{
	Initialised r;
	REQUIRE(r.dontfork(at(0x30000 + P), P) == 0);
	calls.clear();
	fail_at = 0x30000 + 3 * P; /* the second hole */
	errno = 0;
	CHECK(r.dontfork(at(0x30000), 4 * P) == -1);
	CHECK(errno == ENOMEM);
	CHECK(calls == std::vector<Call>{{0x30000, P, MADV_DONTFORK},
					 {0x30000 + 2 * P, 2 * P, MADV_DONTFORK},
					 {0x30000, P, MADV_DOFORK},
					 {0x30000 + 2 * P, 2 * P, MADV_DOFORK}});
	CHECK(r.count_at(0x30000) == 0);
	CHECK(r.count_at(0x30000 + P) == 1);
	CHECK(r.count_at(0x30000 + 2 * P) == 0);

	/* A failed DOFORK is retried page by page and not reported. */
	fail_at = 0;
	REQUIRE(r.dontfork(at(0x50000), 2 * P) == 0);
	calls.clear();
	fail_at = 0x50000;
	CHECK(r.dofork(at(0x50000), 2 * P) == 0);
	CHECK(calls == std::vector<Call>{{0x50000, 2 * P, MADV_DOFORK},
					 {0x50000, P, MADV_DOFORK},
					 {0x50000 + P, P, MADV_DOFORK}});
	CHECK(r.count_at(0x50000) == 0);
}

TEST_CASE("fork ranges: NULL and empty ranges are no-ops", "[fork]")
{
	Initialised r;
	CHECK(r.dontfork(nullptr, P) == 0);
	CHECK(r.dontfork(at(0x60000), 0) == 0);
	CHECK(r.dofork(nullptr, P) == 0);
	CHECK(calls.empty());
	CHECK(r.segments() == 0);
}
