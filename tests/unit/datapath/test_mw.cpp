/* SPDX-License-Identifier: MIT */
/*
 * Memory windows (lib/mw.h), mlx5 profile: type 1 bound by ibv_bind_mw and
 * type 2B by BIND_MW WRs; remote access through a window's key and only
 * within it; unbinding, LOCAL_INV, a peer's SEND_WITH_INV, deallocation and
 * the MR's deregistration all end that access; what the HCA refuses at
 * execution fails with MW_BIND_ERR (or LOC_QP_OP_ERR for LOCAL_INV) and the
 * QP enters ERR; the verbs' own errnos. Side a owns the windows, side b
 * accesses them (two QPs of one process: the data path is the one used
 * across processes; unit-datapath [mw] has a peer process).
 */
#include "loopback.h"

#include <cerrno>
#include <cstring>

using namespace loopback;

namespace {

Options mw_options()
{
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
		     IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	return o;
}

constexpr uint32_t window_off = 1024, window_len = 256;

/* Side a's buffer registered again, for windows: `access` plus MW_BIND
 * unless told otherwise. */
struct BindableMr {
	struct ibv_mr *mr;
	BindableMr(Pair &p, uint32_t access)
	{
		mr = ibv_reg_mr(p.pd, p.a.buf.data(), p.a.buf.size(), access);
		REQUIRE(mr);
	}
	~BindableMr() { ibv_dereg_mr(mr); }
};

struct ibv_mw_bind_info window_info(Pair &p, struct ibv_mr *mr,
				    uint32_t access = IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ)
{
	struct ibv_mw_bind_info b{};
	b.mr = mr;
	b.addr = p.a.addr(window_off);
	b.length = window_len;
	b.mw_access_flags = access;
	return b;
}

/* A connected pair, side a's buffer registered again for windows, and a
 * window of type `Type` of the pair's PD. */
template <enum ibv_mw_type Type>
struct Windowed {
	Pair p{mw_options()};
	BindableMr m{p, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND};
	struct ibv_mw *mw = ibv_alloc_mw(p.pd, Type);

	Windowed()
	{
		p.connect();
		REQUIRE(mw);
	}
	~Windowed()
	{
		if (mw)
			ibv_dealloc_mw(mw);
	}
	/* The test's own ibv_dealloc_mw(): true when it succeeded. */
	bool dealloc()
	{
		const int err = ibv_dealloc_mw(mw);
		mw = nullptr;
		return err == 0;
	}
};
using Type1 = Windowed<IBV_MW_TYPE_1>;
using Type2 = Windowed<IBV_MW_TYPE_2>;

/* A signaled BIND_MW of type 2 window `mw` on side a's QP: post's errno. */
int post_bind(Pair &p, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info &info,
	      uint64_t wr_id = 50)
{
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = info;
	return ibv_post_send(p.a.qp, &wr, &bad);
}

/* A LOCAL_INV of `key` on side a's QP: post's errno. */
int post_local_inv(Pair &p, uint32_t key, bool signaled = true)
{
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 60;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	wr.invalidate_rkey = key;
	return ibv_post_send(p.a.qp, &wr, &bad);
}

/* Side a's next completion: its status (and opcode in `op`). */
enum ibv_wc_status a_completion(Pair &p, enum ibv_wc_opcode *op = nullptr)
{
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	if (op)
		*op = wc.opcode;
	return wc.status;
}

/* An 8-byte RDMA op from side b at `remote` with `rkey`: its status. */
enum ibv_wc_status b_access(Pair &p, enum ibv_wr_opcode op, uint32_t rkey, uint64_t remote)
{
	struct ibv_send_wr wr{};
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = remote;
	REQUIRE(Pair::post8(p.b, op, 7, wr) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.b, wc));
	return wc.status;
}

/* A bind that waits in a's send queue: a's SEND (wr_id 1) waits for RNR,
 * b having posted no receive, and the BIND_MW of `mw` over `mr` (wr_id 2)
 * behind it; it executes once release_queued_bind() lets the SEND go. */
void queue_bind(Pair &p, struct ibv_mw *mw, struct ibv_mr *mr)
{
	REQUIRE(Pair::post8(p.a, IBV_WR_SEND, 1) == 0);
	REQUIRE(post_bind(p, mw, ibv_inc_rkey(mw->rkey), window_info(p, mr), 2) == 0);
}

