/* SPDX-License-Identifier: MIT */
/* Memory regions and memory windows through the C ABI of the drop-in library. */
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Fixture : shmv_test::DeviceWithPd {
	std::vector<char> buf = std::vector<char>(1 << 16);
};

const long page = sysconf(_SC_PAGESIZE);

constexpr int LW = IBV_ACCESS_LOCAL_WRITE;
constexpr int RW = IBV_ACCESS_REMOTE_WRITE;
constexpr int RR = IBV_ACCESS_REMOTE_READ;
constexpr int RA = IBV_ACCESS_REMOTE_ATOMIC;
constexpr int MWB = IBV_ACCESS_MW_BIND;

/* The three exported registration verbs an application's call can reach. */
enum class Entry { RegMr, RegMrIova, RegMrIova2 };

struct ibv_mr *reg_via(Entry e, struct ibv_pd *pd, void *addr, size_t len, int access)
{
	switch (e) {
	case Entry::RegMr:
		return (ibv_reg_mr)(pd, addr, len, access);
	case Entry::RegMrIova:
		return (ibv_reg_mr_iova)(pd, addr, len, reinterpret_cast<uintptr_t>(addr), access);
	case Entry::RegMrIova2:
		return ibv_reg_mr_iova2(pd, addr, len, reinterpret_cast<uintptr_t>(addr),
					static_cast<unsigned>(access));
	}
	return nullptr;
}

/* Registers and expects `err` (0: success, then deregisters). */
void expect_reg(Entry e, struct ibv_pd *pd, void *addr, size_t len, int access, int err)
{
	errno = 0;
	struct ibv_mr *mr = reg_via(e, pd, addr, len, access);
	if (err == 0) {
		REQUIRE(mr != nullptr);
		CHECK(ibv_dereg_mr(mr) == 0);
	} else {
		CHECK(mr == nullptr);
		CHECK(errno == err);
		if (mr)
			ibv_dereg_mr(mr);
	}
}

} // namespace

TEST_CASE("reg_mr access flags: every combination of the bits that matter", "[mr]")
{
	Fixture f;
	auto entry = GENERATE(Entry::RegMr, Entry::RegMrIova, Entry::RegMrIova2);
	/* Remote write or remote atomic without local write is EINVAL; local
	 * write, remote read and MW bind are free to combine. */
	for (int bits = 0; bits < 32; bits++) {
		int access = (bits & 1 ? LW : 0) | (bits & 2 ? RW : 0) | (bits & 4 ? RR : 0) |
			     (bits & 8 ? RA : 0) | (bits & 16 ? MWB : 0);
		int expected = ((access & (RW | RA)) && !(access & LW)) ? EINVAL : 0;
		INFO("access 0x" << std::hex << access << " entry " << int(entry));
		expect_reg(entry, f.pd, f.buf.data(), f.buf.size(), access, expected);
	}
}

TEST_CASE("reg_mr access flags: other bits", "[mr]")
{
	Fixture f;
	struct Row {
		const char *what;
		int access;
		int err;
	};
	const Row rows[] = {
		{"zero based", LW | IBV_ACCESS_ZERO_BASED, 0},
		{"hugetlb hint", LW | IBV_ACCESS_HUGETLB, 0},
		{"relaxed ordering (optional)", LW | RW | IBV_ACCESS_RELAXED_ORDERING, 0},
		{"last optional bit", LW | (1 << 29), 0},
		{"whole optional range", int(IBV_ACCESS_OPTIONAL_RANGE), 0},
		{"unknown bit 8", LW | (1 << 8), EINVAL},
		{"unknown bit 19", (1 << 19), EINVAL},
		{"unknown bit 30", LW | (1 << 30), EINVAL},
		{"unknown bit 31", int(1u << 31), EINVAL},
		/* ODP itself: tests/unit/datapath/test_odp.cpp. */
		{"on-demand paging", LW | IBV_ACCESS_ON_DEMAND, 0},
		{"on-demand paging alone", IBV_ACCESS_ON_DEMAND, 0},
		{"remote write check comes first", RW | IBV_ACCESS_ON_DEMAND, EINVAL},
		{"unknown bit before ODP", (1 << 8) | IBV_ACCESS_ON_DEMAND, EINVAL},
	};
	auto entry = GENERATE(Entry::RegMr, Entry::RegMrIova, Entry::RegMrIova2);
	for (const Row &r : rows) {
		INFO(r.what << " entry " << int(entry));
		expect_reg(entry, f.pd, f.buf.data(), f.buf.size(), r.access, r.err);
	}
}

