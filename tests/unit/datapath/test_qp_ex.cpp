/* SPDX-License-Identifier: MIT */
/*
 * The ibv_qp_ex posting API, the new opcodes (SEND_WITH_INV, LOCAL_INV,
 * BIND_MW), solicited events and the ibv_cq_ex read_* helpers, over two
 * connected QPs of one process.
 */
#include "loopback.h"

#include <arpa/inet.h>
#include <poll.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstring>

using namespace loopback;

namespace {

constexpr uint64_t rc_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
	IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
	IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
	IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
	IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;

Options rc_options()
{
	Options o;
	o.send_ops = rc_ops;
	return o;
}

uint64_t now_ns(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* An AH on the pair's PD toward its own port (UD: both QPs share it). */
struct ibv_ah *own_port_ah(Pair &p)
{
	struct ibv_ah_attr aa{};
	aa.dlid = p.lid;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(p.pd, &aa);
	REQUIRE(ah);
	return ah;
}

enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr a{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0);
	return a.qp_state;
}

} // namespace

TEST_CASE("qp_ex: every RC builder, with wr_id and wr_flags read at each builder", "[qpex]")
{
	Pair p(rc_options());
	p.connect();
	Side &a = p.a, &b = p.b;
	REQUIRE(Pair::post_recv(b, 500, 4096, 256) == 0);
	REQUIRE(Pair::post_recv(b, 501, 4096 + 256, 256) == 0);
	REQUIRE(Pair::post_recv(b, 502, 4096 + 512, 256) == 0);
	*reinterpret_cast<uint64_t *>(b.at(1024)) = 40;
	std::memcpy(b.at(2048), "read-from-b....", 16);
	std::memcpy(a.at(0), "written-by-a...", 16);
	std::memcpy(a.at(32), "sge-one|", 8);
	std::memcpy(a.at(48), "sge-two|", 8);

	struct ibv_qp_ex *q = a.qpx;
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(0));
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(0), 16);
	q->wr_id = 2;
	ibv_wr_rdma_read(q, b.mr->rkey, b.addr(2048));
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(256), 16);
	q->wr_id = 3;
	ibv_wr_atomic_fetch_add(q, b.mr->rkey, b.addr(1024), 2);
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(512), 8);
	q->wr_id = 4;
	ibv_wr_atomic_cmp_swp(q, b.mr->rkey, b.addr(1024), 42, 7);
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(520), 8);
	q->wr_id = 5;
	q->wr_flags = 0; /* unsignaled: no completion */
	ibv_wr_send(q);
	struct ibv_sge two[2] = {{a.addr(32), 8, a.mr->lkey}, {a.addr(48), 8, a.mr->lkey}};
	ibv_wr_set_sge_list(q, 2, two);
	q->wr_id = 6;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(q, htonl(0xabcd));
	char inl[] = "inline-payload!";
	ibv_wr_set_inline_data(q, inl, 16);
	std::memcpy(inl, "overwritten-now", 16); /* copied at the setter */
	q->wr_id = 7;
	ibv_wr_rdma_write_imm(q, b.mr->rkey, b.addr(3072), htonl(99));
	struct ibv_data_buf bufs[2] = {{(void *)"list-", 5}, {(void *)"inline", 6}};
	ibv_wr_set_inline_data_list(q, 2, bufs);
	REQUIRE(ibv_wr_complete(q) == 0);

	struct {
		uint64_t wr_id;
		enum ibv_wc_opcode opcode;
		uint32_t byte_len;
	} const want[] = {{1, IBV_WC_RDMA_WRITE, 16}, {2, IBV_WC_RDMA_READ, 16},
			  {3, IBV_WC_FETCH_ADD, 8}, {4, IBV_WC_COMP_SWAP, 8},
			  {6, IBV_WC_SEND, 16}, {7, IBV_WC_RDMA_WRITE, 11}};
	for (auto w : want) {
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(a, wc));
		CAPTURE(w.wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.wr_id == w.wr_id);
		CHECK(wc.opcode == w.opcode);
	}
	CHECK(Pair::quiet(a));
	CHECK(std::memcmp(b.at(0), "written-by-a...", 16) == 0);
	CHECK(std::memcmp(a.at(256), "read-from-b....", 16) == 0);
	CHECK(*reinterpret_cast<uint64_t *>(a.at(512)) == 40);
	CHECK(*reinterpret_cast<uint64_t *>(a.at(520)) == 42);
	CHECK(*reinterpret_cast<uint64_t *>(b.at(1024)) == 7);
	CHECK(std::memcmp(b.at(3072), "list-inline", 11) == 0);

	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(b, wc));
	CHECK(wc.wr_id == 500);
	CHECK(wc.byte_len == 16);
	CHECK(std::memcmp(b.at(4096), "sge-one|sge-two|", 16) == 0);
	REQUIRE(Pair::wait_wc(b, wc));
	CHECK(wc.wr_id == 501);
	CHECK((wc.wc_flags & IBV_WC_WITH_IMM));
	CHECK(ntohl(wc.imm_data) == 0xabcd);
	CHECK(std::memcmp(b.at(4096 + 256), "inline-payload!", 16) == 0);
	REQUIRE(Pair::wait_wc(b, wc));
	CHECK(wc.wr_id == 502);
	CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(ntohl(wc.imm_data) == 99);
}

/* Once a batch resolved the target, the next ones take the engine's direct
 * path (lib/datapath.cpp try_direct): inline data copied by the setter, and
 * the responder's key check, must behave as on the first batch. */
TEST_CASE("qp_ex: one-sided WRs to a target resolved by an earlier batch", "[qpex]")
{
	Pair p(rc_options());
	p.connect();
	Side &a = p.a, &b = p.b;
	struct ibv_qp_ex *q = a.qpx;
	std::memcpy(a.at(0), "first-batch-wr!", 16);
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(0));
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(0), 16);
	REQUIRE(ibv_wr_complete(q) == 0);

	char inl[] = "inline-2nd-wr!!";
	ibv_wr_start(q);
	q->wr_id = 2;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(64));
	ibv_wr_set_inline_data(q, inl, 16);
	std::memcpy(inl, "overwritten-now", 16); /* copied at the setter */
	q->wr_id = 3;
	ibv_wr_rdma_read(q, b.mr->rkey ^ 0x80, b.addr(0)); /* no such key */
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(128), 16);
	q->wr_id = 4;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(256));
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(0), 16);
	REQUIRE(ibv_wr_complete(q) == 0);

	struct {
		uint64_t wr_id;
		enum ibv_wc_status status;
	} const want[] = {{1, IBV_WC_SUCCESS}, {2, IBV_WC_SUCCESS}, {3, IBV_WC_REM_ACCESS_ERR},
			  {4, IBV_WC_WR_FLUSH_ERR}};
	for (auto w : want) {
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(a, wc));
		CAPTURE(w.wr_id);
		CHECK(wc.wr_id == w.wr_id);
		CHECK(wc.status == w.status);
	}
	CHECK(std::memcmp(b.at(0), "first-batch-wr!", 16) == 0);
	CHECK(std::memcmp(b.at(64), "inline-2nd-wr!!", 16) == 0);
	CHECK(b.at(256)[0] == 0); /* flushed: never written */
	CHECK(state_of(a.qp) == IBV_QPS_ERR);
}

