/* SPDX-License-Identifier: MIT */
/*
 * The responder QP's qp_access_flags, with real processes: an RDMA WRITE,
 * READ or atomic that the target QP did not enable fails like a bad rkey
 * (IBV_WC_REM_ACCESS_ERR at the requester, IBV_EVENT_QP_ACCESS_ERR at the
 * responder, both QPs in ERR), as on a ConnectX; UC drops such a WRITE.
 * The test binary re-executes itself as the target ("--target rc|uc
 * <flags>"), which talks over its stdin/stdout and otherwise sits in
 * read(). Every wait is bounded.
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <infiniband/verbs.h>

#include "../common/peer.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t buf_size = 4096;
constexpr uint32_t off_write = 0;     /* target: where WRITEs land */
constexpr uint32_t off_atomic = 1024; /* target: the atomics' word (100) */
constexpr uint32_t off_read = 2048;   /* target: what READs fetch */
constexpr uint32_t off_recv = 3072;   /* target: the WRITE_WITH_IMM's WQE */
constexpr unsigned all_remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC;

using shmv_test::read_line;

/* One end: a QP of `type` whose MR grants every remote access, so that
 * only the QP's own access flags can refuse. */
struct End {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	struct ibv_cq *cq = nullptr;
	struct ibv_qp *qp = nullptr;
	struct ibv_mr *mr = nullptr;
	std::vector<char> buf = std::vector<char>(buf_size);
	uint16_t lid = 0;
	enum ibv_qp_type type;

	explicit End(enum ibv_qp_type t) : type(t)
	{
		ctx = shmv_test::open_first_device();
		pd = ibv_alloc_pd(ctx);
		cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
		NEED((pd && cq));
		struct ibv_qp_init_attr a{};
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = type;
		a.cap.max_send_wr = 8;
		a.cap.max_recv_wr = 8;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		qp = ibv_create_qp(pd, &a);
		mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | all_remote);
		NEED((qp && mr));
		lid = shmv_test::port_lid(ctx);
	}
	~End()
	{
		ibv_destroy_qp(qp);
		ibv_dereg_mr(mr);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
		ibv_close_device(ctx);
	}

	int connect(uint32_t dest, unsigned access)
	{
		shmv_test::QpPath path;
		path.access = access;
		return shmv_test::qp_to_rts(qp, type, dest, lid, path);
	}

	int state()
	{
		struct ibv_qp_attr a{};
		struct ibv_qp_init_attr ia{};
		return ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) ? -1 : int(a.qp_state);
	}

	uint64_t word(uint32_t off)
	{
		uint64_t v;
		std::memcpy(&v, buf.data() + off, 8);
		return v;
	}
};

/*
 * Protocol (lines): the target prints "qpn rkey addr"; the test sends
 * "connect <qpn>", the target connects with the access flags of its command
 * line, posts one receive and prints "ready". Then, one answer each:
 *   "access <flags>" -> RTS->RTS modify of qp_access_flags: "ok <errno>"
 *   "event <ms>"     -> "event <type|none> <qp state>" (bounded wait)
 *   "data"           -> "data <16 bytes at off_write>|<word at off_atomic>"
 */
int target_main(enum ibv_qp_type type, unsigned access)
{
	shmv_test::in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	End e(type);
	std::memcpy(e.buf.data() + off_read, "read-me-please!", 16);
	uint64_t hundred = 100;
	std::memcpy(e.buf.data() + off_atomic, &hundred, 8);
	shmv_test::print_target_address(e.qp->qp_num, e.mr->rkey, e.buf.data());
	std::string line;
	unsigned qpn = 0;
	if (!read_line(stdin, line) || std::sscanf(line.c_str(), "connect %u", &qpn) != 1)
		return 2;
	if (e.connect(qpn, access))
		return 3;
	struct ibv_sge s = {uint64_t(uintptr_t(e.buf.data() + off_recv)), 512, e.mr->lkey};
	struct ibv_recv_wr rwr{}, *bad = nullptr;
	rwr.sg_list = &s;
	rwr.num_sge = 1;
	if (ibv_post_recv(e.qp, &rwr, &bad))
		return 4;
	std::printf("ready\n");
	while (read_line(stdin, line)) {
		unsigned arg = 0;
		if (std::sscanf(line.c_str(), "access %u", &arg) == 1) {
			struct ibv_qp_attr a{};
			a.qp_access_flags = arg;
			std::printf("ok %d\n", ibv_modify_qp(e.qp, &a, IBV_QP_ACCESS_FLAGS));
		} else if (std::sscanf(line.c_str(), "event %u", &arg) == 1) {
			struct pollfd p = {e.ctx->async_fd, POLLIN, 0};
			struct ibv_async_event ev;
			if (poll(&p, 1, int(arg)) == 1 && ibv_get_async_event(e.ctx, &ev) == 0) {
				bool ours = ev.element.qp == e.qp;
				ibv_ack_async_event(&ev);
				std::printf("event %d%s %d\n", int(ev.event_type), ours ? "" : "?",
					    e.state());
			} else {
				std::printf("event none %d\n", e.state());
			}
		} else if (line == "data\n") {
			std::printf("data %.16s|%llu\n", e.buf.data() + off_write,
				    (unsigned long long)e.word(off_atomic));
		} else {
			return 5;
		}
	}
	return 0;
}

