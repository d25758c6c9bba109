/* SPDX-License-Identifier: MIT */
/*
 * libmlx5's MLX_{CQ,QP,SRQ}_ALLOC_TYPE (lib/huge_pages.h): an object asked
 * onto huge pages takes them from the host as libmlx5's would, or cannot
 * be created when the host has none (ENOMEM). Which of the two a host
 * shows depends on its huge pages, so each case reads /proc/meminfo first
 * and checks the outcome that host must give.
 */
#include "../common/fixtures.h"

#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

/* 2 MiB huge pages free and not reserved, as /proc/meminfo counts them. */
long huge_pages_available()
{
	std::ifstream in("/proc/meminfo");
	long free = 0, reserved = 0;
	for (std::string key; in >> key;) {
		long value = 0;
		in >> value;
		if (key == "HugePages_Free:")
			free = value;
		else if (key == "HugePages_Rsvd:")
			reserved = value;
		in.ignore(1 << 10, '\n');
	}
	return free - reserved;
}

struct EnvGuard {
	const char *name;
	EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
	~EnvGuard() { unsetenv(name); }
	EnvGuard(const EnvGuard &) = delete;
	EnvGuard &operator=(const EnvGuard &) = delete;
};

struct ibv_qp *create_rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr{};
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 100;
	attr.cap.max_recv_wr = 100;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &attr);
}

/* A CQ and an RC QP on it, both required to be created; destroyed in
 * order. */
struct CqAndQp {
	struct ibv_cq *cq;
	struct ibv_qp *qp = nullptr;

	CqAndQp(struct ibv_context *ctx, struct ibv_pd *pd)
	{
		cq = ibv_create_cq(ctx, 100, nullptr, nullptr, 0);
		REQUIRE(cq);
		qp = create_rc_qp(pd, cq);
		REQUIRE(qp);
	}
	~CqAndQp()
	{
		if (qp)
			CHECK(ibv_destroy_qp(qp) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
	CqAndQp(const CqAndQp &) = delete;
	CqAndQp &operator=(const CqAndQp &) = delete;
};

struct ibv_srq *create_srq(struct ibv_pd *pd)
{
	struct ibv_srq_init_attr attr{};
	attr.attr.max_wr = 64;
	attr.attr.max_sge = 1;
	return ibv_create_srq(pd, &attr);
}

void *no_alloc(struct ibv_pd *, void *, size_t, size_t, uint64_t)
{
	return IBV_ALLOCATOR_USE_DEFAULT;
}
void no_free(struct ibv_pd *, void *, void *, uint64_t) {}

} // namespace

TEST_CASE("MLX_*_ALLOC_TYPE=HUGE: huge pages taken, or ENOMEM without them", "[alloc_type]")
{
	shmv_test::DeviceWithPd f;
	const long before = huge_pages_available();
	INFO("huge pages available: " << before);
	EnvGuard cq_env("MLX_CQ_ALLOC_TYPE", "HUGE");
	EnvGuard qp_env("MLX_QP_ALLOC_TYPE", "HUGE");
	EnvGuard srq_env("MLX_SRQ_ALLOC_TYPE", "huge"); /* libmlx5 ignores case */

	if (before < 1) {
		errno = 0;
		CHECK(ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0) == nullptr);
		CHECK(errno == ENOMEM);
		errno = 0;
		CHECK(create_srq(f.pd) == nullptr);
		CHECK(errno == ENOMEM);
		/* The QP's own buffer fails with a CQ that is not on huge pages. */
		unsetenv("MLX_CQ_ALLOC_TYPE");
		struct ibv_cq *cq = ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0);
		REQUIRE(cq);
		errno = 0;
		CHECK(create_rc_qp(f.pd, cq) == nullptr);
		CHECK(errno == ENOMEM);
		/* Nothing was left behind: the same QP without huge pages. */
		unsetenv("MLX_QP_ALLOC_TYPE");
		struct ibv_qp *qp = create_rc_qp(f.pd, cq);
		REQUIRE(qp);
		CHECK(ibv_destroy_qp(qp) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
		return;
	}
	/* A host with huge pages: the three objects share one 2 MiB page in
	 * 32 KiB chunks (as libmlx5's share a region), held until destroyed. */
	struct ibv_cq *cq = ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0);
	REQUIRE(cq);
	CHECK(huge_pages_available() == before - 1);
	struct ibv_qp *qp = create_rc_qp(f.pd, cq);
	REQUIRE(qp);
	struct ibv_srq *srq = create_srq(f.pd);
	REQUIRE(srq);
	CHECK(huge_pages_available() == before - 1);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(huge_pages_available() == before - 1);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(huge_pages_available() == before);
}