TEST_CASE("qp_ex: a builder error is latched, wr_complete returns it and posts nothing",
	  "[qpex]")
{
	Options o = rc_options();
	o.max_send_sge = 1;
	o.max_inline = 32;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	struct ibv_qp_attr qa{};
	struct ibv_qp_init_attr qia{};
	REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qia) == 0);
	const uint32_t max_sge = qia.cap.max_send_sge, max_inline = qia.cap.max_inline_data,
		       max_wr = qia.cap.max_send_wr;
	std::vector<struct ibv_sge> sges(max_sge + 1, {a.addr(0), 4, a.mr->lkey});
	std::vector<char> big(max_inline + 1, 'x');
	struct ibv_qp_ex *q = a.qpx;

	struct Case {
		const char *name;
		int err;
		bool first; /* the bad call comes before the good WR */
		void (*bad)(struct ibv_qp_ex *, Side &, std::vector<struct ibv_sge> &,
			    std::vector<char> &, uint32_t);
	} const cases[] = {
		{"too many SGEs", ENOMEM, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &s, std::vector<char> &,
		    uint32_t) {
			 ibv_wr_send(q);
			 ibv_wr_set_sge_list(q, s.size(), s.data());
		 }},
		{"inline data over max_inline_data", ENOMEM, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &d,
		    uint32_t) {
			 ibv_wr_send(q);
			 ibv_wr_set_inline_data(q, d.data(), d.size());
		 }},
		/* libmlx5 checks each length as it adds it: no sum wraps. */
		{"an inline buffer list whose lengths would wrap", ENOMEM, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &d,
		    uint32_t) {
			 const struct ibv_data_buf bufs[] = {{d.data(), SIZE_MAX}, {d.data(), 2}};
			 ibv_wr_send(q);
			 ibv_wr_set_inline_data_list(q, 2, bufs);
		 }},
		{"more WRs than the send queue holds", ENOMEM, false,
		 [](struct ibv_qp_ex *q, Side &s, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t max_wr) {
			 for (uint32_t i = 0; i <= max_wr; i++) {
				 ibv_wr_rdma_write(q, s.mr->rkey, s.addr(0));
				 ibv_wr_set_sge(q, s.mr->lkey, s.addr(0), 4);
			 }
		 }},
		/* libmlx5 would read through these NULLs; an error instead. */
		{"an SGE list that is NULL", EINVAL, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t) {
			 ibv_wr_send(q);
			 ibv_wr_set_sge_list(q, 1, nullptr);
		 }},
		{"inline data from NULL", EINVAL, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t) {
			 ibv_wr_send(q);
			 ibv_wr_set_inline_data(q, nullptr, 4);
		 }},
		{"an inline buffer list that is NULL", EINVAL, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t) {
			 ibv_wr_send(q);
			 ibv_wr_set_inline_data_list(q, 2, nullptr);
		 }},
		{"a setter with no WR built", EINVAL, true,
		 [](struct ibv_qp_ex *q, Side &s, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t) { ibv_wr_set_sge(q, s.mr->lkey, s.addr(0), 4); }},
		{"bind_mw of no window", EINVAL, false,
		 [](struct ibv_qp_ex *q, Side &, std::vector<struct ibv_sge> &, std::vector<char> &,
		    uint32_t) {
			 struct ibv_mw_bind_info info{};
			 ibv_wr_bind_mw(q, nullptr, 0, &info);
		 }},
	};
	for (const Case &c : cases) {
		SECTION(c.name)
		{
			ibv_wr_start(q);
			if (c.first)
				c.bad(q, a, sges, big, max_wr);
			/* A good WR: it must not be posted either. */
			q->wr_id = 77;
			q->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(q, b.mr->rkey, b.addr(0));
			ibv_wr_set_sge(q, a.mr->lkey, a.addr(0), 4);
			if (!c.first)
				c.bad(q, a, sges, big, max_wr);
			CHECK(ibv_wr_complete(q) == c.err);
			CHECK(Pair::quiet(a));
			/* The QP posts normally afterwards. */
			ibv_wr_start(q);
			q->wr_id = 78;
			ibv_wr_rdma_write(q, b.mr->rkey, b.addr(0));
			ibv_wr_set_sge(q, a.mr->lkey, a.addr(0), 4);
			REQUIRE(ibv_wr_complete(q) == 0);
			struct ibv_wc wc{};
			REQUIRE(Pair::wait_wc(a, wc));
			CHECK(wc.wr_id == 78);
			CHECK(wc.status == IBV_WC_SUCCESS);
		}
	}
}

/* The batch keeps its WRs made between batches (QpExBatch): a WR built
 * where an earlier one was must start empty. */
TEST_CASE("qp_ex: a WR built in a later batch carries nothing of an earlier one", "[qpex]")
{
	Pair p(rc_options());
	p.connect();
	Side &a = p.a, &b = p.b;
	struct ibv_qp_ex *q = a.qpx;
	std::memcpy(a.at(0), "sge-first-wr!!!", 16);
	std::memcpy(a.at(64), "sge-second-wr!!", 16);
	std::memcpy(a.at(128), "sge-third-wr!!!", 16);
	char inl[] = "inline-first!!!";
	constexpr uint64_t no_setter = ~0ull;
	auto write = [&](uint64_t wr_id, uint64_t to, const char *data, uint64_t from) {
		ibv_wr_start(q);
		q->wr_id = wr_id;
		q->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(q, b.mr->rkey, b.addr(to));
		if (data)
			ibv_wr_set_inline_data(q, const_cast<char *>(data), 16);
		else if (from != no_setter)
			ibv_wr_set_sge(q, a.mr->lkey, a.addr(from), 16);
		REQUIRE(ibv_wr_complete(q) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.wr_id == wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
	};
	write(1, 0, inl, 0);
	write(2, 64, nullptr, 0);
	write(3, 128, nullptr, 64);
	write(4, 256, inl, 0);
	write(5, 320, nullptr, 128);
	/* No data setter: a WRITE of nothing, not WR 5's SGE again. */
	write(6, 384, nullptr, no_setter);
	write(7, 448, inl, 0);
	write(8, 512, nullptr, no_setter); /* nor WR 7's inline data */
	CHECK(std::memcmp(b.at(0), "inline-first!!!", 16) == 0);
	CHECK(std::memcmp(b.at(64), "sge-first-wr!!!", 16) == 0);
	CHECK(std::memcmp(b.at(128), "sge-second-wr!!", 16) == 0);
	CHECK(std::memcmp(b.at(256), "inline-first!!!", 16) == 0);
	CHECK(std::memcmp(b.at(320), "sge-third-wr!!!", 16) == 0);
	CHECK(b.at(384)[0] == 0);
	CHECK(b.at(512)[0] == 0);
}

TEST_CASE("qp_ex: wr_set_sge after a batch whose WR held more SGEs than fit in place",
	  "[qpex]")
{
	/* A batch's WRs are reused: the first held 6 SGEs (more than a WR
	 * keeps in place, so they went to its heap), the next WR in that
	 * slot takes one SGE from wr_set_sge, which must be the only one. */
	Options o = rc_options();
	o.max_send_sge = 8;
	Pair p(o);
	p.connect();
	Side &a = p.a, &b = p.b;
	struct ibv_qp_ex *q = a.qpx;
	std::memcpy(a.at(0), "six-pieces-of-four-bytes", 24);
	std::memcpy(a.at(64), "one-sge!", 8);
	struct ibv_sge six[6];
	for (int i = 0; i < 6; i++)
		six[i] = {a.addr(size_t(4 * i)), 4, a.mr->lkey};
	auto complete = [&](uint64_t wr_id) {
		REQUIRE(ibv_wr_complete(q) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(a, wc));
		CHECK(wc.wr_id == wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
	};
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(0));
	ibv_wr_set_sge_list(q, 6, six);
	complete(1);
	ibv_wr_start(q);
	q->wr_id = 2;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, b.mr->rkey, b.addr(128));
	ibv_wr_set_sge(q, a.mr->lkey, a.addr(64), 8);
	complete(2);
	CHECK(std::memcmp(b.at(0), "six-pieces-of-four-bytes", 24) == 0);
	CHECK(std::memcmp(b.at(128), "one-sge!", 8) == 0);
	CHECK(b.at(136)[0] == 0);
}