struct TargetProc : shmv_test::TargetPeer {
	TargetProc(enum ibv_qp_type type, unsigned access)
		: TargetPeer({"self", "--target", type == IBV_QPT_UC ? "uc" : "rc",
			      std::to_string(access)})
	{
	}
};

/* A connected initiator (granting nothing itself: only the target's flags
 * count) and its target. */
struct Link {
	TargetProc t;
	End n;

	Link(enum ibv_qp_type type, unsigned target_access) : t(type, target_access), n(type)
	{
		REQUIRE(n.connect(t.qpn, 0) == 0);
		REQUIRE(t.ask("connect " + std::to_string(n.qp->qp_num)) == "ready\n");
	}

	/* Posts one signaled WR and returns its completion status. */
	int run(enum ibv_wr_opcode op)
	{
		struct ibv_sge s = {uint64_t(uintptr_t(n.buf.data())), 16, n.mr->lkey};
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.opcode = op;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.imm_data = htonl(7);
		if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			s.length = 8;
			s.addr += 256;
			wr.wr.atomic.remote_addr = t.addr + off_atomic;
			wr.wr.atomic.rkey = t.rkey;
			wr.wr.atomic.compare_add = op == IBV_WR_ATOMIC_CMP_AND_SWP ? 100 : 5;
			wr.wr.atomic.swap = 7;
		} else {
			if (op == IBV_WR_RDMA_READ)
				s.addr += 512;
			wr.wr.rdma.remote_addr = t.addr + (op == IBV_WR_RDMA_READ ? off_read : off_write);
			wr.wr.rdma.rkey = t.rkey;
		}
		std::memcpy(n.buf.data(), "remote-write-ok!", 16);
		if (ibv_post_send(n.qp, &wr, &bad))
			return -1;
		struct ibv_wc wc{};
		int k = shmv_test::poll_one(n.cq, wc);
		return k == 1 ? int(wc.status) : k < 0 ? -2 : -3;
	}

	/* What the operation left where it works, at both ends. */
	std::string effect(enum ibv_wr_opcode op)
	{
		std::string data = t.ask("data");
		switch (op) {
		case IBV_WR_RDMA_READ:
			return std::string(n.buf.data() + 512, strnlen(n.buf.data() + 512, 16)) +
			       " " + data;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			return std::to_string(n.word(256)) + " " + data;
		default:
			return data;
		}
	}
};

struct Op {
	const char *name;
	enum ibv_wr_opcode op;
	unsigned needs;
	const char *done; /* effect() once it ran; "untouched" is every other */
};

const Op ops[] = {
	{"WRITE", IBV_WR_RDMA_WRITE, IBV_ACCESS_REMOTE_WRITE, "data remote-write-ok!|100\n"},
	{"WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM, IBV_ACCESS_REMOTE_WRITE,
	 "data remote-write-ok!|100\n"},
	{"READ", IBV_WR_RDMA_READ, IBV_ACCESS_REMOTE_READ, "read-me-please! data |100\n"},
	{"FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_ACCESS_REMOTE_ATOMIC, "100 data |105\n"},
	{"CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_ACCESS_REMOTE_ATOMIC, "100 data |7\n"},
};

std::string untouched(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ:
		return " data |100\n";
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return "0 data |100\n";
	default:
		return "data |100\n";
	}
}

std::string event_line(int type, int state)
{
	return "event " + (type < 0 ? std::string("none") : std::to_string(type)) + " " +
	       std::to_string(state) + "\n";
}

/* The failure as a ConnectX reports it, and nothing moved. */
void expect_refused(Link &l, const Op &o)
{
	CHECK(l.run(o.op) == IBV_WC_REM_ACCESS_ERR);
	CHECK(l.n.state() == IBV_QPS_ERR);
	CHECK(l.t.ask("event 3000") == event_line(IBV_EVENT_QP_ACCESS_ERR, IBV_QPS_ERR));
	CHECK(l.effect(o.op) == untouched(o.op));
}

void expect_done(Link &l, const Op &o)
{
	CHECK(l.run(o.op) == IBV_WC_SUCCESS);
	CHECK(l.n.state() == IBV_QPS_RTS);
	CHECK(l.effect(o.op) == o.done);
	CHECK(l.t.ask("event 50") == event_line(-1, IBV_QPS_RTS));
}

} // namespace