TEST_CASE("ibv_reg_mr macro reaches the same checks with constant and variable access", "[mr]")
{
	Fixture f;
	/* Constant access without optional bits: the exported ibv_reg_mr. */
	struct ibv_mr *mr = ibv_reg_mr(f.pd, f.buf.data(), f.buf.size(), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	CHECK(ibv_dereg_mr(mr) == 0);
	errno = 0;
	CHECK(ibv_reg_mr(f.pd, f.buf.data(), f.buf.size(), IBV_ACCESS_REMOTE_WRITE) == nullptr);
	CHECK(errno == EINVAL);
	/* Optional bits: ibv_reg_mr_iova2. */
	mr = ibv_reg_mr(f.pd, f.buf.data(), f.buf.size(),
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	REQUIRE(mr);
	CHECK(ibv_dereg_mr(mr) == 0);
	/* Variable access: ibv_reg_mr_iova2 as well. */
	volatile int access = IBV_ACCESS_REMOTE_ATOMIC;
	errno = 0;
	CHECK(ibv_reg_mr(f.pd, f.buf.data(), f.buf.size(), access) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("reg_mr argument checks", "[mr]")
{
	Fixture f;
	auto entry = GENERATE(Entry::RegMr, Entry::RegMrIova, Entry::RegMrIova2);
	INFO("entry " << int(entry));

	/* NULL PD: an error, not a crash. */
	expect_reg(entry, nullptr, f.buf.data(), f.buf.size(), LW, EINVAL);
	/* No pages. */
	expect_reg(entry, f.pd, f.buf.data(), 0, LW, EINVAL);
	/* The range wraps around the address space. */
	expect_reg(entry, f.pd, f.buf.data(), SIZE_MAX - 16, LW, EINVAL);
	/* Page 0 is not mapped: pinning fails. */
	expect_reg(entry, f.pd, nullptr, 4096, LW, EFAULT);

	/* Unmapped memory, wholly and partly. */
	char *map = static_cast<char *>(
		mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	REQUIRE(map != MAP_FAILED);
	expect_reg(entry, f.pd, map, 3 * page, LW, 0);
	REQUIRE(munmap(map + page, page) == 0);
	expect_reg(entry, f.pd, map, 3 * page, LW, EFAULT);
	expect_reg(entry, f.pd, map + page + 100, 10, LW, EFAULT);
	expect_reg(entry, f.pd, map + 2 * page, page, LW, 0);
	expect_reg(entry, f.pd, map + 10, page - 10, LW, 0);
	munmap(map, page);
	munmap(map + 2 * page, page);

	/* Pages the pinning refuses (EFAULT): read-only ones for a writable
	 * MR (ib_umem_get pins with FOLL_WRITE), PROT_NONE ones for any. */
	map = static_cast<char *>(
		mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	REQUIRE(map != MAP_FAILED);
	REQUIRE(mprotect(map + page, page, PROT_READ) == 0);
	expect_reg(entry, f.pd, map + page, page, 0, 0);
	expect_reg(entry, f.pd, map + page, page, IBV_ACCESS_REMOTE_READ, 0);
	expect_reg(entry, f.pd, map + page, page, LW, EFAULT);
	expect_reg(entry, f.pd, map + page, page, IBV_ACCESS_MW_BIND, EFAULT);
	expect_reg(entry, f.pd, map, 2 * page, LW, EFAULT); /* partly */
	expect_reg(entry, f.pd, map, page, LW, 0);
	REQUIRE(mprotect(map + page, page, PROT_NONE) == 0);
	expect_reg(entry, f.pd, map + page, page, 0, EFAULT);
	munmap(map, 2 * page);
}

TEST_CASE("on-demand paging over the whole address space", "[mr]")
{
	Fixture f;
	/* libibverbs refuses an implicit ODP MR that does not start at 0 ... */
	errno = 0;
	CHECK(ibv_reg_mr_iova2(f.pd, f.buf.data(), SIZE_MAX,
			       reinterpret_cast<uintptr_t>(f.buf.data()),
			       IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE) == nullptr);
	CHECK(errno == EINVAL);
	/* ... and the device takes one that does (implicit ODP). */
	struct ibv_mr *mr = ibv_reg_mr_iova2(f.pd, nullptr, SIZE_MAX, 0,
					     IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("reg_mr_iova: the iova keeps the address's offset in its page", "[mr]")
{
	Fixture f;
	char *addr = f.buf.data() + 1;
	errno = 0;
	CHECK((ibv_reg_mr_iova)(f.pd, addr, 100, 0x10000, LW) == nullptr);
	CHECK(errno == EINVAL);
	uint64_t iova = 0x7000'0000'0000ull + (reinterpret_cast<uintptr_t>(addr) & (page - 1));
	struct ibv_mr *mr = (ibv_reg_mr_iova)(f.pd, addr, 100, iova, LW | RR);
	REQUIRE(mr);
	CHECK(mr->addr == addr);
	CHECK(mr->length == 100);
	CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("a registered MR describes itself", "[mr]")
{
	Fixture f;
	struct ibv_mr *mr = ibv_reg_mr(f.pd, f.buf.data(), 1000, LW | RW | RR);
	REQUIRE(mr);
	CHECK(mr->context == f.ctx);
	CHECK(mr->pd == f.pd);
	CHECK(mr->addr == f.buf.data());
	CHECK(mr->length == 1000);
	CHECK(mr->lkey != 0);
	CHECK(mr->rkey == mr->lkey); /* one mkey on mlx5 */
	CHECK(mr->handle != 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dereg_mr(nullptr) == EINVAL);
}

TEST_CASE("lkeys and rkeys are unique on the device", "[mr]")
{
	Fixture f;
	struct ibv_pd *pd2 = ibv_alloc_pd(f.ctx);
	REQUIRE(pd2);
	std::set<uint32_t> keys;
	std::vector<struct ibv_mr *> mrs;
	for (int i = 0; i < 300; i++) {
		struct ibv_mr *mr = ibv_reg_mr(i % 2 ? f.pd : pd2, f.buf.data() + i, 64, LW);
		REQUIRE(mr);
		CHECK(keys.insert(mr->lkey).second);
		mrs.push_back(mr);
	}
	struct ibv_mr *null_mr = ibv_alloc_null_mr(f.pd);
	REQUIRE(null_mr);
	CHECK(keys.count(null_mr->lkey) == 0);
	/* libibverbs' ibv_rereg_mr takes only IBV_MR_TYPE_MR. */
	errno = 0;
	CHECK(ibv_rereg_mr(null_mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, LW) ==
	      IBV_REREG_MR_ERR_INPUT);
	CHECK(errno == EINVAL);

	/* Keys of a second context on the same device come from the same space. */
	struct ibv_context *ctx2 = ibv_open_device(f.ctx->device);
	REQUIRE(ctx2);
	struct ibv_pd *pd3 = ibv_alloc_pd(ctx2);
	REQUIRE(pd3);
	struct ibv_mr *other = ibv_reg_mr(pd3, f.buf.data(), 64, LW);
	REQUIRE(other);
	CHECK(keys.insert(other->lkey).second);

	/* Freed keys are not handed out again soon. */
	for (struct ibv_mr *mr : mrs)
		CHECK(ibv_dereg_mr(mr) == 0);
	for (int i = 0; i < 100; i++) {
		struct ibv_mr *mr = ibv_reg_mr(f.pd, f.buf.data(), 64, LW);
		REQUIRE(mr);
		CHECK(keys.insert(mr->lkey).second);
		CHECK(ibv_dereg_mr(mr) == 0);
	}
	CHECK(ibv_dereg_mr(null_mr) == 0);
	CHECK(ibv_dereg_mr(other) == 0);
	CHECK(ibv_dealloc_pd(pd3) == 0);
	CHECK(ibv_close_device(ctx2) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0);
}

TEST_CASE("rereg_mr lifecycle and keys", "[mr]")
{
	Fixture f;
	struct ibv_mr *mr = ibv_reg_mr(f.pd, f.buf.data(), 4096, LW);
	REQUIRE(mr);
	const uint32_t key0 = mr->lkey;

	SECTION("a new translation gives new keys")
	{
		char *addr = f.buf.data() + 8192;
		REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, addr, 2000, 0) == 0);
		CHECK(mr->addr == addr);
		CHECK(mr->length == 2000);
		CHECK(mr->lkey != key0);
		CHECK(mr->rkey == mr->lkey);
		CHECK(mr->pd == f.pd);
		/* Same slot, new variant byte, as mlx5's mkey. */
		CHECK((mr->lkey >> 8) == (key0 >> 8));
		const uint32_t key1 = mr->lkey;
		REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, f.buf.data(), 4096,
				     0) == 0);
		CHECK(mr->lkey != key1);
		CHECK(mr->lkey != key0);
	}
	SECTION("new access flags keep the keys")
	{
		REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
				     LW | RW | RR | RA) == 0);
		CHECK(mr->lkey == key0);
		CHECK(mr->rkey == key0);
		CHECK(mr->addr == f.buf.data());
		CHECK(mr->length == 4096);
	}
	SECTION("an access change mlx5 cannot make in place gives new keys")
	{
		/* MW_BIND or ON_DEMAND: mlx5_ib makes a new MR of the same pages
		 * (create_real_mr), whose key the old one no longer names. */
		const int access = GENERATE(LW | MWB, LW | IBV_ACCESS_ON_DEMAND);
		CAPTURE(access);
		REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, access) == 0);
		CHECK(mr->lkey != key0);
		CHECK(mr->rkey == mr->lkey);
		CHECK((mr->lkey >> 8) == (key0 >> 8));
		CHECK(mr->addr == f.buf.data());
	}
	SECTION("an ODP MR leaves ODP only with an address and length that can be pinned")
	{
		/* mlx5_ib makes the new MR from the call's address and length,
		 * which libibverbs passes without CHANGE_TRANSLATION too: none
		 * is EINVAL (ib_umem_get), a range with a hole EFAULT; the MR is
		 * left as it was. */
		struct ibv_mr *odp = ibv_reg_mr(f.pd, f.buf.data(), 4096, LW | IBV_ACCESS_ON_DEMAND);
		REQUIRE(odp);
		const uint32_t odp_key = odp->lkey;
		errno = 0;
		CHECK(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, LW) ==
		      IBV_REREG_MR_ERR_CMD);
		CHECK(errno == EINVAL);
		char *map = static_cast<char *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
						     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
		REQUIRE(map != MAP_FAILED);
		REQUIRE(munmap(map + page, page) == 0);
		errno = 0;
		CHECK(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, nullptr, map, 3 * page, LW) ==
		      IBV_REREG_MR_ERR_CMD);
		CHECK(errno == EFAULT);
		CHECK(odp->lkey == odp_key);
		/* A range that pins: the MR takes it, with new keys. */
		CHECK(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, nullptr, map, page, LW) == 0);
		CHECK(odp->lkey != odp_key);
		CHECK(ibv_dereg_mr(odp) == 0);
		munmap(map, page);
		munmap(map + 2 * page, page);
	}
	SECTION("a new PD moves the MR's use to it")
	{
		struct ibv_pd *pd2 = ibv_alloc_pd(f.ctx);
		REQUIRE(pd2);
		REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0) == 0);
		CHECK(mr->pd == pd2);
		CHECK(mr->lkey == key0);
		CHECK(ibv_dealloc_pd(pd2) == EBUSY);
		/* and back, with everything else changed too */
		REQUIRE(ibv_rereg_mr(mr,
				     IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS |
					     IBV_REREG_MR_CHANGE_TRANSLATION,
				     f.pd, f.buf.data() + 100, 300, LW | RR) == 0);
		CHECK(mr->pd == f.pd);
		CHECK(mr->addr == f.buf.data() + 100);
		CHECK(mr->length == 300);
		CHECK(mr->lkey != key0);
		CHECK(ibv_dealloc_pd(pd2) == 0);
	}
	SECTION("failures return IBV_REREG_MR_ERR_* and leave the MR usable")
	{
		struct Row {
			const char *what;
			int flags;
			bool with_pd;
			void *addr;
			size_t length;
			int access;
			int ret;
			int err;
		};
		void *unmapped = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		REQUIRE(unmapped != MAP_FAILED);
		munmap(unmapped, page);
		void *read_only = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		REQUIRE(read_only != MAP_FAILED);
		char *b = f.buf.data();
		const int T = IBV_REREG_MR_CHANGE_TRANSLATION, P = IBV_REREG_MR_CHANGE_PD,
			  A = IBV_REREG_MR_CHANGE_ACCESS;
		const Row rows[] = {
			{"unknown flag", 1 << 3, false, nullptr, 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL},
			{"translation without address", T, false, nullptr, 64, 0,
			 IBV_REREG_MR_ERR_INPUT, EINVAL},
			{"translation without length", T, false, b, 0, 0, IBV_REREG_MR_ERR_INPUT,
			 EINVAL},
			{"access without the access flag", P, true, nullptr, 0, LW,
			 IBV_REREG_MR_ERR_INPUT, EINVAL},
			{"no flags at all (uverbs refuses)", 0, false, nullptr, 0, 0,
			 IBV_REREG_MR_ERR_CMD, EINVAL},
			{"remote write without local write", A, false, nullptr, 0, RW,
			 IBV_REREG_MR_ERR_CMD, EINVAL},
			{"unknown access bit", A, false, nullptr, 0, LW | (1 << 8),
			 IBV_REREG_MR_ERR_CMD, EINVAL},
			{"on-demand paging, remote write without local write", A, false, nullptr,
			 0, RW | IBV_ACCESS_ON_DEMAND, IBV_REREG_MR_ERR_CMD, EINVAL},
			{"new PD NULL", P, false, nullptr, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL},
			{"unmapped new range", T, false, unmapped, 64, 0, IBV_REREG_MR_ERR_CMD, EFAULT},
			{"read-only new range, writable", T | A, false, read_only, 64, LW,
			 IBV_REREG_MR_ERR_CMD, EFAULT},
			{"wrapping new range", T, false, b, SIZE_MAX - 8, 0, IBV_REREG_MR_ERR_CMD,
			 EINVAL},
		};
		for (const Row &r : rows) {
			INFO(r.what);
			errno = 0;
			CHECK(ibv_rereg_mr(mr, r.flags, r.with_pd ? f.pd : nullptr, r.addr, r.length,
					   r.access) == r.ret);
			CHECK(errno == r.err);
			CHECK(mr->lkey == key0);
			CHECK(mr->addr == f.buf.data());
			CHECK(mr->length == 4096);
		}
		errno = 0;
		CHECK(ibv_rereg_mr(nullptr, A, nullptr, nullptr, 0, LW) == IBV_REREG_MR_ERR_INPUT);
		CHECK(errno == EINVAL);
		munmap(read_only, page);
	}
	SECTION("a read-only MR over read-only pages cannot become writable")
	{
		void *ro = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		REQUIRE(ro != MAP_FAILED);
		struct ibv_mr *rmr = ibv_reg_mr(f.pd, ro, page, IBV_ACCESS_REMOTE_READ);
		REQUIRE(rmr);
		errno = 0;
		CHECK(ibv_rereg_mr(rmr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, LW) ==
		      IBV_REREG_MR_ERR_CMD);
		CHECK(errno == EFAULT);
		CHECK(ibv_rereg_mr(rmr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0) == 0);
		CHECK(ibv_dereg_mr(rmr) == 0);
		munmap(ro, page);
	}
	CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("a PD cannot be freed while an MR uses it", "[mr][pd]")
{
	Fixture f;
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	SECTION("MR")
	{
		struct ibv_mr *mr = ibv_reg_mr(pd, f.buf.data(), 64, LW);
		REQUIRE(mr);
		CHECK(ibv_dealloc_pd(pd) == EBUSY);
		CHECK(ibv_dereg_mr(mr) == 0);
	}
	SECTION("not a null MR: libmlx5 makes no kernel object for it")
	{
		struct ibv_mr *mr = ibv_alloc_null_mr(pd);
		REQUIRE(mr);
		CHECK(ibv_dealloc_pd(pd) == 0);
		CHECK(ibv_dereg_mr(mr) == 0);
		return;
	}
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("null MR", "[mr]")
{
	Fixture f;
	struct ibv_mr *a = ibv_alloc_null_mr(f.pd);
	struct ibv_mr *b = ibv_alloc_null_mr(f.pd);
	REQUIRE(a);
	REQUIRE(b);
	CHECK(a->lkey == b->lkey); /* the device's one discard key */
	CHECK(a->lkey != 0);
	CHECK(a->addr == nullptr);
	CHECK(a->length == SIZE_MAX);
	CHECK(a->pd == f.pd);
	CHECK(a->context == f.ctx);
	errno = 0;
	CHECK(ibv_rereg_mr(a, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, LW) ==
	      IBV_REREG_MR_ERR_INPUT);
	CHECK(errno == EINVAL);
	CHECK(ibv_dereg_mr(a) == 0);
	CHECK(ibv_dereg_mr(b) == 0);
}

/* Memory windows (not offered: every entry point's errno) are tested in
 * tests/unit/datapath/test_mw.cpp, with a QP to post on. */

TEST_CASE("dma-buf registration is not offered; advise_mr takes only ODP MRs", "[mr]")
{
	Fixture f;
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(f.pd, 0, 4096, 0, 0, LW) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(nullptr, 0, 4096, 0, 0, LW) == nullptr);
	CHECK(errno == EINVAL);
	struct ibv_sge sge{reinterpret_cast<uintptr_t>(f.buf.data()), 64, 0};
	/* The rest of advise_mr: tests/unit/datapath/test_odp.cpp. */
	errno = 0;
	CHECK(ibv_advise_mr(f.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1) == ENOENT);
	CHECK(errno == ENOENT); /* execute_ioctl() sets it to what it returns */
}