TEST_CASE("qp_ex: wr_abort discards the batch", "[qpex]")
{
	Pair p(rc_options());
	p.connect();
	struct ibv_qp_ex *q = p.a.qpx;
	std::memcpy(p.a.at(0), "abort", 5);
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, p.b.mr->rkey, p.b.addr(0));
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 5);
	ibv_wr_abort(q);
	CHECK(Pair::quiet(p.a));
	CHECK(p.b.buf[0] == 0);
	/* The lock was released: a new batch works. */
	ibv_wr_start(q);
	ibv_wr_rdma_write(q, p.b.mr->rkey, p.b.addr(0));
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 5);
	REQUIRE(ibv_wr_complete(q) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(std::memcmp(p.b.at(0), "abort", 5) == 0);
}

TEST_CASE("qp_ex: ibv_post_send of another thread waits for an open batch", "[qpex][batch]")
{
	Pair p(rc_options());
	p.connect();
	struct ibv_qp_ex *q = p.a.qpx;
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, p.b.mr->rkey, p.b.addr(64));
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 8);
	/* The critical section of ibv_wr_post(3): libmlx5's SQ lock, held
	 * from wr_start to wr_complete, holds the other thread's post off. */
	std::atomic<bool> posted{false};
	int post_err = -1;
	struct ibv_send_wr wr{};
	wr.wr.rdma = {p.b.addr(128), p.b.mr->rkey};
	std::thread other([&] {
		post_err = Pair::post8(p.a, IBV_WR_RDMA_WRITE, 2, wr);
		posted = true;
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(posted.load());
	REQUIRE(ibv_wr_complete(q) == 0);
	other.join();
	CHECK(post_err == 0);
	/* The batch's WR went first. */
	for (uint64_t id : {1, 2}) {
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.wr_id == id);
	}
}

TEST_CASE("qp_ex: inside its own batch a thread's ibv_post_send and wr_start are EINVAL",
	  "[qpex][batch]")
{
	Pair p(rc_options());
	p.connect();
	struct ibv_qp_ex *q = p.a.qpx;
	struct ibv_sge sg = {p.a.addr(0), 8, p.a.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 7;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	wr.wr.rdma = {p.b.addr(64), p.b.mr->rkey};

	/* libmlx5 would spin on its own SQ lock for ever in both. */
	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, p.b.mr->rkey, p.b.addr(64));
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 8);
	CHECK(ibv_post_send(p.a.qp, &wr, &bad) == EINVAL);
	CHECK(bad == &wr);
	ibv_wr_start(q); /* nested: the batch fails */
	CHECK(ibv_wr_complete(q) == EINVAL);
	CHECK(Pair::quiet(p.a));
	/* No batch open any more: EINVAL, and nothing held. */
	CHECK(ibv_wr_complete(q) == EINVAL);
	ibv_wr_abort(q);
	CHECK(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 7);

	/* Another thread's batch is not this thread's to end. */
	std::atomic<int> stage{0};
	int other_err = -1;
	std::thread other([&] {
		ibv_wr_start(q);
		q->wr_id = 3;
		q->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(q, p.b.mr->rkey, p.b.addr(64));
		ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 8);
		stage = 1;
		while (stage.load() != 2)
			std::this_thread::yield();
		other_err = ibv_wr_complete(q);
	});
	while (stage.load() != 1)
		std::this_thread::yield();
	CHECK(ibv_wr_complete(q) == EINVAL);
	ibv_wr_abort(q);
	stage = 2;
	other.join();
	CHECK(other_err == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 3);
}

TEST_CASE("qp_ex: wr_complete in a state that cannot send is EINVAL", "[qpex]")
{
	Pair p(rc_options());
	struct ibv_qp_ex *q = p.a.qpx;
	ibv_wr_start(q);
	ibv_wr_send(q);
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 4);
	CHECK(ibv_wr_complete(q) == EINVAL);
	/* Whatever a builder latched: libmlx5's wr_complete before RTS. */
	std::vector<struct ibv_sge> sges(64, {p.a.addr(0), 4, p.a.mr->lkey});
	ibv_wr_start(q);
	ibv_wr_send(q);
	ibv_wr_set_sge_list(q, sges.size(), sges.data());
	CHECK(ibv_wr_complete(q) == EINVAL);
}

TEST_CASE("qp_ex: the entry points installed follow the QP type", "[qpex]")
{
	SECTION("UD: send, send_imm and set_ud_addr only")
	{
		Options o;
		o.type = IBV_QPT_UD;
		o.send_ops = IBV_QP_EX_WITH_SEND;
		Pair p(o);
		struct ibv_qp_ex *q = p.a.qpx;
		CHECK(q->wr_send);
		CHECK(q->wr_send_imm); /* installed even though not asked for */
		CHECK(q->wr_set_ud_addr);
		CHECK(q->wr_set_sge);
		CHECK(q->wr_set_inline_data_list);
		CHECK_FALSE(q->wr_rdma_write);
		CHECK_FALSE(q->wr_rdma_read);
		CHECK_FALSE(q->wr_send_inv);
		CHECK_FALSE(q->wr_set_xrc_srqn);
	}
	SECTION("UC: no READ, no atomics")
	{
		Options o;
		o.type = IBV_QPT_UC;
		o.send_ops = IBV_QP_EX_WITH_RDMA_WRITE;
		Pair p(o);
		struct ibv_qp_ex *q = p.a.qpx;
		CHECK(q->wr_rdma_write);
		CHECK(q->wr_send_inv);
		CHECK(q->wr_local_inv);
		CHECK_FALSE(q->wr_rdma_read);
		CHECK_FALSE(q->wr_atomic_fetch_add);
		CHECK_FALSE(q->wr_set_ud_addr);
	}
}