TEST_CASE("RC: an operation the responder QP did not enable is a remote access error",
	  "[access][process]")
{
	for (const Op &o : ops) {
		CAPTURE(o.name);
		Link l(IBV_QPT_RC, all_remote & ~o.needs);
		expect_refused(l, o);
	}
}

TEST_CASE("RC: the same operations succeed once the responder QP enables them",
	  "[access][process]")
{
	for (const Op &o : ops) {
		CAPTURE(o.name);
		Link l(IBV_QPT_RC, o.needs);
		expect_done(l, o);
	}
}

TEST_CASE("RC: an RTS->RTS modify of the access flags takes effect for the next request",
	  "[access][process]")
{
	for (const Op &o : ops) {
		CAPTURE(o.name);
		{
			INFO("granted by RTS->RTS");
			Link l(IBV_QPT_RC, all_remote & ~o.needs);
			REQUIRE(l.t.ask("access " + std::to_string(all_remote)) == "ok 0\n");
			expect_done(l, o);
		}
		{
			INFO("revoked by RTS->RTS");
			Link l(IBV_QPT_RC, all_remote);
			REQUIRE(l.t.ask("access " + std::to_string(all_remote & ~o.needs)) ==
				"ok 0\n");
			expect_refused(l, o);
		}
	}
}

/* The first request to a target resolves it; the next ones find it cached
 * and take post_send's direct path (lib/datapath.cpp try_direct): the
 * responder's checks must be the same there. */
TEST_CASE("RC: a request refused after one that succeeded to the same target",
	  "[access][process]")
{
	for (const Op &o : ops) {
		CAPTURE(o.name);
		Link l(IBV_QPT_RC, all_remote & ~o.needs);
		/* A request of another kind, which the target QP grants. */
		const enum ibv_wr_opcode warm =
			o.op == IBV_WR_RDMA_READ ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		REQUIRE(l.run(warm) == IBV_WC_SUCCESS);
		const std::string before = l.effect(o.op);
		CHECK(l.run(o.op) == IBV_WC_REM_ACCESS_ERR);
		CHECK(l.n.state() == IBV_QPS_ERR);
		CHECK(l.t.ask("event 3000") == event_line(IBV_EVENT_QP_ACCESS_ERR, IBV_QPS_ERR));
		CHECK(l.effect(o.op) == before);
	}
}

TEST_CASE("UC: a WRITE to a QP without REMOTE_WRITE is dropped, the sender succeeds",
	  "[access][process]")
{
	for (const Op &o : ops) {
		if (o.needs != IBV_ACCESS_REMOTE_WRITE)
			continue;
		CAPTURE(o.name);
		{
			Link l(IBV_QPT_UC, all_remote & ~IBV_ACCESS_REMOTE_WRITE);
			/* The second one finds the target cached (try_direct). */
			for (int i = 0; i < 2; i++)
				CHECK(l.run(o.op) == IBV_WC_SUCCESS);
			CHECK(l.n.state() == IBV_QPS_RTS);
			CHECK(l.effect(o.op) == untouched(o.op));
			CHECK(l.t.ask("event 50") == event_line(-1, IBV_QPS_RTS));
		}
		{
			Link l(IBV_QPT_UC, IBV_ACCESS_REMOTE_WRITE);
			expect_done(l, o);
		}
	}
}

/* unit-access [catch args]; "--target rc|uc <flags>" is the target. */
int main(int argc, char **argv)
{
	if (argc > 3 && std::strcmp(argv[1], "--target") == 0)
		return target_main(std::strcmp(argv[2], "uc") == 0 ? IBV_QPT_UC : IBV_QPT_RC,
				   unsigned(std::strtoul(argv[3], nullptr, 0)));
	return Catch::Session().run(argc, argv);
}
