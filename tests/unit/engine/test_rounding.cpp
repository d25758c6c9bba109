/* SPDX-License-Identifier: MIT */
/*
 * Capacity rounding of the three profiles. The mlx5 vectors are the worked
 * examples of DESIGN-NOTES section 4 (what libmlx5 of rdma-core 44 writes
 * back on a ConnectX-5) plus the limits that follow from the same rules.
 */
#include "profile.h"

#include <catch2/catch.hpp>

#include <cerrno>
#include <sstream>
#include <string>

using namespace shmverbs;

namespace {

const Profile &mlx5 = Profile::get(ProfileKind::Mlx5);
const Profile &rxe = Profile::get(ProfileKind::Rxe);
const Profile &exact = Profile::get(ProfileKind::Exact);

constexpr uint64_t send_and_write = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;

struct SendVector {
	const char *what;
	enum ibv_qp_type type;
	uint32_t wr, sge, inl;
	bool ops_given;
	uint64_t ops;
	bool dci;
	uint32_t want_wr, want_inline;
};

QpSizing sizing(enum ibv_qp_type type, uint32_t swr, uint32_t ssge, uint32_t inl,
		uint32_t rwr = 0, uint32_t rsge = 0, bool srq = false)
{
	QpSizing s{};
	s.qp_type = type;
	s.cap = ibv_qp_cap{swr, rwr, ssge, rsge, inl};
	s.has_srq = srq;
	return s;
}

std::string cap_str(const ibv_qp_cap &c)
{
	std::ostringstream o;
	o << "send " << c.max_send_wr << "/" << c.max_send_sge << "/" << c.max_inline_data
	  << " recv " << c.max_recv_wr << "/" << c.max_recv_sge;
	return o.str();
}

} // namespace

TEST_CASE("mlx5: send queue worked examples of DESIGN-NOTES", "[rounding][mlx5]")
{
	const SendVector vectors[] = {
		{"RC 128,1,0", IBV_QPT_RC, 128, 1, 0, false, 0, false, 128, 60},
		{"RC 100,2,64", IBV_QPT_RC, 100, 2, 64, false, 0, false, 102, 124},
		{"RC 100,1,220", IBV_QPT_RC, 100, 1, 220, false, 0, false, 146, 252},
		{"RC 1000,1,0", IBV_QPT_RC, 1000, 1, 0, false, 0, false, 1024, 60},
		{"RC send+write only", IBV_QPT_RC, 128, 1, 0, true, send_and_write, false, 128, 28},
		{"UD 128,1,0", IBV_QPT_UD, 128, 1, 0, false, 0, false, 128, 60},
		{"XRC_SEND 128,1,0", IBV_QPT_XRC_SEND, 128, 1, 0, false, 0, false, 128, 44},
		{"DCI 128,1,0", IBV_QPT_DRIVER, 128, 1, 0, false, 0, true, 128, 12},
		/* The same rules elsewhere: UC has RC's opcodes, an empty
		 * opcode set leaves only the control segment. */
		{"UC 128,1,0", IBV_QPT_UC, 128, 1, 0, false, 0, false, 128, 60},
		{"RC no opcodes", IBV_QPT_RC, 128, 1, 0, true, 0, false, 128, 44},
		{"RC atomics", IBV_QPT_RC, 10, 1, 0, true, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
		 false, 16, 12},
		{"UD with send ops", IBV_QPT_UD, 64, 2, 0, true, IBV_QP_EX_WITH_SEND, false, 64, 60},
	};
	for (const SendVector &v : vectors) {
		INFO(v.what);
		QpSizing s = sizing(v.type, v.wr, v.sge, v.inl, 0, 0);
		s.send_ops_given = v.ops_given;
		s.send_ops_flags = v.ops;
		s.is_dci = v.dci;
		QpCaps out{};
		REQUIRE(mlx5.size_qp(s, out) == 0);
		CHECK(out.created.max_send_wr == v.want_wr);
		CHECK(out.created.max_inline_data == v.want_inline);
		CHECK(out.created.max_send_sge == v.sge); /* returned unchanged */
		CHECK(out.queried.max_send_wr == v.want_wr);
		CHECK(out.queried.max_inline_data == v.want_inline);
	}
}