TEST_CASE("qp_ex: UD send with wr_set_ud_addr lands after the GRH room", "[qpex]")
{
	Options o;
	o.type = IBV_QPT_UD;
	o.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	Pair p(o);
	p.connect();
	struct ibv_ah *ah = own_port_ah(p);
	REQUIRE(Pair::post_recv(p.b, 9, 0, 40 + 64) == 0);
	std::memcpy(p.a.at(4096), "ud-datagram", 11);
	struct ibv_qp_ex *q = p.a.qpx;
	ibv_wr_start(q);
	q->wr_id = 3;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(q, htonl(5));
	ibv_wr_set_ud_addr(q, ah, p.b.qp->qp_num, 0x1234);
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(4096), 11);
	REQUIRE(ibv_wr_complete(q) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.wr_id == 3);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 9);
	CHECK(wc.byte_len == 40 + 11);
	CHECK(wc.src_qp == p.a.qp->qp_num);
	CHECK(std::memcmp(p.b.at(40), "ud-datagram", 11) == 0);
	ibv_destroy_ah(ah);
}

/* The batch path of a UD send error (lib/datapath.cpp submit): SQE, the
 * rest of the batch flushed, a later batch flushed too (wr_complete
 * succeeds: posting in SQE is allowed), SQE -> RTS sends again. */
TEST_CASE("qp_ex: a UD send error in a batch moves the QP to SQE", "[qpex]")
{
	Options o;
	o.type = IBV_QPT_UD;
	o.send_ops = IBV_QP_EX_WITH_SEND;
	Pair p(o);
	p.connect();
	struct ibv_port_attr pa{};
	REQUIRE(ibv_query_port(p.ctx, 1, &pa) == 0);
	const uint32_t mtu = 128u << pa.active_mtu;
	REQUIRE(mtu < buf_size);
	struct ibv_ah *ah = own_port_ah(p);
	REQUIRE(Pair::post_recv(p.b, 9, 0, 40 + 64) == 0);
	struct ibv_qp_ex *q = p.a.qpx;
	auto build = [&](uint64_t wr_id, uint32_t len) {
		q->wr_id = wr_id;
		q->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(q);
		ibv_wr_set_ud_addr(q, ah, p.b.qp->qp_num, 0x1234);
		ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), len);
	};
	ibv_wr_start(q);
	build(1, 8);
	build(2, mtu + 1);
	build(3, 8);
	REQUIRE(ibv_wr_complete(q) == 0);
	struct ibv_wc wc{};
	for (auto [id, st] : {std::pair{1, IBV_WC_SUCCESS}, {2, IBV_WC_LOC_LEN_ERR},
			      {3, IBV_WC_WR_FLUSH_ERR}}) {
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.wr_id == uint64_t(id));
		CHECK(wc.status == st);
	}
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS));
	CHECK(state_of(p.a.qp) == IBV_QPS_SQE);

	ibv_wr_start(q);
	build(4, 8);
	REQUIRE(ibv_wr_complete(q) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 4 && wc.status == IBV_WC_WR_FLUSH_ERR));

	struct ibv_qp_attr qa{};
	qa.qp_state = IBV_QPS_RTS;
	REQUIRE(ibv_modify_qp(p.a.qp, &qa, IBV_QP_STATE) == 0);
	REQUIRE(Pair::post_recv(p.b, 10, 0, 40 + 64) == 0);
	ibv_wr_start(q);
	build(5, 8);
	REQUIRE(ibv_wr_complete(q) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK((wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS));
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK((wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS));
	ibv_destroy_ah(ah);
}

TEST_CASE("SEND_WITH_INV: the receiver sees IBV_WC_WITH_INV and the key", "[qpex][opcodes]")
{
	Pair p(rc_options());
	p.connect();
	REQUIRE(Pair::post_recv(p.b, 1, 0, 64) == 0);
	REQUIRE(Pair::post_recv(p.b, 2, 64, 64) == 0);
	/* ibv_post_send ... */
	struct ibv_sge s = {p.a.addr(0), 4, p.a.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 10;
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.invalidate_rkey = 0x4242;
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	/* ... and the builder. */
	ibv_wr_start(p.a.qpx);
	p.a.qpx->wr_id = 11;
	p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(p.a.qpx, 0x4343);
	ibv_wr_set_sge(p.a.qpx, p.a.mr->lkey, p.a.addr(0), 4);
	REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
	for (uint32_t key : {0x4242u, 0x4343u}) {
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.opcode == IBV_WC_SEND);
		REQUIRE(Pair::wait_wc(p.b, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.opcode == IBV_WC_RECV);
		CHECK(wc.wc_flags == IBV_WC_WITH_INV);
		CHECK(wc.invalidated_rkey == key);
	}
	/* UD has no SEND_WITH_INV. */
	Options o;
	o.type = IBV_QPT_UD;
	Pair u(o);
	u.connect();
	wr.wr.ud.ah = nullptr;
	s.lkey = u.a.mr->lkey;
	s.addr = u.a.addr(0);
	CHECK(ibv_post_send(u.a.qp, &wr, &bad) == EINVAL);
	CHECK(bad == &wr);
}

/* An RC QP enters ERR, a UC QP SQE (its other send errors' state). */
TEST_CASE("LOCAL_INV of an ibv_reg_mr key: LOC_QP_OP_ERR, the QP enters ERR (UC: SQE)",
	  "[qpex][opcodes]")
{
	const enum ibv_qp_type type = GENERATE(IBV_QPT_RC, IBV_QPT_UC);
	CAPTURE(type);
	Options o = rc_options();
	if (type == IBV_QPT_UC) {
		o.type = IBV_QPT_UC;
		o.send_ops = IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND;
	}
	Pair p(o);
	p.connect();
	SECTION("ibv_post_send")
	{
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 5;
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.invalidate_rkey = p.a.mr->rkey;
		REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	}
	SECTION("wr_local_inv")
	{
		ibv_wr_start(p.a.qpx);
		p.a.qpx->wr_id = 5;
		p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(p.a.qpx, p.a.mr->rkey);
		REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
	}
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 5);
	CHECK(wc.status == IBV_WC_LOC_QP_OP_ERR);
	CHECK(state_of(p.a.qp) == (type == IBV_QPT_RC ? IBV_QPS_ERR : IBV_QPS_SQE));
}