TEST_CASE("concurrent reg/dereg on one PD", "[mr][threads]")
{
	Fixture f;
	constexpr int threads = 4, iterations = 400, held = 8;
	std::mutex lock;
	std::set<uint32_t> live;
	std::atomic<int> failures{0};
	std::atomic<int> duplicates{0};

	auto worker = [&](int id) {
		std::vector<char> mem(held * 256);
		std::vector<struct ibv_mr *> mine;
		for (int i = 0; i < iterations; i++) {
			if (mine.size() == held) {
				struct ibv_mr *mr = mine[i % held];
				mine.erase(mine.begin() + i % held);
				{
					std::lock_guard guard(lock);
					live.erase(mr->lkey);
				}
				if (ibv_dereg_mr(mr) != 0)
					failures++;
			}
			struct ibv_mr *mr =
				ibv_reg_mr(f.pd, mem.data() + (i % held) * 256, 256, LW | ((id + i) % 2 ? RR : 0));
			if (!mr) {
				failures++;
				continue;
			}
			{
				std::lock_guard guard(lock);
				if (!live.insert(mr->lkey).second)
					duplicates++;
			}
			mine.push_back(mr);
		}
		for (struct ibv_mr *mr : mine) {
			{
				std::lock_guard guard(lock);
				live.erase(mr->lkey);
			}
			if (ibv_dereg_mr(mr) != 0)
				failures++;
		}
	};
	std::vector<std::thread> pool;
	for (int t = 0; t < threads; t++)
		pool.emplace_back(worker, t);
	for (std::thread &t : pool)
		t.join();
	CHECK(failures == 0);
	CHECK(duplicates == 0);
	CHECK(live.empty());
	/* Every use was given back: the fixture's dealloc_pd succeeds. */
}

/* Windows are the mlx5 profile's only (lib/mw.h): under rxe the device
 * claims none and ibv_alloc_mw is EOPNOTSUPP, as libibverbs answers for a
 * provider without them. */
TEST_CASE("rxe: no memory windows", "[.][rxe]")
{
	shmv_test::DeviceWithPd d;
	struct ibv_device_attr attr{};
	REQUIRE(ibv_query_device(d.ctx, &attr) == 0);
	CHECK(attr.max_mw == 0);
	CHECK_FALSE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	for (enum ibv_mw_type type : {IBV_MW_TYPE_1, IBV_MW_TYPE_2}) {
		errno = 0;
		CHECK(ibv_alloc_mw(d.pd, type) == nullptr);
		CHECK(errno == EOPNOTSUPP);
	}
}
