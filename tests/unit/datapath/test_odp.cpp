/* SPDX-License-Identifier: MIT */
/*
 * On-demand paging (lib/mr.h): ODP MRs over memory that comes and goes, in
 * one process (a loopback pair: the target memory is our own) and with a
 * real target process (this binary re-executed with "--target"). A page no
 * access reaches (not mapped, or protected) is an error completion, never a
 * crash, on either side.
 * Every wait is bounded.
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include "../common/fixtures.h"
#include "../common/seccomp.h"
#include "loopback.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

const size_t page = size_t(sysconf(_SC_PAGESIZE));

constexpr unsigned odp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				IBV_ACCESS_ON_DEMAND;

/* Pages of anonymous memory, some of which a test unmaps or protects. */
struct Area {
	char *p = nullptr;
	size_t n;
	std::set<size_t> holes;

	explicit Area(size_t pages = 4) : n(pages * page)
	{
		void *m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		NEED(m != MAP_FAILED);
		p = static_cast<char *>(m);
	}
	~Area()
	{
		/* Page by page: a hole may be another mapping's by now. */
		for (size_t pg = 0; pg < n / page; pg++)
			if (!holes.count(pg))
				munmap(p + pg * page, page);
	}
	Area(const Area &) = delete;
	Area &operator=(const Area &) = delete;

	char *at(size_t off) { return p + off; }
	uint64_t addr(size_t off) { return uint64_t(uintptr_t(p + off)); }
	/* A hole, for a registration only: another mapping of this process
	 * (the allocator's, under ASan) may land in it. */
	void unmap(size_t pg)
	{
		NEED(munmap(p + pg * page, page) == 0);
		holes.insert(pg);
	}
	/* A page no access reaches (what a fault cannot resolve), and back. */
	void block(size_t pg) { NEED(mprotect(p + pg * page, page, PROT_NONE) == 0); }
	void unblock(size_t pg) { NEED(mprotect(p + pg * page, page, PROT_READ | PROT_WRITE) == 0); }
	void read_only(size_t pg) { NEED(mprotect(p + pg * page, page, PROT_READ) == 0); }
};

struct Mr {
	struct ibv_mr *mr;
	explicit Mr(struct ibv_mr *m) : mr(m) { NEED(mr); }
	~Mr() { ibv_dereg_mr(mr); }
	Mr(const Mr &) = delete;
	Mr &operator=(const Mr &) = delete;
	struct ibv_mr *operator->() const { return mr; }
};

/* One signaled WR of one SGE; the remote part from `raddr`/`rkey`. */
int post(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t laddr, uint32_t len, uint32_t lkey,
	 uint64_t raddr = 0, uint32_t rkey = 0, uint64_t compare_add = 0)
{
	struct ibv_send_wr wr{};
	wr.wr_id = 1;
	wr.opcode = op;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = compare_add;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return shmv_test::post_send_sge(qp, wr, {laddr, len, lkey});
}

/* The status of the next completion of `cq` (-1: none in time). */
int next_status(struct ibv_cq *cq)
{
	struct ibv_wc wc{};
	return shmv_test::wait_wc(cq, wc) ? int(wc.status) : -1;
}

bool odp_offered(struct ibv_context *ctx)
{
	struct ibv_device_attr_ex attr{};
	NEED(ibv_query_device_ex(ctx, nullptr, &attr) == 0);
	return attr.odp_caps.general_caps & IBV_ODP_SUPPORT;
}

/* ---- The target process ---- */

/*
 * Protocol (lines): the target prints "qpn rkey addr" of an ODP MR over four
 * pages whose page 1 no access reaches (PROT_NONE); the test sends
 * "connect <qpn>"; the target posts a receive into page 2 and prints
 * "ready"; then "show <off>" prints "data <16 bytes at off>", "recv" prints
 * "wc <status> <byte_len>" of its receive completion, "ping" prints "pong".
 */