TEST_CASE("IBV_SEND_SOLICITED: a CQ armed solicited-only wakes only for it (or an error)",
	  "[qpex][opcodes]")
{
	Options o = rc_options();
	o.channel = true;
	Pair p(o);
	p.connect();
	for (int i = 0; i < 3; i++)
		REQUIRE(Pair::post_recv(p.b, 100 + i, 64 * i, 64) == 0);
	REQUIRE(ibv_req_notify_cq(p.b.cq, 1) == 0);
	auto fired = [&](int ms) {
		struct pollfd pfd = {p.b.ch->fd, POLLIN, 0};
		return poll(&pfd, 1, ms) == 1;
	};
	auto send = [&](unsigned flags) {
		ibv_wr_start(p.a.qpx);
		p.a.qpx->wr_flags = flags;
		ibv_wr_send(p.a.qpx);
		ibv_wr_set_sge(p.a.qpx, p.a.mr->lkey, p.a.addr(0), 4);
		REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
	};
	send(0);
	CHECK_FALSE(fired(50));
	send(IBV_SEND_SOLICITED);
	REQUIRE(fired(2000));
	struct ibv_cq *cq = nullptr;
	void *cq_ctx = nullptr;
	REQUIRE(ibv_get_cq_event(p.b.ch, &cq, &cq_ctx) == 0);
	CHECK(cq == p.b.cq);
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.b, wc));
	REQUIRE(Pair::wait_wc(p.b, wc));
	/* Armed for "next": an unsolicited completion wakes it too. */
	REQUIRE(ibv_req_notify_cq(p.b.cq, 0) == 0);
	send(0);
	CHECK(fired(2000));
}

TEST_CASE("ibv_cq_ex: read_* over the ring, timestamps on CLOCK_MONOTONIC", "[qpex][cqex]")
{
	Options o = rc_options();
	o.wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
		     IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	Pair p(o);
	p.connect();
	struct ibv_device_attr_ex dx{};
	REQUIRE(ibv_query_device_ex(p.ctx, nullptr, &dx) == 0);
	CHECK(dx.hca_core_clock == 1000000); /* kHz: 1 GHz, ticks are ns */
	REQUIRE(Pair::post_recv(p.b, 33, 0, 64) == 0);
	uint64_t before = now_ns(CLOCK_MONOTONIC), wall_before = now_ns(CLOCK_REALTIME);
	ibv_wr_start(p.a.qpx);
	p.a.qpx->wr_id = 44;
	p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(p.a.qpx, htonl(1234));
	ibv_wr_set_sge(p.a.qpx, p.a.mr->lkey, p.a.addr(0), 24);
	REQUIRE(ibv_wr_complete(p.a.qpx) == 0);
	uint64_t after = now_ns(CLOCK_MONOTONIC), wall_after = now_ns(CLOCK_REALTIME);

	struct ibv_poll_cq_attr pa{};
	int rc = ENOENT;
	for (int i = 0; i < 2000 && rc == ENOENT; i++) {
		rc = ibv_start_poll(p.b.cqx, &pa);
		if (rc == ENOENT)
			std::this_thread::sleep_for(std::chrono::microseconds(500));
	}
	REQUIRE(rc == 0);
	struct ibv_cq_ex *c = p.b.cqx;
	CHECK(c->wr_id == 33);
	CHECK(c->status == IBV_WC_SUCCESS);
	CHECK(ibv_wc_read_opcode(c) == IBV_WC_RECV);
	CHECK(ibv_wc_read_vendor_err(c) == 0);
	CHECK(ibv_wc_read_byte_len(c) == 24);
	CHECK(ntohl(ibv_wc_read_imm_data(c)) == 1234);
	CHECK(ibv_wc_read_qp_num(c) == p.b.qp->qp_num);
	CHECK(ibv_wc_read_src_qp(c) == p.a.qp->qp_num);
	CHECK(ibv_wc_read_wc_flags(c) == IBV_WC_WITH_IMM);
	CHECK(ibv_wc_read_sl(c) == 0);
	CHECK(ibv_wc_read_dlid_path_bits(c) == 0);
	(void)ibv_wc_read_slid(c);
	uint64_t ts = ibv_wc_read_completion_ts(c);
	CHECK(ts >= before);
	CHECK(ts <= after);
	uint64_t wall = ibv_wc_read_completion_wallclock_ns(c);
	CHECK(wall + 1000000 >= wall_before); /* within a millisecond of slack */
	CHECK(wall <= wall_after + 1000000);
	CHECK(ibv_next_poll(c) == ENOENT);
	ibv_end_poll(c);
}

/* An AH is usable only on a QP of its own context (the address is checked
 * against the QP's context: a pointer compare on the fast path). */
TEST_CASE("UD: an AH of another context is EINVAL, in ibv_post_send and wr_set_ud_addr",
	  "[qpex][ah]")
{
	Options o;
	o.type = IBV_QPT_UD;
	o.send_ops = IBV_QP_EX_WITH_SEND;
	Pair p(o);
	p.connect();
	struct ibv_context *other = shmv_test::open_first_device();
	REQUIRE(other);
	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	REQUIRE(other_pd);
	struct ibv_ah_attr aa{};
	aa.dlid = p.lid;
	aa.port_num = 1;
	struct ibv_ah *foreign = ibv_create_ah(other_pd, &aa);
	struct ibv_ah *own = ibv_create_ah(p.pd, &aa);
	REQUIRE((foreign && own));
	REQUIRE(Pair::post_recv(p.b, 1, 0, 40 + 64) == 0);

	struct ibv_sge sg = {p.a.addr(0), 8, p.a.mr->lkey};
	struct ibv_send_wr wr[2]{}, *bad = nullptr;
	for (int i = 0; i < 2; i++) {
		wr[i].wr_id = uint64_t(i + 1);
		wr[i].opcode = IBV_WR_SEND;
		wr[i].send_flags = IBV_SEND_SIGNALED;
		wr[i].sg_list = &sg;
		wr[i].num_sge = 1;
		wr[i].wr.ud.remote_qpn = p.b.qp->qp_num;
		wr[i].wr.ud.remote_qkey = 0x1234;
	}
	wr[0].wr.ud.ah = own;
	wr[0].next = &wr[1];
	wr[1].wr.ud.ah = foreign;
	CHECK(ibv_post_send(p.a.qp, wr, &bad) == EINVAL);
	CHECK(bad == &wr[1]);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc)); /* the first one went */
	CHECK(wc.wr_id == 1);
	CHECK(Pair::quiet(p.a));

	struct ibv_qp_ex *q = p.a.qpx;
	ibv_wr_start(q);
	ibv_wr_send(q);
	ibv_wr_set_ud_addr(q, foreign, p.b.qp->qp_num, 0x1234);
	ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 8);
	CHECK(ibv_wr_complete(q) == EINVAL);
	CHECK(Pair::quiet(p.a));

	ibv_destroy_ah(own);
	ibv_destroy_ah(foreign);
	ibv_dealloc_pd(other_pd);
	ibv_close_device(other);
}

