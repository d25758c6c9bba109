/* SPDX-License-Identifier: MIT */
/*
 * Device memory (lib/dm.h): ibv_alloc_dm, ibv_memcpy_to/from_dm,
 * ibv_reg_dm_mr and traffic through DM MRs, with libmlx5's and mlx5_ib's
 * errnos. Across processes: ibv_rc_pingpong -j in the pair tests.
 */
#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include "../common/fixtures.h"
#include "../datapath/loopback.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr uint64_t max_dm = 128 * 1024; /* a ConnectX-5's MEMIC */
constexpr unsigned lw = IBV_ACCESS_LOCAL_WRITE;
constexpr unsigned zb = IBV_ACCESS_ZERO_BASED;

struct ibv_dm *alloc(struct ibv_context *ctx, uint64_t length, uint32_t log_align = 0,
		     uint32_t comp_mask = 0)
{
	struct ibv_alloc_dm_attr attr{};
	attr.length = size_t(length);
	attr.log_align_req = log_align;
	attr.comp_mask = comp_mask;
	errno = 0;
	return ibv_alloc_dm(ctx, &attr);
}

/* The errno of a failed ibv_alloc_dm(), 0 if it succeeded (and freed). */
int alloc_errno(struct ibv_context *ctx, uint64_t length, uint32_t log_align = 0,
		uint32_t comp_mask = 0)
{
	struct ibv_dm *dm = alloc(ctx, length, log_align, comp_mask);
	if (!dm)
		return errno;
	REQUIRE(ibv_free_dm(dm) == 0);
	return 0;
}

} // namespace

TEST_CASE("device memory: a ConnectX-5's pool, libmlx5's and mlx5_ib's refusals", "[dm]")
{
	shmv_test::DeviceWithPd d;
	struct ibv_device_attr_ex attr{};
	REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &attr) == 0);
	CHECK(attr.max_dm_size == max_dm);

	CHECK(alloc_errno(d.ctx, 100) == 0);
	CHECK(alloc_errno(d.ctx, max_dm) == 0);
	CHECK(alloc_errno(d.ctx, max_dm + 1) == EINVAL);
	CHECK(alloc_errno(d.ctx, 0) == EINVAL);
	CHECK(alloc_errno(d.ctx, 64, 0, 1) == EINVAL);
	CHECK(alloc_errno(d.ctx, 64, 12) == 0);
	CHECK(alloc_errno(d.ctx, 64, 13) == EINVAL);

	SECTION("the pool is counted in pages, an exhausted one is ENOMEM") {
		std::vector<struct ibv_dm *> held;
		for (uint64_t i = 0; i < max_dm / 4096; i++) {
			held.push_back(alloc(d.ctx, 100)); /* a page each */
			REQUIRE(held.back());
		}
		CHECK(alloc_errno(d.ctx, 4) == ENOMEM);
		REQUIRE(ibv_free_dm(held.back()) == 0);
		held.pop_back();
		CHECK(alloc_errno(d.ctx, 4096) == 0);
		CHECK(alloc_errno(d.ctx, 4097) == ENOMEM);
		for (struct ibv_dm *dm : held)
			CHECK(ibv_free_dm(dm) == 0);
	}
	SECTION("the handle and the copy operations") {
		struct ibv_dm *dm = alloc(d.ctx, 100);
		REQUIRE(dm);
		CHECK(dm->context == d.ctx);
		CHECK(dm->comp_mask == IBV_DM_MASK_HANDLE);
		const char data[100] = "device-memory!!";
		char back[100] = {};
		CHECK(ibv_memcpy_to_dm(dm, 0, data, 100) == 0);
		CHECK(ibv_memcpy_from_dm(back, dm, 0, 100) == 0);
		CHECK(std::memcmp(back, data, 100) == 0);
		CHECK(ibv_memcpy_to_dm(dm, 96, data, 4) == 0);
		CHECK(ibv_memcpy_to_dm(dm, 0, data, 0) == 0);
		/* pyverbs' test_dm_bad_access: bounds first, by the asked
		 * length, then 4-byte alignment. */
		CHECK(ibv_memcpy_to_dm(dm, 3, data, 4) == EINVAL);
		CHECK(ibv_memcpy_to_dm(dm, 4, data, 3) == EINVAL);
		CHECK(ibv_memcpy_to_dm(dm, 104, data, 4) == EFAULT);
		CHECK(ibv_memcpy_to_dm(dm, 0, data, 104) == EFAULT);
		CHECK(ibv_memcpy_to_dm(dm, 99, data, 2) == EFAULT);
		CHECK(ibv_memcpy_from_dm(back, dm, 3, 4) == EINVAL);
		CHECK(ibv_memcpy_from_dm(back, dm, 0, 104) == EFAULT);
		CHECK(ibv_free_dm(dm) == 0);
	}
}