TEST_CASE("mlx5: receive queue rounding", "[rounding][mlx5]")
{
	struct {
		uint32_t wr, sge, want_wr, want_sge;
	} vectors[] = {
		{100, 3, 128, 4}, {1, 1, 4, 1},  {1, 0, 4, 1},     {3, 2, 4, 2},
		{2, 4, 2, 4},     {1, 4, 1, 4},  {5, 32, 8, 32},   {32768, 1, 32768, 1},
		{0, 5, 0, 0}, /* no receive queue at all */
	};
	for (const auto &v : vectors) {
		INFO("recv " << v.wr << "," << v.sge);
		QpCaps out{};
		REQUIRE(mlx5.size_qp(sizing(IBV_QPT_RC, 1, 1, 0, v.wr, v.sge), out) == 0);
		CHECK(out.created.max_recv_wr == v.want_wr);
		CHECK(out.created.max_recv_sge == v.want_sge);
		CHECK(out.queried.max_recv_wr == v.want_wr);
		CHECK(out.queried.max_recv_sge == v.want_sge);
	}
}

TEST_CASE("mlx5: an SRQ user has no receive queue, but its limit is still checked",
	  "[rounding][mlx5]")
{
	QpCaps out{};
	REQUIRE(mlx5.size_qp(sizing(IBV_QPT_RC, 16, 1, 0, 100, 1000, true), out) == 0);
	CHECK(out.created.max_recv_wr == 0);
	CHECK(out.created.max_recv_sge == 0);
	CHECK(out.queried.max_recv_wr == 0);
	CHECK(mlx5.size_qp(sizing(IBV_QPT_RC, 16, 1, 0, 32769, 1, true), out) == EINVAL);
}

TEST_CASE("mlx5: without a send queue the send request comes back as asked", "[rounding][mlx5]")
{
	QpCaps out{};
	REQUIRE(mlx5.size_qp(sizing(IBV_QPT_RC, 0, 3, 100, 1, 1), out) == 0);
	CHECK(cap_str(out.created) == "send 0/3/100 recv 4/1");
	/* ...but a query reports no send capacity. */
	CHECK(cap_str(out.queried) == "send 0/0/0 recv 4/1");
	/* Nothing of the send request is checked then. */
	CHECK(mlx5.size_qp(sizing(IBV_QPT_RC, 0, 1000, 5000), out) == 0);
}

TEST_CASE("mlx5: XRC QPs report no receive queue in a query", "[rounding][mlx5]")
{
	QpCaps out{};
	REQUIRE(mlx5.size_qp(sizing(IBV_QPT_XRC_SEND, 10, 1, 0, 10, 1), out) == 0);
	/* libmlx5 writes back what it sized although the kernel made none. */
	CHECK(out.created.max_recv_wr == 16);
	CHECK(out.queried.max_recv_wr == 0);
	CHECK(out.queried.max_recv_sge == 0);
}

