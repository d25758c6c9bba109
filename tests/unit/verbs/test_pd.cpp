/* SPDX-License-Identifier: MIT */
/* Protection domains, thread domains and parent domains through the C ABI. */
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <cerrno>
#include <vector>

namespace {

struct Fixture : shmv_test::OpenDevice {
	std::vector<char> buf = std::vector<char>(8192);
};

void *no_alloc(struct ibv_pd *, void *, size_t, size_t, uint64_t)
{
	return IBV_ALLOCATOR_USE_DEFAULT;
}
void no_free(struct ibv_pd *, void *, void *, uint64_t) {}

/* A parent domain of `pd`, without a TD or allocators. */
struct ibv_pd *parent_of(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_parent_domain_init_attr attr{};
	attr.pd = pd;
	return ibv_alloc_parent_domain(ctx, &attr);
}

} // namespace

TEST_CASE("alloc and dealloc PDs", "[pd]")
{
	Fixture f;
	struct ibv_pd *a = ibv_alloc_pd(f.ctx);
	struct ibv_pd *b = ibv_alloc_pd(f.ctx);
	REQUIRE(a);
	REQUIRE(b);
	CHECK(a->context == f.ctx);
	CHECK(a->handle != b->handle);
	CHECK(ibv_dealloc_pd(a) == 0);
	CHECK(ibv_dealloc_pd(b) == 0);
	errno = 0;
	CHECK(ibv_alloc_pd(nullptr) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(nullptr) == EINVAL);
}