namespace {

/* One signaled `op` (READ or an atomic) to b.addr(1024), by ibv_post_send
 * from the SGEs `sges`; its completion. */
struct ibv_wc post_one_sided(Pair &p, enum ibv_wr_opcode op, std::vector<struct ibv_sge> sges,
			     unsigned int flags = 0, uint64_t add = 5)
{
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 9;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED | flags;
	wr.sg_list = sges.data();
	wr.num_sge = int(sges.size());
	if (op == IBV_WR_RDMA_READ) {
		wr.wr.rdma = {p.b.addr(1024), p.b.mr->rkey};
	} else {
		wr.wr.atomic.remote_addr = p.b.addr(1024);
		wr.wr.atomic.rkey = p.b.mr->rkey;
		wr.wr.atomic.compare_add = add;
	}
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 9);
	return wc;
}

uint64_t u64_at(const char *p)
{
	uint64_t v;
	std::memcpy(&v, p, sizeof(v));
	return v;
}

} // namespace

TEST_CASE("ibv_post_send: each non-empty SGE of an atomic is 8 bytes, as libmlx5 posts it",
	  "[qpex][opcodes]")
{
	/* libmlx5's set_data_ptr_seg_atomic: the device is told 8 bytes at
	 * the SGE's address whatever its length; the response lands whole
	 * in the first. */
	Pair p;
	p.connect();
	const uint64_t start = 100;
	std::memcpy(p.b.at(1024), &start, 8);
	std::memset(p.a.at(0), 0xee, 128);
	const uint32_t lk = p.a.mr->lkey;
	struct ibv_wc wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD, {{p.a.addr(0), 4, lk}});
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.byte_len == 8);
	CHECK(u64_at(p.a.at(0)) == 100);
	wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD,
			    {{p.a.addr(32), 4, lk}, {p.a.addr(48), 4, lk}});
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(u64_at(p.a.at(32)) == 105);
	CHECK(u64_at(p.a.at(48)) == 0xeeeeeeeeeeeeeeeeull); /* the second: untouched */
	wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD,
			    {{p.a.addr(64), 0, lk}, {p.a.addr(80), 2, lk}});
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(u64_at(p.a.at(64)) == 0xeeeeeeeeeeeeeeeeull);
	CHECK(u64_at(p.a.at(80)) == 110);
	CHECK(u64_at(p.b.at(1024)) == 115);
	/* 4 bytes at the MR's end: the 8 the device writes leave it. */
	wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD, {{p.a.addr(buf_size - 4), 4, lk}});
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
	CHECK(u64_at(p.b.at(1024)) == 115);
}

TEST_CASE("an atomic with room for less than its 8-byte response is LOC_LEN_ERR",
	  "[qpex][opcodes]")
{
	Pair p(rc_options());
	p.connect();
	const uint64_t start = 100;
	std::memcpy(p.b.at(1024), &start, 8);
	SECTION("ibv_post_send without an SGE, or with empty ones") {
		const bool none = GENERATE(true, false);
		CAPTURE(none);
		std::vector<struct ibv_sge> sges;
		if (!none)
			sges = {{p.a.addr(0), 0, p.a.mr->lkey}};
		struct ibv_wc wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD, sges);
		CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
	}
	SECTION("the builders keep the SGE's length") {
		struct ibv_qp_ex *q = p.a.qpx;
		ibv_wr_start(q);
		q->wr_id = 9;
		q->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_fetch_add(q, p.b.mr->rkey, p.b.addr(1024), 5);
		ibv_wr_set_sge(q, p.a.mr->lkey, p.a.addr(0), 4);
		REQUIRE(ibv_wr_complete(q) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
	}
	/* The requester's own error: the target is not touched and stays
	 * in RTS. */
	CHECK(u64_at(p.b.at(1024)) == 100);
	CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
	CHECK(state_of(p.b.qp) == IBV_QPS_RTS);
}

TEST_CASE("IBV_SEND_INLINE on a READ or an atomic: the response still lands in the SGEs",
	  "[qpex][opcodes]")
{
	/* ibv_post_send(3): inline is for SEND and RDMA WRITE. Its size is
	 * checked as libmlx5 does (ENOMEM over max_inline_data); the data
	 * then comes back into the SGEs, never lost. */
	Pair p(rc_options());
	p.connect();
	std::memcpy(p.b.at(1024), "read-me-inline!", 16);
	const uint32_t lk = p.a.mr->lkey;
	struct ibv_wc wc =
		post_one_sided(p, IBV_WR_RDMA_READ, {{p.a.addr(0), 16, lk}}, IBV_SEND_INLINE);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.byte_len == 16);
	CHECK(std::memcmp(p.a.at(0), "read-me-inline!", 16) == 0);
	const uint64_t start = 100;
	std::memcpy(p.b.at(1024), &start, 8);
	wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD, {{p.a.addr(64), 8, lk}},
			    IBV_SEND_INLINE);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(u64_at(p.a.at(64)) == 100);
	CHECK(u64_at(p.b.at(1024)) == 105);

	struct ibv_sge big = {p.a.addr(0), Pair::caps(p.a).max_inline_data + 1, lk};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_INLINE;
	wr.sg_list = &big;
	wr.num_sge = 1;
	wr.wr.rdma = {p.b.addr(1024), p.b.mr->rkey};
	CHECK(ibv_post_send(p.a.qp, &wr, &bad) == ENOMEM);

	/* The builders' inline data is no place for a response. */
	struct ibv_qp_ex *q = p.a.qpx;
	ibv_wr_start(q);
	q->wr_id = 10;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(q, p.b.mr->rkey, p.b.addr(1024));
	ibv_wr_set_inline_data(q, p.a.at(256), 16);
	REQUIRE(ibv_wr_complete(q) == 0);
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 10);
	CHECK(wc.status == IBV_WC_LOC_QP_OP_ERR);
	CHECK(state_of(p.a.qp) == IBV_QPS_ERR);
}