TEST_CASE("mlx5: requests beyond the device are EINVAL", "[rounding][mlx5]")
{
	struct {
		const char *what;
		QpSizing s;
		int want;
	} vectors[] = {
		/* gather list: (1024 - 192) / 16 = 52 entries for RC */
		{"RC 52 send sges", sizing(IBV_QPT_RC, 1, 52, 0), 0},
		{"RC 53 send sges", sizing(IBV_QPT_RC, 1, 53, 0), EINVAL},
		{"UD 60 send sges", sizing(IBV_QPT_UD, 1, 60, 0), 0},
		{"UD 61 send sges", sizing(IBV_QPT_UD, 1, 61, 0), EINVAL},
		/* inline: a 1024-byte descriptor */
		{"RC inline 828", sizing(IBV_QPT_RC, 1, 1, 828), 0},
		{"RC inline 829", sizing(IBV_QPT_RC, 1, 1, 829), EINVAL},
		{"RC inline 4G", sizing(IBV_QPT_RC, 1, 1, 0xffffffffu), EINVAL},
		/* send queue: 32768 blocks of 64 bytes */
		{"RC 8192 WRs (256-byte WQE)", sizing(IBV_QPT_RC, 8192, 1, 0), 0},
		{"RC 8193 WRs", sizing(IBV_QPT_RC, 8193, 1, 0), EINVAL},
		{"RC max_qp_wr", sizing(IBV_QPT_RC, 32768, 1, 0), EINVAL},
		{"UD 16384 WRs (128-byte WQE)", sizing(IBV_QPT_UD, 16384, 1, 0), 0},
		{"UD 16385 WRs", sizing(IBV_QPT_UD, 16385, 1, 0), EINVAL},
		{"RC 4G WRs", sizing(IBV_QPT_RC, 0xffffffffu, 1, 0), EINVAL},
		/* receive queue: max_qp_wr entries, 512-byte descriptors */
		{"32768 recv WRs", sizing(IBV_QPT_RC, 1, 1, 0, 32768, 1), 0},
		{"32769 recv WRs", sizing(IBV_QPT_RC, 1, 1, 0, 32769, 1), EINVAL},
		{"32 recv sges", sizing(IBV_QPT_RC, 1, 1, 0, 1, 32), 0},
		{"33 recv sges", sizing(IBV_QPT_RC, 1, 1, 0, 1, 33), EINVAL},
		{"4G recv sges", sizing(IBV_QPT_RC, 1, 1, 0, 1, 0xffffffffu), EINVAL},
	};
	for (auto &v : vectors) {
		INFO(v.what);
		QpCaps out{};
		CHECK(mlx5.size_qp(v.s, out) == v.want);
	}
}

TEST_CASE("mlx5: CQ and SRQ sizes", "[rounding][mlx5]")
{
	struct {
		uint32_t cqe;
		int err;
		uint32_t want;
	} cqs[] = {{1, 0, 1},	     {100, 0, 127},	{128, 0, 255},
		   {127, 0, 127},    {4194303, 0, 4194303}, {0, EINVAL, 0},
		   {4194304, EINVAL, 0}};
	for (const auto &v : cqs) {
		INFO("cqe " << v.cqe);
		uint32_t out = 0;
		CHECK(mlx5.size_cq(v.cqe, out) == v.err);
		if (!v.err)
			CHECK(out == v.want);
	}

	struct {
		uint32_t wr, sge;
		int err;
		uint32_t want_wr, want_sge;
	} srqs[] = {
		{1, 1, 0, 1, 1},	 {100, 2, 0, 127, 3},	 {128, 4, 0, 255, 7},
		{16383, 1, 0, 16383, 1}, {16384, 1, 0, 32767, 1}, {32767, 31, 0, 32767, 31},
		{32768, 1, EINVAL, 0, 0}, {1, 32, EINVAL, 0, 0},
	};
	for (const auto &v : srqs) {
		INFO("srq " << v.wr << "," << v.sge);
		uint32_t wr = 0, sge = 0;
		CHECK(mlx5.size_srq(v.wr, v.sge, wr, sge) == v.err);
		if (!v.err) {
			CHECK(wr == v.want_wr);
			CHECK(sge == v.want_sge);
		}
	}
}