TEST_CASE("thread domains", "[pd][td]")
{
	Fixture f;
	struct ibv_td_init_attr attr{};
	struct ibv_td *td = ibv_alloc_td(f.ctx, &attr);
	REQUIRE(td);
	CHECK(td->context == f.ctx);
	CHECK(ibv_dealloc_td(td) == 0);

	errno = 0;
	attr.comp_mask = 1;
	CHECK(ibv_alloc_td(f.ctx, &attr) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_alloc_td(f.ctx, nullptr) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("parent domain attribute checks", "[pd][parent]")
{
	Fixture f;
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct Row {
		const char *what;
		bool with_pd;
		uint32_t comp_mask;
		int err;
	};
	const Row rows[] = {
		{"no PD", false, 0, EINVAL},
		{"plain", true, 0, 0},
		{"allocators", true, IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, 0},
		{"pd_context", true, IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT, 0},
		{"both", true,
		 IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT, 0},
		{"unknown comp_mask bit", true, 1u << 2, EINVAL},
		{"unknown high bit", true, 1u << 31, EINVAL},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		struct ibv_parent_domain_init_attr attr{};
		attr.pd = r.with_pd ? pd : nullptr;
		attr.comp_mask = r.comp_mask;
		attr.alloc = no_alloc;
		attr.free = no_free;
		attr.pd_context = &f;
		errno = 0;
		struct ibv_pd *pdom = ibv_alloc_parent_domain(f.ctx, &attr);
		if (r.err) {
			CHECK(pdom == nullptr);
			CHECK(errno == r.err);
		} else {
			REQUIRE(pdom);
			CHECK(pdom != pd);
			CHECK(pdom->context == f.ctx);
			CHECK(pdom->handle == pd->handle); /* it stands for its PD */
			CHECK(ibv_dealloc_pd(pdom) == 0);
		}
	}
	errno = 0;
	CHECK(ibv_alloc_parent_domain(f.ctx, nullptr) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("a parent domain pins its PD and TD", "[pd][parent][td]")
{
	Fixture f;
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct ibv_td_init_attr td_attr{};
	struct ibv_td *td = ibv_alloc_td(f.ctx, &td_attr);
	REQUIRE(td);
	struct ibv_parent_domain_init_attr attr{};
	attr.pd = pd;
	attr.td = td;
	struct ibv_pd *pdom = ibv_alloc_parent_domain(f.ctx, &attr);
	REQUIRE(pdom);

	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dealloc_td(td) == EBUSY);

	/* A parent domain of a parent domain wraps the same PD. */
	attr.pd = pdom;
	attr.td = nullptr;
	struct ibv_pd *nested = ibv_alloc_parent_domain(f.ctx, &attr);
	REQUIRE(nested);
	CHECK(nested->handle == pd->handle);
	CHECK(ibv_dealloc_pd(pdom) == 0);
	CHECK(ibv_dealloc_td(td) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dealloc_pd(nested) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("objects created on a parent domain count against its PD", "[pd][parent][mr]")
{
	Fixture f;
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct ibv_pd *pdom = parent_of(f.ctx, pd);
	REQUIRE(pdom);

	struct ibv_mr *mr = ibv_reg_mr(pdom, f.buf.data(), f.buf.size(), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	CHECK(mr->pd == pdom);

	/* In libmlx5 only CQs and QPs pin a parent domain; MRs pin its PD. */
	CHECK(ibv_dealloc_pd(pdom) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("CQs and QPs created on a parent domain pin it", "[pd][parent][cq][qp]")
{
	Fixture f;
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct ibv_pd *pdom = parent_of(f.ctx, pd);
	REQUIRE(pdom);

	/* IBV_CQ_INIT_ATTR_MASK_PD takes a parent domain, nothing else. */
	struct ibv_cq_init_attr_ex cq_attr{};
	cq_attr.cqe = 16;
	cq_attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	cq_attr.parent_domain = pd;
	errno = 0;
	CHECK(ibv_create_cq_ex(f.ctx, &cq_attr) == nullptr);
	CHECK(errno == EINVAL);
	cq_attr.parent_domain = pdom;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(f.ctx, &cq_attr);
	REQUIRE(cq);
	CHECK(cq->cqe >= 16);
	/* As in libmlx5, a CQ pins the parent domain until it is destroyed
	 * (MRs pin only its PD, above)... */
	CHECK(ibv_dealloc_pd(pdom) == EBUSY);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);

	/* ... and so does a QP created on it, whatever its CQs. */
	struct ibv_cq *plain = ibv_create_cq(f.ctx, 16, nullptr, nullptr, 0);
	REQUIRE(plain);
	struct ibv_qp_init_attr qp_attr{};
	qp_attr.send_cq = plain;
	qp_attr.recv_cq = plain;
	qp_attr.qp_type = IBV_QPT_RC;
	qp_attr.cap.max_send_wr = 4;
	qp_attr.cap.max_recv_wr = 4;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pdom, &qp_attr);
	REQUIRE(qp);
	CHECK(qp->pd == pdom);
	CHECK(ibv_dealloc_pd(pdom) == EBUSY);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(plain) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dealloc_pd(pdom) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("rereg_mr onto a parent domain", "[pd][parent][mr]")
{
	Fixture f;
	struct ibv_pd *pd1 = ibv_alloc_pd(f.ctx);
	struct ibv_pd *pd2 = ibv_alloc_pd(f.ctx);
	REQUIRE(pd1);
	REQUIRE(pd2);
	struct ibv_pd *pdom = parent_of(f.ctx, pd2);
	REQUIRE(pdom);
	struct ibv_mr *mr = ibv_reg_mr(pd1, f.buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	REQUIRE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pdom, nullptr, 0, 0) == 0);
	CHECK(mr->pd == pdom);
	CHECK(ibv_dealloc_pd(pd1) == 0);
	CHECK(ibv_dealloc_pd(pdom) == 0);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0);
}

TEST_CASE("objects of another context are refused", "[pd][parent]")
{
	Fixture f;
	struct ibv_context *other = ibv_open_device(f.ctx->device);
	REQUIRE(other);
	struct ibv_pd *pd = ibv_alloc_pd(other);
	REQUIRE(pd);
	struct ibv_pd *own = ibv_alloc_pd(f.ctx);
	REQUIRE(own);

	struct ibv_parent_domain_init_attr attr{};
	attr.pd = pd;
	errno = 0;
	CHECK(ibv_alloc_parent_domain(f.ctx, &attr) == nullptr);
	CHECK(errno == EINVAL);

	/* uverbs looks the new PD up by handle in the MR's own context. */
	struct ibv_mr *mr = ibv_reg_mr(own, f.buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, nullptr, 0, 0) == IBV_REREG_MR_ERR_CMD);
	CHECK(errno == EINVAL);
	CHECK(mr->pd == own);
	CHECK(ibv_dereg_mr(mr) == 0);

	CHECK(ibv_dealloc_pd(own) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(other) == 0);
}