TEST_CASE("MLX_*_ALLOC_TYPE: PREFER_HUGE falls back, ANON and custom allocators never ask",
	  "[alloc_type]")
{
	shmv_test::DeviceWithPd f;
	const long before = huge_pages_available();

	SECTION("PREFER_HUGE and ALL create everywhere")
	{
		EnvGuard cq_env("MLX_CQ_ALLOC_TYPE", "PREFER_HUGE");
		EnvGuard qp_env("MLX_QP_ALLOC_TYPE", "ALL");
		CqAndQp objects(f.ctx, f.pd);
		/* On huge pages when the host has some. */
		CHECK(huge_pages_available() == (before > 0 ? before - 1 : before));
	}
	SECTION("an explicit type overrides the older HUGE_CQ=y")
	{
		EnvGuard legacy("HUGE_CQ", "y");
		EnvGuard type("MLX_CQ_ALLOC_TYPE", "ANON");
		struct ibv_cq *cq = ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0);
		REQUIRE(cq);
		CHECK(huge_pages_available() == before);
		CHECK(ibv_destroy_cq(cq) == 0);
	}
	SECTION("HUGE_CQ=y alone asks for huge pages")
	{
		EnvGuard legacy("HUGE_CQ", "y");
		errno = 0;
		struct ibv_cq *cq = ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0);
		CHECK((cq != nullptr) == (before > 0));
		if (cq)
			CHECK(ibv_destroy_cq(cq) == 0);
		else
			CHECK(errno == ENOMEM);
	}
	SECTION("a parent domain's allocators take the place of the type")
	{
		EnvGuard qp_env("MLX_QP_ALLOC_TYPE", "HUGE");
		EnvGuard srq_env("MLX_SRQ_ALLOC_TYPE", "HUGE");
		struct ibv_parent_domain_init_attr attr{};
		attr.pd = f.pd;
		attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
		attr.alloc = no_alloc;
		attr.free = no_free;
		struct ibv_pd *pdom = ibv_alloc_parent_domain(f.ctx, &attr);
		REQUIRE(pdom);
		struct ibv_cq *cq = ibv_create_cq(f.ctx, 100, nullptr, nullptr, 0);
		REQUIRE(cq);
		struct ibv_qp *qp = create_rc_qp(pdom, cq);
		REQUIRE(qp);
		struct ibv_srq *srq = create_srq(pdom);
		REQUIRE(srq);
		CHECK(huge_pages_available() == before);
		CHECK(ibv_destroy_srq(srq) == 0);
		CHECK(ibv_destroy_qp(qp) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
		CHECK(ibv_dealloc_pd(pdom) == 0);
	}
}

TEST_CASE("rxe: MLX_*_ALLOC_TYPE is libmlx5's, not read", "[.][rxe]")
{
	shmv_test::DeviceWithPd f;
	EnvGuard cq_env("MLX_CQ_ALLOC_TYPE", "HUGE");
	EnvGuard qp_env("MLX_QP_ALLOC_TYPE", "HUGE");
	CqAndQp objects(f.ctx, f.pd); /* both created: HUGE was not read */
}