TEST_CASE("rxe: every queue is 2^k - 1, send SGEs and inline fill one WQE", "[rounding][rxe]")
{
	struct {
		ibv_qp_cap in;
		bool srq;
		const char *want;
	} vectors[] = {
		{{128, 100, 1, 3, 0}, false, "send 255/1/16 recv 127/3"},
		{{100, 1, 2, 1, 64}, false, "send 127/4/64 recv 1/1"},
		{{1, 0, 0, 0, 0}, false, "send 1/0/0 recv 0/0"},
		{{0, 1, 1, 1, 0}, false, "send 0/1/16 recv 1/1"},
		{{16384, 16384, 32, 32, 400}, false, "send 32767/32/512 recv 32767/32"},
		{{10, 100000, 1, 100, 0}, true, "send 15/1/16 recv 0/0"},
	};
	for (const auto &v : vectors) {
		QpSizing s{};
		s.qp_type = IBV_QPT_RC;
		s.cap = v.in;
		s.has_srq = v.srq;
		QpCaps out{};
		INFO(cap_str(v.in));
		REQUIRE(rxe.size_qp(s, out) == 0);
		CHECK(cap_str(out.created) == v.want);
		CHECK(cap_str(out.queried) == v.want);
	}
	struct {
		ibv_qp_cap in;
	} bad[] = {{{16385, 1, 1, 1, 0}}, {{1, 16385, 1, 1, 0}}, {{1, 1, 33, 1, 0}},
		   {{1, 1, 1, 33, 0}},	  {{1, 1, 1, 1, 401}}};
	for (const auto &v : bad) {
		INFO(cap_str(v.in));
		QpSizing s{};
		s.qp_type = IBV_QPT_UD;
		s.cap = v.in;
		QpCaps out{};
		CHECK(rxe.size_qp(s, out) == EINVAL);
	}

	uint32_t cqe = 0;
	CHECK(rxe.size_cq(1, cqe) == 0);
	CHECK(cqe == 1);
	CHECK(rxe.size_cq(100, cqe) == 0);
	CHECK(cqe == 127);
	CHECK(rxe.size_cq(32767, cqe) == 0);
	CHECK(cqe == 32767);
	CHECK(rxe.size_cq(32768, cqe) == EINVAL);
	CHECK(rxe.size_cq(0, cqe) == EINVAL);

	uint32_t wr = 0, sge = 0;
	CHECK(rxe.size_srq(100, 3, wr, sge) == 0);
	CHECK(wr == 127);
	CHECK(sge == 3);
	CHECK(rxe.size_srq(0x4001, 1, wr, sge) == EINVAL);
	CHECK(rxe.size_srq(1, 28, wr, sge) == EINVAL);
}

TEST_CASE("exact: capacities come back as asked, mlx5's limits still hold", "[rounding][exact]")
{
	QpCaps out{};
	REQUIRE(exact.size_qp(sizing(IBV_QPT_RC, 100, 2, 64, 100, 3), out) == 0);
	CHECK(cap_str(out.created) == "send 100/2/64 recv 100/3");
	CHECK(cap_str(out.queried) == "send 100/2/64 recv 100/3");
	REQUIRE(exact.size_qp(sizing(IBV_QPT_RC, 100, 2, 64, 100, 3, true), out) == 0);
	CHECK(cap_str(out.created) == "send 100/2/64 recv 0/0");
	REQUIRE(exact.size_qp(sizing(IBV_QPT_XRC_SEND, 7, 1, 0, 5, 1), out) == 0);
	CHECK(cap_str(out.created) == "send 7/1/0 recv 0/0");

	CHECK(exact.size_qp(sizing(IBV_QPT_RC, 32768, 1, 0), out) == EINVAL);
	CHECK(exact.size_qp(sizing(IBV_QPT_RC, 1, 53, 0), out) == EINVAL);
	CHECK(exact.size_qp(sizing(IBV_QPT_RC, 1, 1, 0, 32769, 1), out) == EINVAL);

	uint32_t cqe = 0;
	CHECK(exact.size_cq(100, cqe) == 0);
	CHECK(cqe == 100);
	uint32_t wr = 0, sge = 0;
	CHECK(exact.size_srq(100, 3, wr, sge) == 0);
	CHECK(wr == 100);
	CHECK(sge == 3);
}