/* b posts a receive: the SEND completes, then the bind; the bind's status. */
enum ibv_wc_status release_queued_bind(Pair &p)
{
	REQUIRE(Pair::post_recv(p.b, 3, 0, 64) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 1);
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 2);
	return wc.status;
}

/* A type 2 window of side a bound (on a's QP) over the window range with
 * key variant 0x42; its key. */
uint32_t bound_type2(Pair &p, struct ibv_mw *mw, struct ibv_mr *mr)
{
	const uint32_t key = (mw->rkey & ~0xffu) | 0x42;
	REQUIRE(post_bind(p, mw, key, window_info(p, mr)) == 0);
	enum ibv_wc_opcode op;
	REQUIRE(a_completion(p, &op) == IBV_WC_SUCCESS);
	CHECK(op == IBV_WC_BIND_MW);
	return key;
}

} // namespace

TEST_CASE("memory windows: the mlx5 profile offers types 1 and 2B", "[mw]")
{
	Pair p;
	struct ibv_device_attr a{};
	REQUIRE(ibv_query_device(p.ctx, &a) == 0);
	CHECK(a.max_mw == 1 << 24);
	CHECK(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	CHECK(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	CHECK_FALSE(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A);
	struct ibv_device_attr_ex x{};
	REQUIRE(ibv_query_device_ex(p.ctx, nullptr, &x) == 0);
	CHECK(x.orig_attr.max_mw == 1 << 24);
	CHECK(x.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
}

TEST_CASE("memory windows: allocation and its errnos", "[mw]")
{
	Pair p;
	for (int type : {0, 3}) {
		CAPTURE(type);
		errno = 0;
		CHECK(ibv_alloc_mw(p.pd, static_cast<enum ibv_mw_type>(type)) == nullptr);
		CHECK(errno == EINVAL);
	}
	struct ibv_mw *w1 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_1);
	struct ibv_mw *w2 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	REQUIRE((w1 && w2));
	CHECK(w1->type == IBV_MW_TYPE_1);
	CHECK(w2->type == IBV_MW_TYPE_2);
	CHECK((w1->pd == p.pd && w1->context == p.ctx));
	CHECK((w1->rkey >> 8) != (w2->rkey >> 8));
	CHECK((w1->rkey >> 8) != (p.a.mr->rkey >> 8));
	/* The PD is in use while a window exists. */
	struct ibv_pd *pd2 = ibv_alloc_pd(p.ctx);
	REQUIRE(pd2);
	struct ibv_mw *w3 = ibv_alloc_mw(pd2, IBV_MW_TYPE_2);
	REQUIRE(w3);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(ibv_dealloc_mw(w3) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0);
	CHECK(ibv_dealloc_mw(w1) == 0);
	CHECK(ibv_dealloc_mw(w2) == 0);
}

TEST_CASE_METHOD(Type1, "memory windows: type 1 bound by ibv_bind_mw gives access to its range only",
		 "[mw]")
{
	const uint32_t before = mw->rkey;
	struct ibv_mw_bind bind{};
	bind.wr_id = 11;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info = window_info(p, m.mr);
	REQUIRE(ibv_bind_mw(p.a.qp, mw, &bind) == 0);
	CHECK(mw->rkey == ibv_inc_rkey(before));
	enum ibv_wc_opcode op;
	REQUIRE(a_completion(p, &op) == IBV_WC_SUCCESS);
	CHECK(op == IBV_WC_BIND_MW);

	std::memcpy(p.b.at(0), "windowed", 8);
	CHECK(b_access(p, IBV_WR_RDMA_WRITE, mw->rkey, p.a.addr(window_off + 8)) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(p.a.at(window_off + 8), "windowed", 8) == 0);
	std::memcpy(p.a.at(window_off + 16), "read-me!", 8);
	CHECK(b_access(p, IBV_WR_RDMA_READ, mw->rkey, p.a.addr(window_off + 16)) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(p.b.at(0), "read-me!", 8) == 0);

	SECTION("beyond the window: REM_ACCESS_ERR (the MR itself is larger)")
	{
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, mw->rkey, p.a.addr(window_off + window_len - 4)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("the key before the bind reaches nothing")
	{
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, before, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("rebound with length 0: unbound")
	{
		const uint32_t bound = mw->rkey;
		bind.bind_info.addr = 0;
		bind.bind_info.length = 0;
		bind.bind_info.mw_access_flags = 0;
		REQUIRE(ibv_bind_mw(p.a.qp, mw, &bind) == 0);
		REQUIRE(a_completion(p) == IBV_WC_SUCCESS);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, bound, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, mw->rkey, p.a.addr(window_off)) ==
		      IBV_WC_WR_FLUSH_ERR); /* b is in ERR since */
	}
	SECTION("rebound elsewhere: the old key fails, the new one works")
	{
		const uint32_t old = mw->rkey;
		bind.bind_info.addr = p.a.addr(4096);
		REQUIRE(ibv_bind_mw(p.a.qp, mw, &bind) == 0);
		REQUIRE(a_completion(p) == IBV_WC_SUCCESS);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, mw->rkey, p.a.addr(4096)) == IBV_WC_SUCCESS);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, old, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("the window's key is no lkey")
	{
		struct ibv_send_wr wr{};
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.rkey = p.b.mr->rkey;
		wr.wr.rdma.remote_addr = p.b.addr(0);
		REQUIRE(shmv_test::post_send_sge(p.a.qp, wr, {p.a.addr(window_off), 8, mw->rkey}) ==
			0);
		CHECK(a_completion(p) == IBV_WC_LOC_PROT_ERR);
	}
	SECTION("deallocated: its key reaches nothing")
	{
		const uint32_t key = mw->rkey;
		REQUIRE(dealloc());
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, key, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("the MR deregistered: its windows are unbound")
	{
		const uint32_t key = mw->rkey;
		REQUIRE(ibv_dereg_mr(m.mr) == 0);
		m.mr = ibv_reg_mr(p.pd, p.a.buf.data(), 64, IBV_ACCESS_LOCAL_WRITE);
		REQUIRE(m.mr);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, key, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	if (mw)
		CHECK(dealloc());
}

TEST_CASE("memory windows: ibv_bind_mw's own errnos", "[mw]")
{
	Pair p(mw_options());
	p.connect();
	BindableMr m(p, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *w1 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_1);
	struct ibv_mw *w2 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	REQUIRE((w1 && w2));
	struct ibv_mw_bind bind{};
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info = window_info(p, m.mr);
	CHECK(ibv_bind_mw(p.a.qp, w2, &bind) == EINVAL); /* libibverbs: type 1 only */
	bind.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	CHECK(ibv_bind_mw(p.a.qp, w1, &bind) == EINVAL); /* libmlx5 */
	bind.bind_info = window_info(p, m.mr);
	bind.bind_info.mr = nullptr;
	CHECK(ibv_bind_mw(p.a.qp, w1, &bind) == EINVAL); /* a range without an MR */
	struct ibv_mr *null_mr = ibv_alloc_null_mr(p.pd);
	REQUIRE(null_mr);
	bind.bind_info.mr = null_mr;
	CHECK(ibv_bind_mw(p.a.qp, w1, &bind) == ENOTSUP);
	CHECK(Pair::quiet(p.a)); /* nothing was posted */
	CHECK(ibv_dereg_mr(null_mr) == 0);
	CHECK(ibv_dealloc_mw(w1) == 0);
	CHECK(ibv_dealloc_mw(w2) == 0);
}

TEST_CASE_METHOD(Type2,
		 "memory windows: type 2 by BIND_MW, ended by LOCAL_INV or a peer's SEND_WITH_INV",
		 "[mw]")
{
	const uint32_t key = bound_type2(p, mw, m.mr);
	std::memcpy(p.b.at(0), "type-two", 8);
	CHECK(b_access(p, IBV_WR_RDMA_WRITE, key, p.a.addr(window_off)) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(p.a.at(window_off), "type-two", 8) == 0);

	SECTION("LOCAL_INV")
	{
		REQUIRE(post_local_inv(p, key) == 0);
		enum ibv_wc_opcode op;
		REQUIRE(a_completion(p, &op) == IBV_WC_SUCCESS);
		CHECK(op == IBV_WC_LOCAL_INV);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, key, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("SEND_WITH_INV from the peer")
	{
		REQUIRE(Pair::post_recv(p.a, 70, 0, 64) == 0);
		struct ibv_send_wr wr{};
		wr.invalidate_rkey = key;
		REQUIRE(Pair::post8(p.b, IBV_WR_SEND_WITH_INV, 71, wr) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.b, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.wc_flags & IBV_WC_WITH_INV);
		CHECK(wc.invalidated_rkey == key);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, key, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("rebound after LOCAL_INV with a new key; bound twice is MW_BIND_ERR")
	{
		REQUIRE(post_local_inv(p, key, false) == 0);
		const uint32_t again = ibv_inc_rkey(key);
		REQUIRE(post_bind(p, mw, again, window_info(p, m.mr)) == 0);
		REQUIRE(a_completion(p) == IBV_WC_SUCCESS);
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, again, p.a.addr(window_off)) == IBV_WC_SUCCESS);
		REQUIRE(post_bind(p, mw, ibv_inc_rkey(again), window_info(p, m.mr)) == 0);
		CHECK(a_completion(p) == IBV_WC_MW_BIND_ERR);
	}
	SECTION("bound to a's QP: a request to another QP may not use it")
	{
		/* b's QP is the responder of a's requests: a reading its own
		 * memory through b fails. */
		struct ibv_send_wr wr{};
		wr.wr.rdma.rkey = key;
		wr.wr.rdma.remote_addr = p.a.addr(window_off);
		REQUIRE(Pair::post8(p.a, IBV_WR_RDMA_READ, 80, wr) == 0);
		CHECK(a_completion(p) == IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("through ibv_wr_bind_mw")
	{
		REQUIRE(post_local_inv(p, key, false) == 0);
		const uint32_t next = ibv_inc_rkey(key);
		struct ibv_mw_bind_info info = window_info(p, m.mr, IBV_ACCESS_REMOTE_READ);
		ibv_wr_start(p.a.qpx);
		p.a.qpx->wr_id = 90;
		p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(p.a.qpx, mw, next, &info);
		REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
		enum ibv_wc_opcode op;
		REQUIRE(a_completion(p, &op) == IBV_WC_SUCCESS);
		CHECK(op == IBV_WC_BIND_MW);
		CHECK(b_access(p, IBV_WR_RDMA_READ, next, p.a.addr(window_off)) == IBV_WC_SUCCESS);
		/* Read only. */
		CHECK(b_access(p, IBV_WR_RDMA_WRITE, next, p.a.addr(window_off)) ==
		      IBV_WC_REM_ACCESS_ERR);
	}
	CHECK(dealloc());
}

TEST_CASE("memory windows: what the HCA refuses at execution is MW_BIND_ERR, the QP in ERR",
	  "[mw]")
{
	Pair p(mw_options());
	p.connect();
	struct ibv_mw *mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	REQUIRE(mw);
	uint32_t mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
	struct ibv_mw_bind_info info{};
	auto bind_fails = [&] {
		BindableMr m(p, mr_access);
		struct ibv_mw_bind_info i = window_info(p, m.mr);
		if (info.length)
			i = info, i.mr = m.mr;
		REQUIRE(post_bind(p, mw, mw->rkey, i) == 0);
		CHECK(a_completion(p) == IBV_WC_MW_BIND_ERR);
		struct ibv_qp_attr qa{};
		struct ibv_qp_init_attr ia{};
		REQUIRE(ibv_query_qp(p.a.qp, &qa, IBV_QP_STATE, &ia) == 0);
		CHECK(qa.qp_state == IBV_QPS_ERR);
	};
	SECTION("an MR without IBV_ACCESS_MW_BIND")
	{
		mr_access = IBV_ACCESS_LOCAL_WRITE;
		bind_fails();
	}
	SECTION("remote write over an MR without local write")
	{
		mr_access = IBV_ACCESS_MW_BIND;
		bind_fails();
	}
	SECTION("a range beyond the MR")
	{
		info = window_info(p, nullptr);
		info.length = buf_size;
		bind_fails();
	}
	SECTION("a window of another PD")
	{
		struct ibv_pd *pd2 = ibv_alloc_pd(p.ctx);
		REQUIRE(pd2);
		struct ibv_mw *other = ibv_alloc_mw(pd2, IBV_MW_TYPE_2);
		REQUIRE(other);
		std::swap(mw, other);
		bind_fails();
		std::swap(mw, other);
		CHECK(ibv_dealloc_mw(other) == 0);
		CHECK(ibv_dealloc_pd(pd2) == 0);
	}
	SECTION("LOCAL_INV of an MR's key: LOC_QP_OP_ERR")
	{
		REQUIRE(post_local_inv(p, p.a.mr->rkey) == 0);
		CHECK(a_completion(p) == IBV_WC_LOC_QP_OP_ERR);
	}
	CHECK(ibv_dealloc_mw(mw) == 0);
}

TEST_CASE_METHOD(Type2, "memory windows: BIND_MW's errnos at post", "[mw]")
{
	struct ibv_mw_bind_info info = window_info(p, m.mr);
	CHECK(post_bind(p, nullptr, mw->rkey, info) == EINVAL);
	info.length = (1ull << 31) + 1;
	CHECK(post_bind(p, mw, mw->rkey, info) == EOPNOTSUPP); /* libmlx5's KLM limit */
	CHECK(Pair::quiet(p.a));
	ibv_wr_start(p.a.qpx);
	ibv_wr_bind_mw(p.a.qpx, mw, mw->rkey, &info);
	CHECK(ibv_wr_complete(p.a.qpx) == EOPNOTSUPP);
	CHECK(dealloc());
}

TEST_CASE("memory windows: a UD QP takes no BIND_MW", "[mw]")
{
	Options o;
	o.type = IBV_QPT_UD;
	Pair p(o);
	p.connect();
	struct ibv_mw *mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	REQUIRE(mw);
	CHECK(post_bind(p, mw, mw->rkey, window_info(p, p.a.mr)) == EINVAL);
	CHECK(ibv_dealloc_mw(mw) == 0);
}

/* A bind queued behind an RNR wait executes after the application freed
 * what it names: the bind fails (MW_BIND_ERR), nothing crashes. */
TEST_CASE("memory windows: a queued bind whose window or MR is gone by then fails", "[mw]")
{
	Pair p(mw_options());
	p.connect();
	auto *m = new BindableMr(p, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	REQUIRE(mw);
	/* b has no receive posted: a's SEND waits for RNR, the bind behind it. */
	queue_bind(p, mw, m->mr);
	SECTION("the window deallocated")
	{
		REQUIRE(ibv_dealloc_mw(mw) == 0);
		mw = nullptr;
	}
	SECTION("the MR deregistered")
	{
		delete m;
		m = nullptr;
	}
	CHECK(release_queued_bind(p) == IBV_WC_MW_BIND_ERR);
	delete m;
	if (mw)
		CHECK(ibv_dealloc_mw(mw) == 0);
}

/* A bind queued behind an RNR wait executes against its MR as registered
 * then: ibv_rereg_mr meanwhile to another PD (same key), or without
 * IBV_ACCESS_MW_BIND (a new MR on mlx5: new keys), fails it. */
TEST_CASE_METHOD(Type2, "memory windows: a queued bind sees its MR as rereg_mr left it", "[mw]")
{
	struct ibv_pd *other = ibv_alloc_pd(p.ctx);
	REQUIRE(other);
	queue_bind(p, mw, m.mr);
	const uint32_t mr_key = m.mr->lkey;
	SECTION("to another PD")
	{
		REQUIRE(ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0) == 0);
		CHECK(m.mr->lkey == mr_key);
	}
	SECTION("without MW_BIND")
	{
		REQUIRE(ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
				     IBV_ACCESS_LOCAL_WRITE) == 0);
		CHECK(m.mr->lkey != mr_key);
	}
	CHECK(release_queued_bind(p) == IBV_WC_MW_BIND_ERR);
	REQUIRE(ibv_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_PD, p.pd, nullptr, 0, 0) == 0);
	CHECK(dealloc());
	CHECK(ibv_dealloc_pd(other) == 0);
}

/* Slots are reused (after 256 others were freed): a bind queued for a
 * window deallocated since fails, and does not bind the window that took
 * its slot. */
TEST_CASE_METHOD(Type2, "memory windows: a queued bind never binds the window that reused the slot",
		 "[mw]")
{
	queue_bind(p, mw, m.mr);
	const uint32_t slot = mw->rkey >> 8;
	REQUIRE(dealloc());
	std::vector<struct ibv_mw *> others(300);
	for (struct ibv_mw *&w : others) {
		w = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
		REQUIRE(w);
	}
	for (struct ibv_mw *w : others)
		REQUIRE(ibv_dealloc_mw(w) == 0);
	/* The freed slots are taken oldest first: those freed before ours
	 * (by earlier tests of this process), then ours. */
	others.clear();
	for (int i = 0; i < 5000 && (!mw || (mw->rkey >> 8) != slot); i++) {
		if (mw)
			others.push_back(mw);
		mw = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
		REQUIRE(mw);
	}
	REQUIRE((mw->rkey >> 8) == slot);
	CHECK(release_queued_bind(p) == IBV_WC_MW_BIND_ERR); /* not SUCCESS on the new one */
	CHECK(dealloc());
	for (struct ibv_mw *w : others)
		CHECK(ibv_dealloc_mw(w) == 0);
}