int target_main()
{
	shmv_test::in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	struct ibv_context *ctx = shmv_test::open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
	NEED((pd && cq));
	struct ibv_qp_init_attr qa{};
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	NEED(qp);
	Area area;
	std::memcpy(area.at(3 * page), "read-me-please!", 16);
	area.block(1);
	Mr mr(ibv_reg_mr(pd, area.p, area.n, odp_access));
	shmv_test::print_target_address(qp->qp_num, mr->rkey, area.p);
	std::string line;
	unsigned qpn = 0;
	if (!shmv_test::read_line(stdin, line) || std::sscanf(line.c_str(), "connect %u", &qpn) != 1)
		return 2;
	shmv_test::QpPath path;
	path.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (shmv_test::qp_to_rts(qp, IBV_QPT_RC, qpn, shmv_test::port_lid(ctx), path))
		return 3;
	if (shmv_test::post_recv_sge(qp, {area.addr(2 * page), 64, mr->lkey}, 7))
		return 4;
	std::printf("ready\n");
	while (shmv_test::read_line(stdin, line)) {
		unsigned off = 0;
		if (std::sscanf(line.c_str(), "show %u", &off) == 1) {
			std::printf("data %.16s\n", area.at(off));
		} else if (line == "recv\n") {
			struct ibv_wc wc{};
			if (!shmv_test::wait_wc(cq, wc))
				return 5;
			std::printf("wc %d %u\n", int(wc.status), wc.byte_len);
		} else if (line == "ping\n") {
			std::printf("pong\n");
		}
	}
	return 0;
}

struct TargetProc : shmv_test::TargetPeer {
	TargetProc() : TargetPeer({"self", "--target"}) {}
};

} // namespace

/* unit-odp [--target | --seccomp] [catch args]: --seccomp blocks
 * process_vm_readv/writev with a real seccomp filter first (skipped with a
 * message where filters cannot be installed) and runs the [seccomp] case. */
int main(int argc, char **argv)
{
	if (argc > 1 && std::strcmp(argv[1], "--target") == 0)
		return target_main();
	if (argc > 1 && std::strcmp(argv[1], "--seccomp") == 0) {
		if (int err = shmv_test::block_cma_with_seccomp()) {
			std::printf("cannot install a seccomp filter here (%s): skipped\n",
				    std::strerror(err));
			return 77; /* meson: skipped */
		}
		argv[1] = argv[0];
		return Catch::Session().run(argc - 1, argv + 1);
	}
	return Catch::Session().run(argc, argv);
}