TEST_CASE("ibv_post_send: an opcode verbs does not define is EINVAL at that WR",
	  "[qpex][opcodes]")
{
	/* Per type, opcodes refused (libmlx5 knows IBV_WR_RDMA_WRITE to
	 * IBV_WR_DRIVER1; anything else is garbage on any type) and one
	 * taken, posted first in each list. */
	struct Case {
		enum ibv_qp_type type;
		enum ibv_wr_opcode good;
		std::vector<int> refused;
	};
	const Case cases[] = {
		{IBV_QPT_RC, IBV_WR_RDMA_WRITE, {32, 1000, -1, IBV_WR_BIND_MW + 100}},
		{IBV_QPT_UC, IBV_WR_RDMA_WRITE, {IBV_WR_DRIVER1 + 1, 32}},
		{IBV_QPT_UD, IBV_WR_SEND, {IBV_WR_DRIVER1 + 1, -5}},
	};
	for (const Case &c : cases) {
		Options o;
		o.type = c.type;
		Pair p(o);
		p.connect();
		struct ibv_ah *ah = nullptr;
		if (c.type == IBV_QPT_UD) {
			ah = own_port_ah(p);
		}
		uint64_t next_id = 1;
		for (int op : c.refused) {
			CAPTURE(c.type, op);
			if (c.type == IBV_QPT_UD)
				REQUIRE(Pair::post_recv(p.b, 0, 0, 40 + 64) == 0);
			struct ibv_sge sg = {p.a.addr(0), 8, p.a.mr->lkey};
			struct ibv_send_wr wr[2]{}, *bad = nullptr;
			for (int i = 0; i < 2; i++) {
				wr[i].wr_id = next_id + uint64_t(i);
				wr[i].send_flags = IBV_SEND_SIGNALED;
				wr[i].sg_list = &sg;
				wr[i].num_sge = 1;
				wr[i].wr.rdma.remote_addr = p.b.addr(64);
				wr[i].wr.rdma.rkey = p.b.mr->rkey;
				if (ah) {
					wr[i].wr.ud.ah = ah;
					wr[i].wr.ud.remote_qpn = p.b.qp->qp_num;
					wr[i].wr.ud.remote_qkey = 0x1234;
				}
			}
			wr[0].opcode = c.good;
			wr[0].next = &wr[1];
			/* As a C program stores it: in C++ an out-of-range
			 * value cast to the enum is undefined. */
			std::memcpy(&wr[1].opcode, &op, sizeof(op));
			CHECK(ibv_post_send(p.a.qp, wr, &bad) == EINVAL);
			CHECK(bad == &wr[1]);
			struct ibv_wc wc{};
			REQUIRE(Pair::wait_wc(p.a, wc)); /* the WR before it went */
			CHECK(wc.wr_id == next_id);
			CHECK(wc.status == IBV_WC_SUCCESS);
			CHECK(Pair::quiet(p.a));
			next_id += 2;
		}
		if (ah)
			ibv_destroy_ah(ah);
	}
}

TEST_CASE("ibv_post_send: an opcode the QP type cannot carry is posted and fails with "
	  "LOC_QP_OP_ERR",
	  "[qpex][opcodes]")
{
	/* libmlx5 builds the WQE (its only opcode check is its table) and the
	 * device fails it; rxe's requester fails it the same way
	 * (next_opcode: IB_WC_LOC_QP_OP_ERR). The QP then enters ERR (RC)
	 * or SQE (UC, UD), and the WR behind it flushes. */
	struct Case {
		enum ibv_qp_type type;
		enum ibv_wr_opcode good;
		std::vector<enum ibv_wr_opcode> failing;
	};
	const Case cases[] = {
		{IBV_QPT_RC, IBV_WR_RDMA_WRITE, {IBV_WR_TSO, IBV_WR_DRIVER1}},
		{IBV_QPT_UC, IBV_WR_RDMA_WRITE,
		 {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_TSO}},
		{IBV_QPT_UD, IBV_WR_SEND,
		 {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
		  IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND_WITH_INV,
		  IBV_WR_LOCAL_INV, IBV_WR_BIND_MW}},
	};
	for (const Case &c : cases) {
		for (enum ibv_wr_opcode op : c.failing) {
			CAPTURE(c.type, op);
			Options o;
			o.type = c.type;
			Pair p(o);
			p.connect();
			struct ibv_ah *ah = c.type == IBV_QPT_UD ? own_port_ah(p) : nullptr;
			const uint64_t start = 100;
			std::memcpy(p.b.at(64), &start, 8);
			struct ibv_sge sg = {p.a.addr(0), 8, p.a.mr->lkey};
			struct ibv_send_wr wr[2]{}, *bad = nullptr;
			for (int i = 0; i < 2; i++) {
				wr[i].wr_id = uint64_t(i) + 1;
				wr[i].send_flags = IBV_SEND_SIGNALED;
				wr[i].sg_list = &sg;
				wr[i].num_sge = 1;
				if (ah) {
					wr[i].wr.ud.ah = ah;
					wr[i].wr.ud.remote_qpn = p.b.qp->qp_num;
					wr[i].wr.ud.remote_qkey = 0x1234;
				} else {
					wr[i].wr.rdma.remote_addr = p.b.addr(64);
					wr[i].wr.rdma.rkey = p.b.mr->rkey;
				}
			}
			wr[0].opcode = op;
			wr[0].next = &wr[1];
			wr[1].opcode = c.good;
			if (c.type == IBV_QPT_UD)
				REQUIRE(Pair::post_recv(p.b, 0, 0, 40 + 64) == 0);
			REQUIRE(ibv_post_send(p.a.qp, wr, &bad) == 0);
			struct ibv_wc wc{};
			REQUIRE(Pair::wait_wc(p.a, wc));
			CHECK(wc.wr_id == 1);
			CHECK(wc.status == IBV_WC_LOC_QP_OP_ERR);
			REQUIRE(Pair::wait_wc(p.a, wc));
			CHECK(wc.wr_id == 2);
			CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
			CHECK(state_of(p.a.qp) == (c.type == IBV_QPT_RC ? IBV_QPS_ERR : IBV_QPS_SQE));
			/* Nothing reached the target. */
			CHECK(std::memcmp(p.b.at(64), &start, 8) == 0);
			CHECK(Pair::quiet(p.b, 1));
			if (ah)
				ibv_destroy_ah(ah);
		}
	}
}

