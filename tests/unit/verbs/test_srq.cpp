/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues through the public verbs API: rounding, limits,
 * modify/query, XRC SRQs, every argument error, destruction order, the SRQ
 * limit event.
 */
#include "cqsrq_helpers.h"

#include <fcntl.h>

#include <chrono>
#include <future>

using namespace cqsrq_test;
using namespace std::chrono_literals;

namespace {

struct ibv_srq *basic_srq(struct ibv_pd *pd, uint32_t max_wr, uint32_t max_sge,
			  uint32_t srq_limit = 0)
{
	struct ibv_srq_init_attr attr{};
	attr.attr.max_wr = max_wr;
	attr.attr.max_sge = max_sge;
	attr.attr.srq_limit = srq_limit;
	return ibv_create_srq(pd, &attr);
}

/* A PD, a CQ and an XRC domain to build XRC SRQs from. */
struct XrcParts {
	Device &d;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_xrcd *xrcd;

	explicit XrcParts(Device &dev) : d(dev)
	{
		pd = ibv_alloc_pd(d.ctx);
		cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
		struct ibv_xrcd_init_attr xa{};
		xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
		xa.fd = -1;
		xa.oflags = O_CREAT;
		xrcd = ibv_open_xrcd(d.ctx, &xa);
		REQUIRE(pd);
		REQUIRE(cq);
		REQUIRE(xrcd);
	}
	~XrcParts()
	{
		CHECK(ibv_close_xrcd(xrcd) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
		CHECK(ibv_dealloc_pd(pd) == 0);
	}

	struct ibv_srq_init_attr_ex xrc_attr(uint32_t max_wr = 16, uint32_t max_sge = 1)
	{
		struct ibv_srq_init_attr_ex a{};
		a.attr.max_wr = max_wr;
		a.attr.max_sge = max_sge;
		a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			      IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		a.srq_type = IBV_SRQT_XRC;
		a.pd = pd;
		a.xrcd = xrcd;
		a.cq = cq;
		return a;
	}
};

} // namespace

TEST_CASE("SRQ sizes round as libmlx5", "[srq]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct {
		uint32_t wr, sge, wr_out, sge_out;
	} const table[] = {
		{1, 1, 1, 1},     {100, 2, 127, 3},  {128, 4, 255, 7},  {127, 3, 127, 3},
		{0, 0, 0, 1},     {32767, 31, 32767, 31}, {16, 8, 31, 15},
	};
	for (auto t : table) {
		CAPTURE(t.wr, t.sge);
		struct ibv_srq_init_attr attr{};
		attr.attr.max_wr = t.wr;
		attr.attr.max_sge = t.sge;
		struct ibv_srq *srq = ibv_create_srq(pd, &attr);
		REQUIRE(srq);
		CHECK(attr.attr.max_wr == t.wr_out);
		CHECK(attr.attr.max_sge == t.sge_out);
		CHECK(srq->context == d.ctx);
		CHECK(srq->pd == pd);
		struct ibv_srq_attr q{};
		REQUIRE(ibv_query_srq(srq, &q) == 0);
		CHECK(q.max_wr == t.wr_out);
		CHECK(q.max_sge == t.sge_out);
		CHECK(q.srq_limit == 0);
		CHECK(ibv_destroy_srq(srq) == 0);
	}
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("ibv_create_srq argument errors", "[srq]")
{
	Device d, other;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_device_attr dev;
	REQUIRE(ibv_query_device(d.ctx, &dev) == 0);

	struct {
		const char *what;
		uint32_t wr, sge;
	} const table[] = {
		{"max_wr over max_srq_wr", uint32_t(dev.max_srq_wr) + 1, 1},
		{"max_sge over max_srq_sge", 16, uint32_t(dev.max_srq_sge) + 1},
		{"huge max_wr", 0xffffffff, 1},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		errno = 0;
		CHECK(basic_srq(pd, t.wr, t.sge) == nullptr);
		CHECK(errno == EINVAL);
	}
	struct ibv_srq_init_attr attr{};
	attr.attr.max_wr = 1;
	attr.attr.max_sge = 1;
	errno = 0;
	CHECK(ibv_create_srq(nullptr, &attr) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_srq(pd, nullptr) == nullptr);
	CHECK(errno == EINVAL);

	/* A PD of another context is an unknown handle to this one. */
	struct ibv_srq_init_attr_ex ex{};
	ex.attr.max_wr = 1;
	ex.attr.max_sge = 1;
	ex.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ; /* not the inline shortcut */
	ex.pd = pd;
	errno = 0;
	CHECK(ibv_create_srq_ex(other.ctx, &ex) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("ibv_modify_srq and ibv_query_srq as mlx5", "[srq][modify]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	/* mlx5_ib ignores srq_limit at creation. */
	struct ibv_srq *srq = basic_srq(pd, 100, 1, 10);
	REQUIRE(srq);
	struct ibv_srq_attr q{};
	REQUIRE(ibv_query_srq(srq, &q) == 0);
	CHECK(q.max_wr == 127);
	CHECK(q.srq_limit == 0);

	struct {
		const char *what;
		int mask;
		uint32_t max_wr, limit;
		int err;
		uint32_t limit_after;
	} const table[] = {
		{"arm the limit", IBV_SRQ_LIMIT, 0, 10, 0, 10},
		{"limit == max_wr", IBV_SRQ_LIMIT, 0, 127, 0, 127},
		{"limit over max_wr", IBV_SRQ_LIMIT, 0, 128, EINVAL, 127},
		{"resize: mlx5 cannot", IBV_SRQ_MAX_WR, 200, 0, EINVAL, 127},
		{"resize with a valid limit: nothing changes", IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT, 200, 5,
		 EINVAL, 127},
		{"disarm", IBV_SRQ_LIMIT, 0, 0, 0, 0},
		{"empty mask", 0, 0, 0, 0, 0},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		struct ibv_srq_attr a{};
		a.max_wr = t.max_wr;
		a.srq_limit = t.limit;
		CHECK(ibv_modify_srq(srq, &a, t.mask) == t.err);
		REQUIRE(ibv_query_srq(srq, &q) == 0);
		CHECK(q.srq_limit == t.limit_after);
		CHECK(q.max_wr == 127);
	}
	CHECK(ibv_modify_srq(srq, nullptr, IBV_SRQ_LIMIT) == EINVAL);
	CHECK(ibv_modify_srq(nullptr, &q, IBV_SRQ_LIMIT) == EINVAL);
	CHECK(ibv_query_srq(srq, nullptr) == EINVAL);
	CHECK(ibv_query_srq(nullptr, &q) == EINVAL);
	CHECK(ibv_destroy_srq(nullptr) == EINVAL);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("an armed SRQ limit raises SRQ_LIMIT_REACHED once; destroy waits for the ack",
	  "[srq][limit]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_srq *srq = basic_srq(pd, 64, 1);
	REQUIRE(srq);

	/* Not armed: nothing. */
	REQUIRE(shmverbs_inject_srq_posted(srq, 0) == 0);
	CHECK_FALSE(readable(d.ctx->async_fd, 50));

	struct ibv_srq_attr a{};
	a.srq_limit = 10;
	REQUIRE(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT) == 0);
	REQUIRE(shmverbs_inject_srq_posted(srq, 10) == 0); /* not below the limit */
	CHECK_FALSE(readable(d.ctx->async_fd, 50));
	REQUIRE(shmverbs_inject_srq_posted(srq, 9) == 0);
	REQUIRE(readable(d.ctx->async_fd, 1000));
	struct ibv_async_event ev;
	REQUIRE(ibv_get_async_event(d.ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED);
	CHECK(ev.element.srq == srq);
	/* The event disarms the limit. */
	struct ibv_srq_attr q{};
	REQUIRE(ibv_query_srq(srq, &q) == 0);
	CHECK(q.srq_limit == 0);
	REQUIRE(shmverbs_inject_srq_posted(srq, 1) == 0);
	CHECK_FALSE(readable(d.ctx->async_fd, 50));

	auto destroyed = std::async(std::launch::async, [srq] { return ibv_destroy_srq(srq); });
	CHECK(destroyed.wait_for(100ms) == std::future_status::timeout);
	ibv_ack_async_event(&ev);
	REQUIRE(destroyed.wait_for(5000ms) == std::future_status::ready);
	CHECK(destroyed.get() == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("an SRQ_LIMIT_REACHED not read yet dies with its SRQ", "[srq][limit]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_srq *srq = basic_srq(pd, 64, 1);
	REQUIRE(srq);
	struct ibv_srq_attr a{};
	a.srq_limit = 10;
	REQUIRE(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT) == 0);
	REQUIRE(shmverbs_inject_srq_posted(srq, 9) == 0);
	REQUIRE(readable(d.ctx->async_fd, 1000));
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK_FALSE(readable(d.ctx->async_fd, 0));
	REQUIRE(fcntl(d.ctx->async_fd, F_SETFL, fcntl(d.ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(d.ctx, &ev) != 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("XRC SRQs: creation, SRQ numbers, ibv_get_srq_num", "[srq][xrc]")
{
	Device d;
	XrcParts x(d);
	struct ibv_srq_init_attr_ex a = x.xrc_attr(100, 2);
	struct ibv_srq *s1 = ibv_create_srq_ex(d.ctx, &a);
	REQUIRE(s1);
	CHECK(a.attr.max_wr == 127);
	CHECK(a.attr.max_sge == 3);
	CHECK(s1->pd == x.pd);
	a = x.xrc_attr();
	struct ibv_srq *s2 = ibv_create_srq_ex(d.ctx, &a);
	REQUIRE(s2);
	uint32_t n1 = 0, n2 = 0;
	CHECK(ibv_get_srq_num(s1, &n1) == 0);
	CHECK(ibv_get_srq_num(s2, &n2) == 0);
	CHECK(n1 != 0);
	CHECK(n2 != 0);
	CHECK(n1 != n2);
	CHECK(n1 < (1u << 24));
	CHECK(ibv_get_srq_num(s1, nullptr) == EINVAL);

	/* libmlx5 answers for basic SRQs as well. */
	struct ibv_srq *basic = basic_srq(x.pd, 4, 1);
	REQUIRE(basic);
	uint32_t nb = 0;
	CHECK(ibv_get_srq_num(basic, &nb) == 0);
	CHECK(nb != 0);
	CHECK(nb != n1);

	CHECK(ibv_destroy_srq(basic) == 0);
	CHECK(ibv_destroy_srq(s2) == 0);
	CHECK(ibv_destroy_srq(s1) == 0);
}

TEST_CASE("ibv_create_srq_ex validation", "[srq][xrc]")
{
	Device d, other;
	XrcParts x(d);
	XrcParts y(other);
	struct ibv_cq_init_attr_ex cqa{};
	cqa.cqe = 4;
	struct ibv_cq_ex *ext_cq = ibv_create_cq_ex(d.ctx, &cqa);
	REQUIRE(ext_cq);

	struct Case {
		const char *what;
		void (*edit)(struct ibv_srq_init_attr_ex &, XrcParts &, XrcParts &, struct ibv_cq_ex *);
		int err;
	} const table[] = {
		{"unknown comp_mask bit", [](auto &a, auto &, auto &, auto) {
			 a.comp_mask |= IBV_SRQ_INIT_ATTR_RESERVED; }, EOPNOTSUPP},
		{"no PD", [](auto &a, auto &, auto &, auto) { a.comp_mask &= ~IBV_SRQ_INIT_ATTR_PD; },
		 EINVAL},
		{"NULL PD", [](auto &a, auto &, auto &, auto) { a.pd = nullptr; }, EINVAL},
		{"XRC without XRCD", [](auto &a, auto &, auto &, auto) {
			 a.comp_mask &= ~IBV_SRQ_INIT_ATTR_XRCD; }, EINVAL},
		{"XRC without CQ", [](auto &a, auto &, auto &, auto) {
			 a.comp_mask &= ~IBV_SRQ_INIT_ATTR_CQ; }, EINVAL},
		{"XRC with NULL xrcd", [](auto &a, auto &, auto &, auto) { a.xrcd = nullptr; }, EINVAL},
		{"XRC with NULL cq", [](auto &a, auto &, auto &, auto) { a.cq = nullptr; }, EINVAL},
		{"XRCD of another context", [](auto &a, auto &, auto &o, auto) { a.xrcd = o.xrcd; },
		 EINVAL},
		{"CQ of another context", [](auto &a, auto &, auto &o, auto) { a.cq = o.cq; }, EINVAL},
		{"PD of another context", [](auto &a, auto &, auto &o, auto) { a.pd = o.pd; }, EINVAL},
		{"unknown SRQ type", [](auto &a, auto &, auto &, auto) {
			 a.srq_type = static_cast<enum ibv_srq_type>(7); }, EINVAL},
		{"tag matching on a plain CQ", [](auto &a, auto &, auto &, auto) {
			 a.srq_type = IBV_SRQT_TM; }, EINVAL},
		{"tag matching (not emulated)", [](auto &a, auto &, auto &, auto cq) {
			 a.srq_type = IBV_SRQT_TM;
			 a.cq = ibv_cq_ex_to_cq(cq);
			 a.comp_mask |= IBV_SRQ_INIT_ATTR_TM;
			 a.tm_cap.max_num_tags = 16;
			 a.tm_cap.max_ops = 16; }, EOPNOTSUPP},
		{"max_wr over the limit", [](auto &a, auto &, auto &, auto) { a.attr.max_wr = 32768; },
		 EINVAL},
		{"max_sge over the limit", [](auto &a, auto &, auto &, auto) { a.attr.max_sge = 32; },
		 EINVAL},
	};
	for (const Case &t : table) {
		CAPTURE(t.what);
		struct ibv_srq_init_attr_ex a = x.xrc_attr();
		t.edit(a, x, y, ext_cq);
		errno = 0;
		CHECK(ibv_create_srq_ex(d.ctx, &a) == nullptr);
		CHECK(errno == t.err);
	}
	/* (A NULL attr cannot be tested: verbs.h's inline ibv_create_srq_ex()
	 * reads it before reaching the provider, on real hardware too.) */

	/* A basic SRQ through the slot (not the inline shortcut): the CQ is
	 * not taken, as the kernel only takes it for XRC. */
	struct ibv_srq_init_attr_ex b{};
	b.attr.max_wr = 4;
	b.attr.max_sge = 1;
	b.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
	b.pd = x.pd;
	b.cq = ibv_cq_ex_to_cq(ext_cq);
	struct ibv_srq *srq = ibv_create_srq_ex(d.ctx, &b);
	REQUIRE(srq);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ext_cq)) == 0);
	CHECK(ibv_destroy_srq(srq) == 0);

	/* libmlx5 takes a basic SRQ through ibv_create_srq()'s command,
	 * which reads the PD and never comp_mask (mlx5_create_srq_ex): no PD
	 * bit, unknown bits, the type bit alone all create it. */
	for (uint32_t mask : {0u, uint32_t(IBV_SRQ_INIT_ATTR_TYPE),
			      uint32_t(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				       IBV_SRQ_INIT_ATTR_RESERVED)}) {
		CAPTURE(mask);
		struct ibv_srq_init_attr_ex m{};
		m.attr.max_wr = 4;
		m.attr.max_sge = 1;
		m.comp_mask = mask;
		m.srq_type = IBV_SRQT_BASIC;
		m.pd = x.pd;
		struct ibv_srq *s = ibv_create_srq_ex(d.ctx, &m);
		REQUIRE(s);
		CHECK(m.attr.max_wr == 7); /* rounded as any basic SRQ */
		CHECK(ibv_destroy_srq(s) == 0);
		m.pd = nullptr; /* still needed: libmlx5 would crash on it */
		errno = 0;
		CHECK(ibv_create_srq_ex(d.ctx, &m) == nullptr);
		CHECK(errno == EINVAL);
	}
}

TEST_CASE("what an SRQ uses cannot go first (EBUSY)", "[srq][destroy]")
{
	Device d;
	XrcParts x(d);
	struct ibv_srq_init_attr_ex a = x.xrc_attr();
	struct ibv_srq *srq = ibv_create_srq_ex(d.ctx, &a);
	REQUIRE(srq);
	CHECK(ibv_destroy_cq(x.cq) == EBUSY);
	CHECK(ibv_close_xrcd(x.xrcd) == EBUSY);
	CHECK(ibv_dealloc_pd(x.pd) == EBUSY);

	struct ibv_srq *basic = basic_srq(x.pd, 4, 1);
	REQUIRE(basic);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_cq(x.cq) == 0);
	x.cq = ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0); /* for XrcParts' cleanup */
	REQUIRE(x.cq);
	CHECK(ibv_dealloc_pd(x.pd) == EBUSY); /* still the basic SRQ */
	CHECK(ibv_destroy_srq(basic) == 0);
}

/* --- Other profiles (run as their own meson test with SHMVERBS_PROFILE) --- */

TEST_CASE("rxe: SRQs resize, keep the initial limit, refuse an empty queue", "[.][rxe]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_srq_init_attr attr{};
	attr.attr.max_wr = 10;
	attr.attr.max_sge = 2;
	attr.attr.srq_limit = 5;
	struct ibv_srq *srq = ibv_create_srq(pd, &attr);
	REQUIRE(srq);
	CHECK(attr.attr.max_wr == 15);
	CHECK(attr.attr.max_sge == 2);
	struct ibv_srq_attr q{};
	REQUIRE(ibv_query_srq(srq, &q) == 0);
	CHECK(q.srq_limit == 5);

	struct {
		const char *what;
		int mask;
		uint32_t max_wr, limit;
		int err;
		uint32_t wr_after;
	} const table[] = {
		{"grow", IBV_SRQ_MAX_WR, 100, 0, 0, 127},
		{"shrink below the limit", IBV_SRQ_MAX_WR, 4, 0, EINVAL, 127},
		{"zero", IBV_SRQ_MAX_WR, 0, 0, EINVAL, 127},
		{"over max_srq_wr", IBV_SRQ_MAX_WR, 0x4001, 0, EINVAL, 127},
		{"limit over max_wr", IBV_SRQ_LIMIT, 0, 128, EINVAL, 127},
		{"shrink", IBV_SRQ_MAX_WR, 20, 0, 0, 31},
	};
	for (auto t : table) {
		CAPTURE(t.what);
		struct ibv_srq_attr a{};
		a.max_wr = t.max_wr;
		a.srq_limit = t.limit;
		CHECK(ibv_modify_srq(srq, &a, t.mask) == t.err);
		REQUIRE(ibv_query_srq(srq, &q) == 0);
		CHECK(q.max_wr == t.wr_after);
	}
	/* Nor below the WQEs it holds: 12 posted, 7 refused, 15 taken. */
	struct ibv_sge sge{};
	struct ibv_recv_wr wr{};
	wr.sg_list = &sge;
	wr.num_sge = 1;
	for (int i = 0; i < 12; i++) {
		struct ibv_recv_wr *bad = nullptr;
		REQUIRE(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}
	struct ibv_srq_attr shrink{};
	shrink.max_wr = 5;
	CHECK(ibv_modify_srq(srq, &shrink, IBV_SRQ_MAX_WR) == EINVAL);
	REQUIRE(ibv_query_srq(srq, &q) == 0);
	CHECK(q.max_wr == 31);
	shrink.max_wr = 12;
	CHECK(ibv_modify_srq(srq, &shrink, IBV_SRQ_MAX_WR) == 0);
	REQUIRE(ibv_query_srq(srq, &q) == 0);
	CHECK(q.max_wr == 15);
	CHECK(ibv_destroy_srq(srq) == 0);
	errno = 0;
	CHECK(basic_srq(pd, 0, 1) == nullptr);
	CHECK(errno == EINVAL);
	/* librxe sends a basic SRQ of ibv_create_srq_ex() through
	 * ibv_cmd_create_srq_ex() too, which wants the PD bit. */
	struct ibv_srq_init_attr_ex ex{};
	ex.attr.max_wr = 4;
	ex.attr.max_sge = 1;
	ex.pd = pd;
	errno = 0;
	CHECK(ibv_create_srq_ex(d.ctx, &ex) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("exact: SRQ sizes as asked", "[.][exact]")
{
	Device d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_srq_init_attr attr{};
	attr.attr.max_wr = 100;
	attr.attr.max_sge = 2;
	struct ibv_srq *srq = ibv_create_srq(pd, &attr);
	REQUIRE(srq);
	CHECK(attr.attr.max_wr == 100);
	CHECK(attr.attr.max_sge == 2);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}