TEST_CASE("ODP: the mlx5 profile reports a ConnectX-5's caps", "[odp]")
{
	shmv_test::OpenDevice dev;
	struct ibv_device_attr_ex attr{};
	REQUIRE(ibv_query_device_ex(dev.ctx, nullptr, &attr) == 0);
	CHECK(attr.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
	const uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
			    IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_SRQ_RECV;
	CHECK(attr.odp_caps.per_transport_caps.rc_odp_caps == rc);
	CHECK(attr.odp_caps.per_transport_caps.uc_odp_caps == 0);
	CHECK(attr.odp_caps.per_transport_caps.ud_odp_caps == IBV_ODP_SUPPORT_SEND);
	CHECK(attr.xrc_odp_caps == (rc & ~uint32_t(IBV_ODP_SUPPORT_RECV)));
}

TEST_CASE("ODP registration: no page needs to be there, implicit ODP, libibverbs' and "
	  "mlx5_ib's errnos",
	  "[odp]")
{
	shmv_test::DeviceWithPd dev;
	struct ibv_pd *pd = dev.pd;

	SECTION("over address space with nothing mapped") {
		Area area(4);
		area.unmap(1);
		area.unmap(2);
		errno = 0;
		CHECK_FALSE(ibv_reg_mr(pd, area.at(page), 2 * page, IBV_ACCESS_LOCAL_WRITE));
		CHECK(errno == EFAULT);
		Mr mr(ibv_reg_mr(pd, area.at(page), 2 * page, odp_access));
		CHECK(mr->addr == area.at(page));
		CHECK(mr->length == 2 * page);
		/* A new translation of an ODP MR need not be mapped either. */
		Area other(3);
		other.unmap(1);
		CHECK(ibv_rereg_mr(mr.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.at(page),
				   page, 0) == 0);
	}
	SECTION("a plain MR made ODP by ibv_rereg_mr") {
		Area area(1);
		Mr mr(ibv_reg_mr(pd, area.p, area.n, IBV_ACCESS_LOCAL_WRITE));
		struct ibv_sge s = {area.addr(0), 64, mr->lkey};
		const uint32_t flush = IBV_ADVISE_MR_FLAG_FLUSH;
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, flush, &s, 1) == ENOENT);
		CHECK(ibv_rereg_mr(mr.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
				   odp_access) == 0);
		s.lkey = mr->lkey;
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, flush, &s, 1) == 0);
	}
	SECTION("implicit: the whole address space from 0") {
		Mr mr(ibv_reg_mr(pd, nullptr, SIZE_MAX, odp_access));
		CHECK(mr->addr == nullptr);
		CHECK(mr->length == SIZE_MAX);
		CHECK(mr->lkey != 0);
	}
	SECTION("refusals") {
		errno = 0;
		CHECK_FALSE(ibv_reg_mr(pd, reinterpret_cast<void *>(page), SIZE_MAX, odp_access));
		CHECK(errno == EINVAL); /* libibverbs: implicit means from 0 */
		errno = 0;
		CHECK_FALSE(ibv_reg_mr_iova(pd, nullptr, SIZE_MAX, page, odp_access));
		CHECK(errno == EINVAL); /* mlx5_ib: implicit at iova 0 */
		errno = 0;
		CHECK_FALSE(ibv_reg_mr(pd, nullptr, SIZE_MAX, odp_access | IBV_ACCESS_HUGETLB));
		CHECK(errno == EINVAL);
		errno = 0;
		CHECK_FALSE(ibv_reg_mr(pd, reinterpret_cast<void *>(UINT64_MAX - page + 1), 2 * page,
				       odp_access));
		CHECK(errno == EOVERFLOW); /* ib_umem_odp_get */
		errno = 0;
		CHECK_FALSE(ibv_reg_mr(pd, reinterpret_cast<void *>(page), page,
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND));
		CHECK(errno == EINVAL); /* remote write without local write */
	}
}