TEST_CASE("rxe: ibv_post_send refuses at post what librxe's validate_send_wr refuses: EINVAL",
	  "[.rxe][opcodes]")
{
	/* Where libmlx5 says ENOMEM (SGEs, inline) or leaves the WR to the
	 * device (atomic operands). */
	Pair p;
	p.connect();
	const uint64_t start = 100;
	std::memcpy(p.b.at(1024), &start, 8);
	const uint32_t lk = p.a.mr->lkey;
	const struct ibv_qp_cap cap = Pair::caps(p.a);
	std::vector<struct ibv_sge> many(cap.max_send_sge + 1, {p.a.addr(0), 1, lk});
	struct ibv_sge big = {p.a.addr(0), cap.max_inline_data + 1, lk};
	struct ibv_sge four = {p.a.addr(0), 4, lk};
	struct Case {
		const char *what;
		enum ibv_wr_opcode op;
		struct ibv_sge *sg;
		int n;
		unsigned int flags;
		uint64_t remote;
	};
	const Case cases[] = {
		{"SGEs over max_send_sge", IBV_WR_RDMA_WRITE, many.data(), int(many.size()), 0,
		 p.b.addr(1024)},
		{"inline over max_inline_data", IBV_WR_RDMA_WRITE, &big, 1, IBV_SEND_INLINE,
		 p.b.addr(1024)},
		{"an atomic of 4 bytes", IBV_WR_ATOMIC_FETCH_AND_ADD, &four, 1, 0, p.b.addr(1024)},
		{"a misaligned atomic", IBV_WR_ATOMIC_FETCH_AND_ADD, &big, 1, 0, p.b.addr(1028)},
	};
	for (const Case &c : cases) {
		CAPTURE(c.what);
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.opcode = c.op;
		wr.send_flags = IBV_SEND_SIGNALED | c.flags;
		wr.sg_list = c.sg;
		wr.num_sge = c.n;
		if (c.op == IBV_WR_RDMA_WRITE) {
			wr.wr.rdma = {c.remote, p.b.mr->rkey};
		} else {
			wr.wr.atomic.remote_addr = c.remote;
			wr.wr.atomic.rkey = p.b.mr->rkey;
			wr.wr.atomic.compare_add = 1;
		}
		CHECK(ibv_post_send(p.a.qp, &wr, &bad) == EINVAL);
		CHECK(bad == &wr);
	}
	CHECK(Pair::quiet(p.a));
	CHECK(state_of(p.a.qp) == IBV_QPS_RTS);
	CHECK(std::memcmp(p.b.at(1024), &start, 8) == 0);
	/* rxe scatters an atomic's 8 bytes over the SGEs as given. */
	std::memset(p.a.at(0), 0xee, 64);
	struct ibv_wc wc = post_one_sided(p, IBV_WR_ATOMIC_FETCH_AND_ADD,
					  {{p.a.addr(0), 4, lk}, {p.a.addr(32), 4, lk}});
	CHECK(wc.status == IBV_WC_SUCCESS);
	uint32_t lo, hi;
	std::memcpy(&lo, p.a.at(0), 4);
	std::memcpy(&hi, p.a.at(32), 4);
	CHECK((uint64_t(hi) << 32 | lo) == 100);
}

TEST_CASE("a QP's receive WQE leaves out its zero-length SGEs: their keys are never looked at",
	  "[qpex][opcodes]")
{
	/* libmlx5's mlx5_post_recv skips them; an application padding a
	 * fixed array of SGEs with {0, 0, 0} must not have its QP fail. */
	const enum ibv_qp_type type = GENERATE(IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD);
	CAPTURE(type);
	Options o;
	o.type = type;
	Pair p(o);
	p.connect();
	const bool ud = type == IBV_QPT_UD;
	struct ibv_ah *ah = ud ? own_port_ah(p) : nullptr;
	const uint32_t lk = p.b.mr->lkey;
	struct ibv_sge rs[2] = {{0, 0, 0xdeadbe00}, {p.b.addr(1024), 100, lk}};
	struct ibv_recv_wr rwr{}, *rbad = nullptr;
	rwr.wr_id = 77;
	rwr.sg_list = rs;
	rwr.num_sge = 2;
	REQUIRE(ibv_post_recv(p.b.qp, &rwr, &rbad) == 0);
	const uint32_t len = ud ? 10 : 50; /* UD: 40 bytes of GRH area first */
	for (uint32_t i = 0; i < len; i++)
		p.a.buf[i] = char('a' + i % 26);
	struct ibv_sge sg = {p.a.addr(0), len, p.a.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 5;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = p.b.qp->qp_num;
		wr.wr.ud.remote_qkey = 0x1234;
	}
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 77);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.byte_len == 50);
	CHECK(std::memcmp(p.b.at(1024 + (ud ? 40 : 0)), p.a.at(0), len) == 0);
	CHECK(state_of(p.b.qp) == IBV_QPS_RTS);
	if (ah)
		ibv_destroy_ah(ah);
}

TEST_CASE("a message over the port's max_msg_sz is the requester's LOC_LEN_ERR",
	  "[qpex][opcodes]")
{
	/* The device's log_max_msg (ibv_query_port: max_msg_sz, 1 GiB); the
	 * null MR stands for the memory such a message would need. The
	 * limit is checked before anything moves. */
	const enum ibv_qp_type type = GENERATE(IBV_QPT_RC, IBV_QPT_UC);
	const enum ibv_wr_opcode op = GENERATE(IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ);
	if (type == IBV_QPT_UC && op == IBV_WR_RDMA_READ)
		return;
	CAPTURE(type, op);
	Options o;
	o.type = type;
	Pair p(o);
	p.connect();
	struct ibv_port_attr port{};
	REQUIRE(ibv_query_port(p.ctx, 1, &port) == 0);
	REQUIRE(port.max_msg_sz == 1u << 30);
	struct ibv_mr *null_mr = ibv_alloc_null_mr(p.pd);
	REQUIRE(null_mr);
	REQUIRE(Pair::post_recv(p.b, 1, 0, 64) == 0);
	struct ibv_sge sg = {0, port.max_msg_sz + 1, null_mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 3;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	wr.wr.rdma = {p.b.addr(0), p.b.mr->rkey};
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 3);
	CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
	CHECK(state_of(p.a.qp) == (type == IBV_QPT_RC ? IBV_QPS_ERR : IBV_QPS_SQE));
	CHECK(Pair::quiet(p.b)); /* nothing reached the responder */
	ibv_dereg_mr(null_mr);
}

TEST_CASE("RC and UC receive completions carry the sender's LID and SL on InfiniBand",
	  "[qpex][opcodes]")
{
	/* mlx5's CQE gives slid and sl from the packet's LRH for every QP
	 * type (handle_responder), not only UD's. */
	const enum ibv_qp_type type = GENERATE(IBV_QPT_RC, IBV_QPT_UC);
	const enum ibv_wr_opcode op = GENERATE(IBV_WR_SEND, IBV_WR_RDMA_WRITE_WITH_IMM);
	CAPTURE(type, op);
	Options o;
	o.type = type;
	Pair p(o);
	shmv_test::QpPath path;
	path.access = IBV_ACCESS_REMOTE_WRITE;
	path.sl = 5;
	REQUIRE(shmv_test::qp_to_rts(p.a.qp, type, p.b.qp->qp_num, p.lid, path) == 0);
	REQUIRE(shmv_test::qp_to_rts(p.b.qp, type, p.a.qp->qp_num, p.lid, path) == 0);
	REQUIRE(Pair::post_recv(p.b, 8, 0, 64) == 0);
	for (int i = 0; i < 2; i++) { /* the first and a later one (direct path) */
		struct ibv_send_wr wr{};
		wr.wr.rdma = {p.b.addr(256), p.b.mr->rkey};
		REQUIRE(Pair::post8(p.a, op, 1, wr) == 0);
		struct ibv_wc wc{};
		REQUIRE(Pair::wait_wc(p.a, wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
		REQUIRE(Pair::wait_wc(p.b, wc));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.src_qp == p.a.qp->qp_num);
		CHECK(wc.slid == p.lid);
		CHECK(wc.sl == 5);
		REQUIRE(Pair::post_recv(p.b, 9, 0, 64) == 0);
	}
}

