/* SPDX-License-Identifier: MIT */
/*
 * Memory windows are not offered (binding one is not implemented): the
 * device claims none, as a device without them does, and every entry point
 * answers accordingly (docs/verbs.md, "Memory").
 */
#include "loopback.h"

#include <cerrno>

using namespace loopback;

namespace {

Options mw_options()
{
	Options o;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	return o;
}

/* Stands for a window of this device that some code made up: none can be
 * allocated. */
struct ibv_mw fake_mw(Pair &p, enum ibv_mw_type type)
{
	struct ibv_mw mw{};
	mw.context = p.ctx;
	mw.pd = p.pd;
	mw.rkey = 0x1234500;
	mw.handle = 77;
	mw.type = type;
	return mw;
}

constexpr uint64_t mw_cap_flags =
	IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B;

} // namespace

TEST_CASE("memory windows: the device claims none (max_mw 0, no MEM_WINDOW flag)", "[mw]")
{
	Pair p;
	struct ibv_device_attr a{};
	REQUIRE(ibv_query_device(p.ctx, &a) == 0);
	CHECK(a.max_mw == 0);
	CHECK((a.device_cap_flags & mw_cap_flags) == 0);
	struct ibv_device_attr_ex x{};
	REQUIRE(ibv_query_device_ex(p.ctx, nullptr, &x) == 0);
	CHECK(x.orig_attr.max_mw == 0);
	CHECK((x.device_cap_flags_ex & mw_cap_flags) == 0);
}

TEST_CASE("memory windows: each entry point's errno", "[mw]")
{
	Pair p(mw_options());
	p.connect();
	struct ibv_mw mw1 = fake_mw(p, IBV_MW_TYPE_1), mw2 = fake_mw(p, IBV_MW_TYPE_2);
	struct ibv_mw_bind bind{};
	bind.bind_info.mr = p.a.mr;
	bind.bind_info.addr = p.a.addr(0);
	bind.bind_info.length = 64;
	bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	SECTION("ibv_alloc_mw: EOPNOTSUPP for every type")
	{
		for (int type : {int(IBV_MW_TYPE_1), int(IBV_MW_TYPE_2), 0, 3}) {
			CAPTURE(type);
			errno = 0;
			CHECK(ibv_alloc_mw(p.pd, static_cast<enum ibv_mw_type>(type)) == nullptr);
			CHECK(errno == EOPNOTSUPP);
		}
	}
	SECTION("ibv_dealloc_mw: EOPNOTSUPP")
	{
		CHECK(ibv_dealloc_mw(&mw1) == EOPNOTSUPP);
	}
	SECTION("ibv_bind_mw: EOPNOTSUPP for type 1; type 2 is EINVAL in libibverbs")
	{
		CHECK(ibv_bind_mw(p.a.qp, &mw1, &bind) == EOPNOTSUPP);
		CHECK(ibv_bind_mw(p.a.qp, &mw2, &bind) == EINVAL);
		CHECK(Pair::quiet(p.a)); /* nothing was posted */
	}
	SECTION("ibv_wr_bind_mw: ibv_wr_complete returns EOPNOTSUPP and posts nothing")
	{
		ibv_wr_start(p.a.qpx);
		p.a.qpx->wr_id = 9;
		p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(p.a.qpx, &mw2, 0x1234501, &bind.bind_info);
		CHECK(ibv_wr_complete(p.a.qpx) == EOPNOTSUPP);
		CHECK(Pair::quiet(p.a));
	}
	SECTION("IBV_WR_BIND_MW through ibv_post_send: EINVAL, bad_wr set, nothing posted")
	{
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 8;
		wr.opcode = IBV_WR_BIND_MW;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = &mw2;
		wr.bind_mw.rkey = 0x1234501;
		wr.bind_mw.bind_info = bind.bind_info;
		CHECK(ibv_post_send(p.a.qp, &wr, &bad) == EINVAL);
		CHECK(bad == &wr);
		CHECK(Pair::quiet(p.a));
		struct ibv_qp_attr qa{};
		struct ibv_qp_init_attr ia{};
		REQUIRE(ibv_query_qp(p.a.qp, &qa, IBV_QP_STATE, &ia) == 0);
		CHECK(qa.qp_state == IBV_QPS_RTS);
	}
}