TEST_CASE("ibv_advise_mr: mlx5_ib's checks, and a prefetch faults the pages in", "[odp]")
{
	shmv_test::DeviceWithPd dev;
	struct ibv_pd *pd = dev.pd;
	std::unique_ptr<struct ibv_pd, int (*)(struct ibv_pd *)> other(ibv_alloc_pd(dev.ctx),
									&ibv_dealloc_pd);
	struct ibv_pd *other_pd = other.get();
	REQUIRE(other_pd);
	Area area(4);
	area.block(2);
	area.read_only(3);
	Mr odp(ibv_reg_mr(pd, area.p, area.n, odp_access));
	Mr read_only(ibv_reg_mr(pd, area.p, area.n, IBV_ACCESS_ON_DEMAND));
	std::vector<char> heap(page);
	Mr plain(ibv_reg_mr(pd, heap.data(), heap.size(), IBV_ACCESS_LOCAL_WRITE));
	const auto prefetch = IBV_ADVISE_MR_ADVICE_PREFETCH;
	const auto write = IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	const auto no_fault = IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT;
	const uint32_t flush = IBV_ADVISE_MR_FLAG_FLUSH;
	struct ibv_sge mapped = {area.addr(0), uint32_t(2 * page), odp->lkey};
	struct ibv_sge hole = {area.addr(2 * page), uint32_t(page), odp->lkey};
	struct ibv_sge read_only_page = {area.addr(3 * page), uint32_t(page), odp->lkey};

	CHECK(ibv_advise_mr(pd, prefetch, 2, &mapped, 1) == EINVAL);
	CHECK(ibv_advise_mr(pd, prefetch, flush, &mapped, 0) == EINVAL);
	std::vector<struct ibv_sge> many(4096, mapped);
	CHECK(ibv_advise_mr(pd, prefetch, flush, many.data(), 4096) == EINVAL);
	CHECK(ibv_advise_mr(pd, prefetch, flush, many.data(), 4095) == 0);
	CHECK(ibv_advise_mr(pd, ibv_advise_mr_advice(3), flush, &mapped, 1) == EOPNOTSUPP);
	struct ibv_sge not_odp = {uint64_t(uintptr_t(heap.data())), 64, plain->lkey};
	CHECK(ibv_advise_mr(pd, prefetch, flush, &not_odp, 1) == ENOENT);
	struct ibv_sge no_key = {area.addr(0), 64, odp->lkey + 0x100000};
	CHECK(ibv_advise_mr(pd, prefetch, flush, &no_key, 1) == ENOENT);
	CHECK(ibv_advise_mr(other_pd, prefetch, flush, &mapped, 1) == EPERM);
	struct ibv_sge ro = {area.addr(0), 64, read_only->lkey};
	CHECK(ibv_advise_mr(pd, write, flush, &ro, 1) == EPERM);
	CHECK(ibv_advise_mr(pd, prefetch, flush, &ro, 1) == 0);
	/* ib_access_writable(): MW_BIND makes an MR writable too. */
	Mr bind_only(ibv_reg_mr(pd, area.p, area.n, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_MW_BIND));
	struct ibv_sge bo = {area.addr(0), 64, bind_only->lkey};
	CHECK(ibv_advise_mr(pd, write, flush, &bo, 1) == 0);
	struct ibv_sge outside = {area.addr(0), uint32_t(area.n + 1), odp->lkey};
	CHECK(ibv_advise_mr(pd, prefetch, flush, &outside, 1) == EFAULT);
	/* A page that cannot be had: an error only for a synchronous
	 * prefetch that faults. */
	CHECK(ibv_advise_mr(pd, prefetch, flush, &hole, 1) == EFAULT);
	CHECK(ibv_advise_mr(pd, write, flush, &hole, 1) == EFAULT);
	CHECK(ibv_advise_mr(pd, no_fault, flush, &hole, 1) == 0);
	CHECK(ibv_advise_mr(pd, write, 0, &hole, 1) == 0);
	CHECK(ibv_advise_mr(pd, prefetch, flush, &read_only_page, 1) == 0);
	CHECK(ibv_advise_mr(pd, write, flush, &read_only_page, 1) == EPERM);
	/* The key checks are synchronous either way. */
	CHECK(ibv_advise_mr(pd, prefetch, 0, &not_odp, 1) == ENOENT);

	/* A write prefetch makes untouched pages present. */
	Area fresh(2);
	Mr mf(ibv_reg_mr(pd, fresh.p, fresh.n, odp_access));
	struct ibv_sge both = {fresh.addr(0), uint32_t(fresh.n), mf->lkey};
	unsigned char resident[2] = {1, 1};
	REQUIRE(mincore(fresh.p, fresh.n, resident) == 0);
	CHECK((resident[0] | resident[1]) == 0);
	CHECK(ibv_advise_mr(pd, write, flush, &both, 1) == 0);
	REQUIRE(mincore(fresh.p, fresh.n, resident) == 0);
	CHECK((resident[0] & resident[1]) == 1);
}