TEST_CASE("ibv_reg_dm_mr: zero-based MRs over a DM, which cannot go while they exist", "[dm]")
{
	shmv_test::DeviceWithPd d;
	struct ibv_dm *dm = alloc(d.ctx, 100);
	REQUIRE(dm);
	auto reg_errno = [&](uint64_t off, size_t len, unsigned access) {
		errno = 0;
		struct ibv_mr *mr = ibv_reg_dm_mr(d.pd, dm, off, len, access);
		if (!mr)
			return errno;
		REQUIRE(ibv_dereg_mr(mr) == 0);
		return 0;
	};
	CHECK(reg_errno(0, 100, lw) == EINVAL); /* ZERO_BASED is required */
	CHECK(reg_errno(0, 100, lw | zb | IBV_ACCESS_ON_DEMAND) == EINVAL);
	CHECK(reg_errno(0, 100, lw | zb | IBV_ACCESS_MW_BIND) == EINVAL);
	/* libmlx5 lets the optional bits through; mlx5_ib's MEMIC mask not. */
	CHECK(reg_errno(0, 100, lw | zb | IBV_ACCESS_RELAXED_ORDERING) == EINVAL);
	CHECK(reg_errno(0, 100, zb | IBV_ACCESS_REMOTE_WRITE) == EINVAL);
	CHECK(reg_errno(0, 104, lw | zb) == EINVAL);
	CHECK(reg_errno(8, 96, lw | zb) == EINVAL);
	CHECK(reg_errno(101, 0, lw | zb) == EINVAL);
	CHECK(reg_errno(8, 92, lw | zb | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_REMOTE_ATOMIC) == 0);
	CHECK(reg_errno(0, 0, lw | zb) == 0);

	struct ibv_mr *mr = ibv_reg_dm_mr(d.pd, dm, 4, 96, lw | zb);
	REQUIRE(mr);
	CHECK(mr->addr == nullptr);
	CHECK(mr->length == 96);
	CHECK(mr->lkey == mr->rkey);
	CHECK(mr->pd == d.pd);
	errno = 0;
	CHECK(ibv_free_dm(dm) == EBUSY);
	CHECK(errno == EBUSY); /* execute_ioctl() sets it to what it returns */
	/* libibverbs passes a DM MR on (cmd_dm.c makes it an
	 * IBV_MR_TYPE_MR); the kernel refuses it (ib_uverbs_rereg_mr). */
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, lw) ==
	      IBV_REREG_MR_ERR_CMD);
	CHECK(errno == EINVAL);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_free_dm(dm) == 0);
}

TEST_CASE("device memory: SEND, WRITE and READ through DM MRs, addressed from 0", "[dm]")
{
	loopback::Pair p;
	p.connect();
	struct ibv_dm *da = alloc(p.ctx, 256), *db = alloc(p.ctx, 256);
	REQUIRE((da && db));
	const unsigned access = lw | zb | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *ma = ibv_reg_dm_mr(p.pd, da, 0, 256, access);
	/* From byte 64 of b's DM on: its iova 0 is that byte. */
	struct ibv_mr *mb = ibv_reg_dm_mr(p.pd, db, 64, 192, access);
	REQUIRE((ma && mb));

	REQUIRE(ibv_memcpy_to_dm(da, 0, "sent-from-dm!!!!", 16) == 0);
	REQUIRE(shmv_test::post_recv_sge(p.b.qp, {0, 64, mb->lkey}, 5) == 0);
	struct ibv_send_wr wr{};
	wr.opcode = IBV_WR_SEND;
	REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {0, 16, ma->lkey}) == 0);
	struct ibv_wc wc{};
	REQUIRE(loopback::Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(loopback::Pair::wait_wc(p.b, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.byte_len == 16);
	char back[16];
	REQUIRE(ibv_memcpy_from_dm(back, db, 64, 16) == 0);
	CHECK(std::memcmp(back, "sent-from-dm!!!!", 16) == 0);

	/* A WRITE from host memory into b's DM at iova 32 (byte 96). */
	std::memcpy(p.a.at(0), "written-to-dm!!!", 16);
	wr = {};
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = 32;
	wr.wr.rdma.rkey = mb->rkey;
	REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {p.a.addr(0), 16, p.a.mr->lkey}) == 0);
	REQUIRE(loopback::Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(ibv_memcpy_from_dm(back, db, 96, 16) == 0);
	CHECK(std::memcmp(back, "written-to-dm!!!", 16) == 0);

	/* A READ of it into a's DM at iova 128; past b's MR: an access error. */
	wr = {};
	wr.opcode = IBV_WR_RDMA_READ;
	wr.wr.rdma.remote_addr = 32;
	wr.wr.rdma.rkey = mb->rkey;
	REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {128, 16, ma->lkey}) == 0);
	REQUIRE(loopback::Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(ibv_memcpy_from_dm(back, da, 128, 16) == 0);
	CHECK(std::memcmp(back, "written-to-dm!!!", 16) == 0);
	wr.wr.rdma.remote_addr = 184;
	REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {128, 16, ma->lkey}) == 0);
	REQUIRE(loopback::Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);

	CHECK(ibv_dereg_mr(ma) == 0);
	CHECK(ibv_dereg_mr(mb) == 0);
	CHECK(ibv_free_dm(da) == 0);
	CHECK(ibv_free_dm(db) == 0);
}

TEST_CASE("rxe: no device memory", "[.][rxe]")
{
	shmv_test::DeviceWithPd d;
	struct ibv_device_attr_ex attr{};
	REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &attr) == 0);
	CHECK(attr.max_dm_size == 0);
	CHECK(alloc_errno(d.ctx, 64) == EOPNOTSUPP);
}