TEST_CASE("ODP loopback: every operation between ODP MRs, through pages made accessible "
	  "after registration",
	  "[odp]")
{
	loopback::Pair p;
	p.connect();
	Area a, b;
	b.block(2);
	Mr ma(ibv_reg_mr(p.pd, a.p, a.n, odp_access));
	Mr mb(ibv_reg_mr(p.pd, b.p, b.n, odp_access));
	b.unblock(2);

	std::memcpy(a.at(0), "sent-from-odp!!", 16);
	REQUIRE(shmv_test::post_recv_sge(p.b.qp, {b.addr(2 * page), 64, mb->lkey}, 9) == 0);
	REQUIRE(post(p.a.qp, IBV_WR_SEND, a.addr(0), 16, ma->lkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(next_status(p.b.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(b.at(2 * page), "sent-from-odp!!", 16) == 0);

	std::memcpy(a.at(100), "written-by-odp!", 16);
	REQUIRE(post(p.a.qp, IBV_WR_RDMA_WRITE, a.addr(100), 16, ma->lkey, b.addr(2 * page + 100),
		     mb->rkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(b.at(2 * page + 100), "written-by-odp!", 16) == 0);

	REQUIRE(post(p.a.qp, IBV_WR_RDMA_READ, a.addr(3 * page), 16, ma->lkey,
		     b.addr(2 * page + 100), mb->rkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(a.at(3 * page), "written-by-odp!", 16) == 0);

	/* The old value lands in the first 8 bytes of a longer SGE, and only
	 * there. */
	*reinterpret_cast<uint64_t *>(b.at(2 * page + 512)) = 5;
	std::memcpy(a.at(520), "keep-me!", 8);
	REQUIRE(post(p.a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, a.addr(512), 16, ma->lkey,
		     b.addr(2 * page + 512), mb->rkey, 3) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(*reinterpret_cast<uint64_t *>(a.at(512)) == 5);
	CHECK(std::memcmp(a.at(520), "keep-me!", 8) == 0);
	CHECK(*reinterpret_cast<uint64_t *>(b.at(2 * page + 512)) == 8);
}

TEST_CASE("ODP loopback: an implicit MR's keys reach any of our memory", "[odp]")
{
	loopback::Pair p;
	p.connect();
	Mr all(ibv_reg_mr(p.pd, nullptr, SIZE_MAX, odp_access));
	std::vector<char> from(64), to(64);
	std::memcpy(from.data(), "implicit-odp-key", 16);
	REQUIRE(shmv_test::post_recv_sge(p.b.qp, {uint64_t(uintptr_t(to.data())), 64, all->lkey},
					 3) == 0);
	REQUIRE(post(p.a.qp, IBV_WR_SEND, uint64_t(uintptr_t(from.data())), 16, all->lkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(next_status(p.b.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(to.data(), "implicit-odp-key", 16) == 0);
	std::memcpy(from.data() + 32, "written-by-rkey!", 16);
	REQUIRE(post(p.a.qp, IBV_WR_RDMA_WRITE, uint64_t(uintptr_t(from.data() + 32)), 16,
		     all->lkey, uint64_t(uintptr_t(to.data() + 32)), all->rkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(to.data() + 32, "written-by-rkey!", 16) == 0);
}

TEST_CASE("ODP loopback: a page no access reaches fails the operation as mlx5 reports it",
	  "[odp]")
{
	loopback::Pair p;
	p.connect();
	Area a, b;
	Mr ma(ibv_reg_mr(p.pd, a.p, a.n, odp_access));
	Mr mb(ibv_reg_mr(p.pd, b.p, b.n, odp_access));

	SECTION("sending from it: a local protection error") {
		a.block(1);
		REQUIRE(post(p.a.qp, IBV_WR_SEND, a.addr(page), 16, ma->lkey) == 0);
		CHECK(next_status(p.a.cq) == IBV_WC_LOC_PROT_ERR);
	}
	SECTION("reading into it: a local protection error") {
		a.block(1);
		REQUIRE(post(p.a.qp, IBV_WR_RDMA_READ, a.addr(page), 16, ma->lkey, b.addr(0),
			     mb->rkey) == 0);
		CHECK(next_status(p.a.cq) == IBV_WC_LOC_PROT_ERR);
	}
	SECTION("writing to it remotely: a remote access error") {
		b.block(1);
		REQUIRE(post(p.a.qp, IBV_WR_RDMA_WRITE, a.addr(0), 16, ma->lkey, b.addr(page),
			     mb->rkey) == 0);
		CHECK(next_status(p.a.cq) == IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("reading it remotely: a remote access error") {
		b.block(1);
		REQUIRE(post(p.a.qp, IBV_WR_RDMA_READ, a.addr(0), 16, ma->lkey, b.addr(page),
			     mb->rkey) == 0);
		CHECK(next_status(p.a.cq) == IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("an atomic on it: a remote access error") {
		b.block(1);
		REQUIRE(post(p.a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, a.addr(0), 8, ma->lkey,
			     b.addr(page), mb->rkey, 1) == 0);
		CHECK(next_status(p.a.cq) == IBV_WC_REM_ACCESS_ERR);
	}
	SECTION("receiving into it: the receive fails, the sender sees a remote error") {
		b.block(1);
		REQUIRE(shmv_test::post_recv_sge(p.b.qp, {b.addr(page), 64, mb->lkey}, 9) == 0);
		REQUIRE(post(p.a.qp, IBV_WR_SEND, a.addr(0), 16, ma->lkey) == 0);
		CHECK(next_status(p.b.cq) == IBV_WC_LOC_PROT_ERR);
		CHECK(next_status(p.a.cq) == IBV_WC_REM_OP_ERR);
	}
}

TEST_CASE("ODP with a target process: traffic, and a page of the target's MR that no access "
	  "reaches is a remote access error that leaves it running",
	  "[odp][process]")
{
	TargetProc t;
	loopback::Pair p;
	REQUIRE(loopback::Pair::up(p.a, t.qpn, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(t.ask("connect " + std::to_string(p.a.qp->qp_num)) == "ready\n");
	Area a;
	Mr ma(ibv_reg_mr(p.pd, a.p, a.n, odp_access));

	std::memcpy(a.at(0), "sent-to-target!", 16);
	REQUIRE(post(p.a.qp, IBV_WR_SEND, a.addr(0), 16, ma->lkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(t.ask("recv") == "wc 0 16\n");
	CHECK(t.ask("show " + std::to_string(2 * page)) == "data sent-to-target!\n");

	std::memcpy(a.at(64), "written-remotely", 16);
	REQUIRE(post(p.a.qp, IBV_WR_RDMA_WRITE, a.addr(64), 16, ma->lkey, t.addr, t.rkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(t.ask("show 0") == "data written-remotely\n");

	REQUIRE(post(p.a.qp, IBV_WR_RDMA_READ, a.addr(2 * page), 16, ma->lkey, t.addr + 3 * page,
		     t.rkey) == 0);
	CHECK(next_status(p.a.cq) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(a.at(2 * page), "read-me-please!", 16) == 0);

	REQUIRE(post(p.a.qp, IBV_WR_RDMA_WRITE, a.addr(64), 16, ma->lkey, t.addr + page, t.rkey) ==
		0);
	CHECK(next_status(p.a.cq) == IBV_WC_REM_ACCESS_ERR);
	CHECK(t.ask("ping") == "pong\n");
}

TEST_CASE("rxe: no ODP (the Debian 12 kernel's rxe has none)", "[.][rxe]")
{
	shmv_test::DeviceWithPd dev;
	struct ibv_pd *pd = dev.pd;
	CHECK_FALSE(odp_offered(dev.ctx));
	std::vector<char> heap(page);
	errno = 0;
	CHECK_FALSE(ibv_reg_mr(pd, heap.data(), heap.size(), odp_access));
	CHECK(errno == EOPNOTSUPP);
	struct ibv_sge s = {uint64_t(uintptr_t(heap.data())), 64, 1};
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 1) == EOPNOTSUPP);
}

TEST_CASE("ODP needs a process to copy within itself through the kernel: with "
	  "process_vm_readv blocked the device offers none",
	  "[.][seccomp]")
{
	shmv_test::DeviceWithPd dev;
	CHECK_FALSE(odp_offered(dev.ctx));
	std::vector<char> heap(page);
	errno = 0;
	CHECK_FALSE(ibv_reg_mr(dev.pd, heap.data(), heap.size(), odp_access));
	CHECK(errno == EOPNOTSUPP);
	struct ibv_sge s = {uint64_t(uintptr_t(heap.data())), 64, 1};
	CHECK(ibv_advise_mr(dev.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 1) == EOPNOTSUPP);
	/* Everything else still works: a plain MR, whose peers use the
	 * memory file or bounce buffers. */
	struct ibv_mr *mr = ibv_reg_mr(dev.pd, heap.data(), heap.size(), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	CHECK(ibv_dereg_mr(mr) == 0);
}
