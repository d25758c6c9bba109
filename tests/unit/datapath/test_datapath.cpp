/* SPDX-License-Identifier: MIT */
/*
 * The data path with real processes: the test binary re-executes itself as
 * the target ("--target"), which talks to the test over its stdin/stdout
 * pipes and otherwise sits in read() (a passive target). Every wait is
 * bounded.
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <infiniband/verbs.h>

#include "../common/peer.h"
#include "../common/seccomp.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t buf_size = 4096;

/* The target process has no Catch2 session: NEED (../common/peer.h)
 * exits there on a failure. */
using shmv_test::block_cma_with_seccomp;
using shmv_test::read_line;

/*
 * The registered buffer. Heap memory can be made shareable; a file-backed
 * MAP_PRIVATE mapping never can, so peers reach it by CMA or bounce.
 */
enum class BufKind { Heap, File };

struct Buffer {
	char *p = nullptr;
	size_t n = buf_size;
	BufKind kind;

	explicit Buffer(BufKind k, size_t size = buf_size) : n(size), kind(k)
	{
		if (k == BufKind::Heap) {
			p = new char[n]();
			return;
		}
		char path[] = "/tmp/unit-datapath-XXXXXX";
		int fd = mkstemp(path);
		NEED(fd >= 0);
		unlink(path);
		NEED(ftruncate(fd, off_t(n)) == 0);
		void *m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		close(fd);
		NEED(m != MAP_FAILED);
		p = static_cast<char *>(m);
	}
	~Buffer()
	{
		if (kind == BufKind::Heap)
			delete[] p;
		else
			munmap(p, n);
	}
	char *data() { return p; }
	size_t size() const { return n; }
};

struct Node {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	struct ibv_comp_channel *ch = nullptr;
	struct ibv_cq *cq = nullptr;
	struct ibv_qp *qp = nullptr;
	struct ibv_mr *mr = nullptr;
	Buffer buf;
	uint16_t lid = 0;

	explicit Node(bool with_channel = false, BufKind kind = BufKind::Heap,
		      size_t size = buf_size)
		: buf(kind, size)
	{
		ctx = shmv_test::open_first_device();
		pd = ibv_alloc_pd(ctx);
		if (with_channel)
			ch = ibv_create_comp_channel(ctx);
		cq = ibv_create_cq(ctx, 64, nullptr, ch, 0);
		NEED(cq);
		struct ibv_qp_init_attr a{};
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = 32;
		a.cap.max_recv_wr = 32;
		a.cap.max_send_sge = 2;
		a.cap.max_recv_sge = 2;
		a.cap.max_inline_data = 64;
		qp = ibv_create_qp(pd, &a);
		NEED(qp);
		mr = ibv_reg_mr(pd, buf.data(), buf.size(),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
		NEED(mr);
		lid = shmv_test::port_lid(ctx);
	}

	int connect(uint32_t dest, int rnr_retry = 7, int min_rnr_timer = 1)
	{
		shmv_test::QpPath path;
		path.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC;
		path.rnr_retry = uint8_t(rnr_retry);
		path.min_rnr_timer = uint8_t(min_rnr_timer);
		return shmv_test::qp_to_rts(qp, IBV_QPT_RC, dest, lid, path);
	}

	int post_recv(uint64_t wr_id, uint32_t off, uint32_t len)
	{
		struct ibv_sge s = {uint64_t(uintptr_t(buf.data() + off)), len, mr->lkey};
		struct ibv_recv_wr wr{}, *bad = nullptr;
		wr.wr_id = wr_id;
		wr.sg_list = &s;
		wr.num_sge = 1;
		return ibv_post_recv(qp, &wr, &bad);
	}

	/* Waits (bounded) for one completion. */
	bool wait_wc(struct ibv_wc &wc, int ms = 10000) { return shmv_test::wait_wc(cq, wc, ms); }

	~Node()
	{
		if (qp)
			ibv_destroy_qp(qp);
		if (mr)
			ibv_dereg_mr(mr);
		if (cq)
			ibv_destroy_cq(cq);
		if (ch)
			ibv_destroy_comp_channel(ch);
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}
};

/* ---- The target process ---- */

/* Whether pid maps `name` (a memfd) at all (addr 0), or at addr. */
bool mapped_from(pid_t pid, uintptr_t addr, const char *name)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/maps", int(pid));
	FILE *f = std::fopen(path, "re");
	char l[1024];
	bool found = false;
	while (f && !found && std::fgets(l, sizeof(l), f)) {
		unsigned long lo, hi;
		if (std::sscanf(l, "%lx-%lx", &lo, &hi) != 2 || !std::strstr(l, name))
			continue;
		found = addr == 0 || (lo <= addr && addr < hi);
	}
	if (f)
		std::fclose(f);
	return found;
}

/*
 * "stream <count>": receives `count` SENDs of 8 bytes, each carrying its
 * sequence number, keeping 32 receives posted, and grows its CQ beyond the
 * CQ's ring 7 times on the way (each a move of the slots while the sender
 * completes into them); prints "streamed <received> <in order> <cqe>".
 */
int stream_target(Node &n, unsigned count)
{
	constexpr unsigned slots = 32, slot_bytes = 64;
	uint64_t posted = 0, received = 0;
	bool in_order = true;
	int resize_errors = 0;
	auto post = [&] {
		for (; posted - received < slots; posted++)
			NEED(n.post_recv(posted, uint32_t(posted % slots * slot_bytes), slot_bytes) ==
			     0);
	};
	post();
	std::printf("streaming\n");
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
	unsigned resizes = 0;
	while (received < count && std::chrono::steady_clock::now() < deadline) {
		if (resizes < 7 && received >= count / 8 * (resizes + 1)) {
			resize_errors += ibv_resize_cq(n.cq, n.cq->cqe * 2 + 1) != 0;
			resizes++;
		}
		struct ibv_wc wc[8];
		const int got = ibv_poll_cq(n.cq, 8, wc);
		NEED(got >= 0);
		for (int i = 0; i < got; i++) {
			uint64_t seq;
			std::memcpy(&seq, n.buf.data() + wc[i].wr_id % slots * slot_bytes, 8);
			in_order &= wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == received &&
				    seq == received;
			received++;
		}
		post();
	}
	std::printf("streamed %llu %d %d %d\n", (unsigned long long)received, int(in_order),
		    resize_errors, n.cq->cqe);
	return 0;
}

/*
 * Protocol (lines): target prints "qpn rkey addr"; the test sends
 * "connect <qpn> <post_recvs>"; target prints "ready" and then blocks in
 * read(); the test sends "check"; target polls its CQ and prints its
 * receive completions ("wc <status> <byte_len> <imm>") and the first 16 bytes
 * of its buffer, then "done".
 */
int target_main(BufKind kind)
{
	shmv_test::in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	Node n(true, kind);
	std::memset(n.buf.data(), 0, buf_size);
	*reinterpret_cast<uint64_t *>(n.buf.data() + 1024) = 100; /* atomics target */
	std::memcpy(n.buf.data() + 2048, "read-me-please!", 16);
	shmv_test::print_target_address(n.qp->qp_num, n.mr->rkey, n.buf.data());
	std::string line;
	if (!read_line(stdin, line))
		return 1;
	unsigned qpn = 0, recvs = 0;
	if (std::sscanf(line.c_str(), "connect %u %u", &qpn, &recvs) != 2)
		return 2;
	if (n.connect(qpn))
		return 3;
	for (unsigned i = 0; i < recvs; i++)
		if (n.post_recv(100 + i, 3072, 512))
			return 4;
	std::printf("ready\n");
	/* Passive: blocked in read() while the initiator works. */
	if (!read_line(stdin, line))
		return 0;
	if (unsigned count = 0; std::sscanf(line.c_str(), "stream %u", &count) == 1)
		return stream_target(n, count);
	if (line == "post\n") {
		/* A late receive (the initiator waits in RNR meanwhile). */
		if (n.post_recv(200, 3072, 512))
			return 5;
		std::printf("posted\n");
		if (!read_line(stdin, line))
			return 0;
	}
	if (line == "mw\n") {
		/* A type 2 window over bytes [2048, 2064) of a second MR of the
		 * buffer, bound on the QP: "mw <rkey>". */
		struct ibv_mr *mr = ibv_reg_mr(n.pd, n.buf.data(), buf_size,
					       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		struct ibv_mw *mw = ibv_alloc_mw(n.pd, IBV_MW_TYPE_2);
		NEED((mr && mw));
		struct ibv_send_wr wr{}, *bad = nullptr;
		wr.opcode = IBV_WR_BIND_MW;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
		wr.bind_mw.bind_info = {mr, uint64_t(uintptr_t(n.buf.data() + 2048)), 16,
					IBV_ACCESS_REMOTE_WRITE};
		NEED(ibv_post_send(n.qp, &wr, &bad) == 0);
		struct ibv_wc wc{};
		NEED((n.wait_wc(wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW));
		std::printf("mw %u\n", wr.bind_mw.rkey);
		if (!read_line(stdin, line))
			return 0;
	}
	if (line == "dereg\n") {
		/* The registration goes; the memory stays the application's. */
		uintptr_t page = uintptr_t(n.buf.data()) & ~uintptr_t(4095);
		NEED(ibv_dereg_mr(n.mr) == 0);
		n.mr = nullptr;
		/* Private again: a store here is not seen by anyone else. */
		std::printf("dereged %s\n", mapped_from(getpid(), page, "shmverbs-memory") ? "shared"
											  : "private");
		if (!read_line(stdin, line))
			return 0;
	}
	pid_t child = -1;
	int to_child[2] = {-1, -1};
	if (line == "fork\n") {
		/* A child made after reg_mr: it keeps the fork-time contents. */
		NEED(pipe(to_child) == 0);
		child = fork();
		NEED(child >= 0);
		if (child == 0) {
			char c;
			if (read(to_child[0], &c, 1) != 1)
				_exit(1);
			std::printf("child %.16s|\n", n.buf.data());
			std::fflush(stdout);
			_exit(0);
		}
		std::printf("forked\n");
		if (!read_line(stdin, line))
			return 0;
		NEED(write(to_child[1], "x", 1) == 1);
		int status = 0;
		NEED((waitpid(child, &status, 0) == child && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0));
	}
	if (line == "arm\n") {
		/* Sleep on the completion channel until a peer's SEND. */
		if (ibv_req_notify_cq(n.cq, 0))
			return 6;
		std::printf("armed\n");
		struct pollfd p = {n.ch->fd, POLLIN, 0};
		if (poll(&p, 1, 3000) != 1)
			return 7;
		struct ibv_cq *cq;
		void *cq_ctx;
		if (ibv_get_cq_event(n.ch, &cq, &cq_ctx) || cq != n.cq)
			return 8;
		ibv_ack_cq_events(cq, 1);
		std::printf("event\n");
		if (!read_line(stdin, line))
			return 0;
	}
	struct ibv_wc wc;
	while (ibv_poll_cq(n.cq, 1, &wc) == 1)
		std::printf("wc %d %u %u %llu\n", wc.status, wc.byte_len, ntohl(wc.imm_data),
			    (unsigned long long)wc.wr_id);
	std::printf("data %.16s|%.16s|%llu\n", n.buf.data(), n.buf.data() + 3072,
		    (unsigned long long)*reinterpret_cast<uint64_t *>(n.buf.data() + 1024));
	std::printf("done\n");
	return 0;
}

struct TargetProc : shmv_test::TargetPeer {
	explicit TargetProc(BufKind kind = BufKind::Heap)
		: TargetPeer({"self", "--target", kind == BufKind::File ? "file" : "heap"})
	{
	}
};

int post(Node &n, enum ibv_wr_opcode op, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
	 uint64_t wr_id, uint64_t cmp = 0, uint64_t swp = 0, unsigned flags = IBV_SEND_SIGNALED)
{
	struct ibv_sge s = {uint64_t(uintptr_t(n.buf.data() + off)), len, n.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.opcode = op;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = flags;
	wr.imm_data = htonl(77);
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swp;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(n.qp, &wr, &bad);
}

/* The SENDs of the reset test: large enough that each copy takes a while. */
constexpr uint32_t big_message = 1u << 20;
constexpr unsigned big_receives = 4;

/*
 * "--sender": a peer that SENDs. Prints its address as the target does;
 * on "connect <qpn>" connects and prints "ready"; on "send" SENDs
 * big_message bytes again and again, 4 in flight, until one completes in
 * error (or 10 s pass), and prints "sent <successes> <that status>".
 */
int sender_main()
{
	shmv_test::in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	Node n(false, BufKind::Heap, big_message);
	shmv_test::print_target_address(n.qp->qp_num, n.mr->rkey, n.buf.data());
	std::string line;
	unsigned qpn = 0;
	NEED((read_line(stdin, line) && std::sscanf(line.c_str(), "connect %u", &qpn) == 1));
	NEED(n.connect(qpn) == 0);
	std::printf("ready\n");
	NEED((read_line(stdin, line) && line == "send\n"));
	unsigned ok = 0, in_flight = 0;
	int status = IBV_WC_SUCCESS;
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (status == IBV_WC_SUCCESS && std::chrono::steady_clock::now() < deadline) {
		for (; in_flight < 4; in_flight++)
			NEED(post(n, IBV_WR_SEND, 0, big_message, 0, 0, ok + in_flight) == 0);
		struct ibv_wc wc{};
		if (!n.wait_wc(wc, 100))
			continue;
		in_flight--;
		if (wc.status == IBV_WC_SUCCESS)
			ok++;
		else
			status = wc.status;
	}
	std::printf("sent %u %d\n", ok, status);
	read_line(stdin, line);
	return 0;
}

/* Whether process_vm_readv works here (it does on ourselves unless blocked). */
bool cma_works()
{
	uint64_t x = 1, y = 0;
	struct iovec l = {&y, 8}, r = {&x, 8};
	return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == 8;
}

bool seccomp_mode = false;

} // namespace

/* unit-datapath [--seccomp] [catch args]: --seccomp runs every test with CMA
 * blocked by a real seccomp filter (skipped with a message where filters
 * cannot be installed). */
int main(int argc, char **argv)
{
	if (argc > 1 && std::strcmp(argv[1], "--sender") == 0)
		return sender_main();
	if (argc > 1 && std::strcmp(argv[1], "--target") == 0)
		return target_main(argc > 2 && std::strcmp(argv[2], "file") == 0 ? BufKind::File
										 : BufKind::Heap);
	if (argc > 1 && std::strcmp(argv[1], "--seccomp") == 0) {
		if (int err = block_cma_with_seccomp()) {
			std::printf("cannot install a seccomp filter here (%s): skipped\n",
				    std::strerror(err));
			return 77; /* meson: skipped */
		}
		seccomp_mode = true;
		argv[1] = argv[0];
		argc--;
		argv++;
	}
	return Catch::Session().run(argc, argv);
}

namespace {

/* WRITE, READ, both atomics and a SEND into a passive target whose
 * registered buffer is of the given kind. */
void passive_target(BufKind kind)
{
	TargetProc t(kind);
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 2");
	REQUIRE(t.line() == "ready\n");

	std::memcpy(n.buf.data(), "written-by-rdma", 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 1) == 0);
	REQUIRE(post(n, IBV_WR_RDMA_READ, 512, 16, t.addr + 2048, t.rkey, 2) == 0);
	REQUIRE(post(n, IBV_WR_ATOMIC_FETCH_AND_ADD, 64, 8, t.addr + 1024, t.rkey, 3, 5) == 0);
	REQUIRE(post(n, IBV_WR_ATOMIC_CMP_AND_SWP, 72, 8, t.addr + 1024, t.rkey, 4, 105, 7) == 0);
	std::memcpy(n.buf.data() + 128, "sent-by-a-send!", 16);
	REQUIRE(post(n, IBV_WR_SEND_WITH_IMM, 128, 16, 0, 0, 5) == 0);

	struct {
		uint64_t wr_id;
		enum ibv_wc_opcode opcode;
	} const expect[] = {{1, IBV_WC_RDMA_WRITE}, {2, IBV_WC_RDMA_READ}, {3, IBV_WC_FETCH_ADD},
			    {4, IBV_WC_COMP_SWAP}, {5, IBV_WC_SEND}};
	for (auto e : expect) {
		struct ibv_wc wc{};
		REQUIRE(n.wait_wc(wc));
		CAPTURE(e.wr_id);
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.wr_id == e.wr_id);
		CHECK(wc.opcode == e.opcode);
	}
	CHECK(std::memcmp(n.buf.data() + 512, "read-me-please!", 16) == 0);
	CHECK(*reinterpret_cast<uint64_t *>(n.buf.data() + 64) == 100);
	CHECK(*reinterpret_cast<uint64_t *>(n.buf.data() + 72) == 105);

	/* Only now does the target look. */
	t.send("check");
	CHECK(t.line() == "wc 0 16 77 100\n");
	CHECK(t.line() == "data written-by-rdma|sent-by-a-send!|7\n");
	CHECK(t.line() == "done\n");
}

} // namespace

TEST_CASE("passive target: WRITE, READ, atomics and SEND complete while it sits in read()",
	  "[datapath][process]")
{
	passive_target(BufKind::Heap);
}

TEST_CASE("memory that cannot be shared (file-backed MAP_PRIVATE) works through CMA or bounce",
	  "[datapath][process][paths]")
{
	passive_target(BufKind::File);
}

TEST_CASE("RC: a WRITE is visible before the receive completion of a later SEND",
	  "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 1");
	REQUIRE(t.line() == "ready\n");
	std::memcpy(n.buf.data(), "first-the-write", 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 1, 0, 0, 0) == 0);
	REQUIRE(post(n, IBV_WR_SEND, 128, 4, 0, 0, 2) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.wr_id == 2); /* the unsignaled WRITE has no completion */
	t.send("check");
	CHECK(t.line() == "wc 0 4 0 100\n");
	CHECK(t.line().rfind("data first-the-write|", 0) == 0);
}

TEST_CASE("RC: a requester its responder is not connected to never hears back",
	  "[datapath]")
{
	/* `a` names `b` as its destination, but `b` is connected to `c`: a
	 * device's responder sends its ACKs to `c`, so `a` retries until
	 * timeout x retry_cnt and fails, and `b` takes nothing from it. */
	const enum ibv_wr_opcode op = GENERATE(IBV_WR_SEND, IBV_WR_RDMA_WRITE);
	CAPTURE(op);
	Node a, b, c;
	REQUIRE(a.connect(b.qp->qp_num) == 0);
	REQUIRE(b.connect(c.qp->qp_num) == 0);
	REQUIRE(c.connect(b.qp->qp_num) == 0);
	REQUIRE(b.post_recv(7, 0, 64) == 0);
	std::memcpy(a.buf.data(), "not-for-you-b!!", 16);
	std::memset(b.buf.data(), 0, 64);
	REQUIRE(post(a, op, 0, 16, uint64_t(uintptr_t(b.buf.data())), b.mr->rkey, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(a.wait_wc(wc));
	CHECK(wc.wr_id == 1);
	CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
	CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
	CHECK(std::memcmp(b.buf.data(), "not-for-you-b!!", 16) != 0);
	/* Its own peer still gets through. */
	std::memcpy(c.buf.data(), "for-you-b-from-c", 16);
	REQUIRE(post(c, IBV_WR_SEND, 0, 16, 0, 0, 2) == 0);
	REQUIRE(c.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(b.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.wr_id == 7);
	CHECK(wc.src_qp == c.qp->qp_num);
}

TEST_CASE("RNR: retries exhausted end in RNR_RETRY_EXC_ERR and the QP in ERR",
	  "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn, 2) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	REQUIRE(post(n, IBV_WR_SEND, 0, 4, 0, 0, 9) == 0);
	REQUIRE(post(n, IBV_WR_SEND, 0, 4, 0, 0, 10) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.wr_id == 9);
	CHECK(wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.wr_id == 10);
	CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
	struct ibv_qp_attr a{};
	struct ibv_qp_init_attr ia{};
	REQUIRE(ibv_query_qp(n.qp, &a, IBV_QP_STATE, &ia) == 0);
	CHECK(a.qp_state == IBV_QPS_ERR);
}

TEST_CASE("bad rkey: REM_ACCESS_ERR at the requester", "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey ^ 0x100, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
}

TEST_CASE("bad lkey: LOC_PROT_ERR", "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	struct ibv_sge s = {uint64_t(uintptr_t(n.buf.data())), 16, n.mr->lkey + 0x100};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 3;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = t.addr;
	wr.wr.rdma.rkey = t.rkey;
	REQUIRE(ibv_post_send(n.qp, &wr, &bad) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
}

TEST_CASE("a dead peer: RETRY_EXC_ERR after timeout x retry_cnt, nobody hangs",
	  "[datapath][process]")
{
	/* The first WR to the peer, or one after a stream of them (which
	 * the engine sends a shorter way, the target and keys held); the
	 * peer reaped, or a zombie still (kill(0) finds it; its segment's
	 * owner-alive word does not). Whatever path reaches its memory
	 * (unit-datapath-cma, -bounce), a responder that is gone answers
	 * nothing: never an access error. */
	const enum ibv_wr_opcode op =
		GENERATE(IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD);
	const int before = GENERATE(0, 2);
	const bool reaped = GENERATE(true, false);
	CAPTURE(op, before, reaped);
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 4");
	REQUIRE(t.line() == "ready\n");
	struct ibv_wc wc{};
	const uint32_t len = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 4;
	for (int i = 0; i < before; i++) {
		REQUIRE(post(n, op, 0, len, t.addr, t.rkey, 10 + uint64_t(i)) == 0);
		REQUIRE(n.wait_wc(wc));
		REQUIRE(wc.status == IBV_WC_SUCCESS);
	}
	kill(t.pid, SIGKILL);
	if (reaped) {
		waitpid(t.pid, nullptr, 0);
		t.pid = -1;
	} else {
		siginfo_t si{};
		REQUIRE(waitid(P_PID, id_t(t.pid), &si, WEXITED | WNOWAIT) == 0); /* a zombie now */
	}
	REQUIRE(post(n, op, 0, len, t.addr, t.rkey, 1) == 0);
	REQUIRE(n.wait_wc(wc, 3000)); /* not the bounce path's 5 s */
	CHECK(wc.wr_id == 1);
	CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
	if (!reaped) {
		waitpid(t.pid, nullptr, 0);
		t.pid = -1;
	}
}

TEST_CASE("a stopped peer: its memory is written where the path reaches it alone; through "
	  "its bounce helper, RETRY_EXC_ERR",
	  "[datapath][process]")
{
	/* A NIC writes into a stopped process's memory; so do the shared
	 * mapping and cross-memory attach. The bounce path needs the
	 * target's helper thread, stopped with it: no answer within the
	 * path's 5 s is the transport's retry exhausted, never an access
	 * error that blames the rkey. */
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 4");
	REQUIRE(t.line() == "ready\n");
	const char *path = std::getenv("SHMVERBS_MEMORY_PATH");
	const bool bounce = path && std::strcmp(path, "bounce") == 0;
	REQUIRE(kill(t.pid, SIGSTOP) == 0);
	siginfo_t si{};
	REQUIRE(waitid(P_PID, id_t(t.pid), &si, WSTOPPED) == 0); /* stopped now */
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 1) == 0);
	struct ibv_wc wc{};
	const bool got = n.wait_wc(wc);
	kill(t.pid, SIGCONT);
	REQUIRE(got);
	CHECK(wc.status == (bounce ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS));
}

/* libmlx5 checks a WR's opcode (EINVAL), then its SGE count against the
 * state's limit, -1 in the send queue until RTS and in the receive queue in
 * RESET (ENOMEM for a send, EINVAL for a receive); an empty list posts
 * nothing and succeeds in any state. */
TEST_CASE("posting: a send before RTS is ENOMEM, a receive in RESET EINVAL, with bad_wr set",
	  "[datapath]")
{
	Node n;
	struct ibv_sge s = {uint64_t(uintptr_t(n.buf.data())), 4, n.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &s;
	wr.num_sge = 1;
	CHECK(ibv_post_send(n.qp, &wr, &bad) == ENOMEM);
	CHECK(bad == &wr);
	wr.opcode = static_cast<enum ibv_wr_opcode>(99);
	bad = nullptr;
	CHECK(ibv_post_send(n.qp, &wr, &bad) == EINVAL);
	CHECK(bad == &wr);
	struct ibv_recv_wr rwr{}, *rbad = nullptr;
	rwr.sg_list = &s;
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(n.qp, &rwr, &rbad) == EINVAL);
	CHECK(rbad == &rwr);
	bad = nullptr;
	rbad = nullptr;
	CHECK(ibv_post_send(n.qp, nullptr, &bad) == 0);
	CHECK(ibv_post_recv(n.qp, nullptr, &rbad) == 0);
	CHECK((bad == nullptr && rbad == nullptr));
	/* In INIT: receives go, sends still do not. */
	shmv_test::QpPath path;
	REQUIRE(shmv_test::qp_to_init(n.qp, IBV_QPT_RC, path) == 0);
	CHECK(ibv_post_recv(n.qp, &rwr, &rbad) == 0);
	wr.opcode = IBV_WR_SEND;
	CHECK(ibv_post_send(n.qp, &wr, &bad) == ENOMEM);
	/* Nor in ERR entered from INIT: the send queue opens at RTS only (a
	 * QP that was in RTS posts in ERR, and its WRs are flushed). */
	struct ibv_qp_attr err{};
	err.qp_state = IBV_QPS_ERR;
	REQUIRE(ibv_modify_qp(n.qp, &err, IBV_QP_STATE) == 0);
	bad = nullptr;
	CHECK(ibv_post_send(n.qp, &wr, &bad) == ENOMEM);
	CHECK(bad == &wr);
}

TEST_CASE("posting: more SGEs than max_send_sge is ENOMEM at that WR, those before it go",
	  "[datapath]")
{
	Node n;
	REQUIRE(n.connect(n.qp->qp_num) == 0); /* to itself */
	struct ibv_qp_attr qa{};
	struct ibv_qp_init_attr qi{};
	REQUIRE(ibv_query_qp(n.qp, &qa, IBV_QP_CAP, &qi) == 0);
	std::vector<struct ibv_sge> sges(qi.cap.max_send_sge + 1,
					 {uint64_t(uintptr_t(n.buf.data())), 4, n.mr->lkey});
	struct ibv_send_wr first{}, second{}, *bad = nullptr;
	first.wr_id = 1;
	first.opcode = IBV_WR_RDMA_WRITE;
	first.send_flags = IBV_SEND_SIGNALED;
	first.sg_list = sges.data();
	first.num_sge = 1;
	first.wr.rdma.remote_addr = uint64_t(uintptr_t(n.buf.data() + 64));
	first.wr.rdma.rkey = n.mr->rkey;
	second = first;
	second.wr_id = 2;
	second.num_sge = int(sges.size());
	first.next = &second;
	CHECK(ibv_post_send(n.qp, &first, &bad) == ENOMEM);
	CHECK(bad == &second);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	CHECK((wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS));
	CHECK(ibv_poll_cq(n.cq, 1, &wc) == 0);
}

TEST_CASE("loopback in one process with a completion channel and poll()", "[datapath]")
{
	Node a(true), b(true);
	REQUIRE(a.connect(b.qp->qp_num) == 0);
	REQUIRE(b.connect(a.qp->qp_num) == 0);
	REQUIRE(b.post_recv(7, 0, 64) == 0);
	REQUIRE(ibv_req_notify_cq(b.cq, 0) == 0);
	std::memcpy(a.buf.data() + 100, "hello", 6);
	REQUIRE(post(a, IBV_WR_SEND, 100, 6, 0, 0, 1, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE) == 0);
	struct pollfd p = {b.ch->fd, POLLIN, 0};
	REQUIRE(poll(&p, 1, 2000) == 1);
	struct ibv_cq *ev_cq = nullptr;
	void *ev_ctx = nullptr;
	REQUIRE(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == b.cq);
	ibv_ack_cq_events(ev_cq, 1);
	struct ibv_wc wc{};
	REQUIRE(b.wait_wc(wc));
	CHECK(wc.wr_id == 7);
	CHECK(wc.byte_len == 6);
	CHECK(wc.src_qp == a.qp->qp_num);
	CHECK(std::strcmp(b.buf.data(), "hello") == 0);
	REQUIRE(a.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	/* Flush: ERR completes posted receives with WR_FLUSH_ERR. */
	REQUIRE(b.post_recv(8, 0, 64) == 0);
	struct ibv_qp_attr at{};
	at.qp_state = IBV_QPS_ERR;
	REQUIRE(ibv_modify_qp(b.qp, &at, IBV_QP_STATE) == 0);
	REQUIRE(b.wait_wc(wc));
	CHECK(wc.wr_id == 8);
	CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
}

TEST_CASE("RNR with rnr_retry 7 waits until a receive is posted, then succeeds",
	  "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn, 7) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	REQUIRE(post(n, IBV_WR_SEND, 0, 4, 0, 0, 1) == 0);
	struct ibv_wc wc{};
	CHECK_FALSE(n.wait_wc(wc, 100)); /* retrying, not failing */
	t.send("post");
	REQUIRE(t.line() == "posted\n");
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	t.send("check");
	CHECK(t.line() == "wc 0 4 0 200\n");
}

TEST_CASE("a peer's memory window: reached through its key, within it, until SEND_WITH_INV",
	  "[datapath][process][mw]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 1");
	REQUIRE(t.line() == "ready\n");
	uint32_t key = 0;
	REQUIRE(std::sscanf(t.ask("mw").c_str(), "mw %u", &key) == 1);
	struct ibv_wc wc{};
	std::memcpy(n.buf.data(), "through-window!", 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr + 2048, key, 1) == 0);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	/* What landed, read back through the MR. */
	REQUIRE(post(n, IBV_WR_RDMA_READ, 512, 16, t.addr + 2048, t.rkey, 2) == 0);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(std::memcmp(n.buf.data() + 512, "through-window!", 16) == 0);
	struct ibv_sge s = {uint64_t(uintptr_t(n.buf.data())), 8, n.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 3;
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.invalidate_rkey = key;
	REQUIRE(ibv_post_send(n.qp, &wr, &bad) == 0);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 8, t.addr + 2048, key, 4) == 0);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	t.send("check");
	CHECK(t.line() == "wc 0 8 " + std::to_string(ntohl(key)) + " 100\n");
}

TEST_CASE("a CQ grows beyond its ring while a peer process streams SENDs into it",
	  "[datapath][process][resize]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn, 7) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	constexpr uint64_t count = 20000, window = 32;
	t.send("stream " + std::to_string(count));
	REQUIRE(t.line() == "streaming\n");
	uint64_t sent = 0, done = 0;
	bool ok = true;
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
	while (done < count && ok && std::chrono::steady_clock::now() < deadline) {
		while (sent < count && sent - done < window) {
			/* Its own 64 bytes until it completes (a WR held for RNR
			 * reads them later). */
			std::memcpy(n.buf.data() + sent % window * 64, &sent, 8);
			if (post(n, IBV_WR_SEND, uint32_t(sent % window * 64), 8, 0, 0, sent) != 0) {
				ok = false;
				break;
			}
			sent++;
		}
		struct ibv_wc wc[8];
		const int got = ibv_poll_cq(n.cq, 8, wc);
		ok &= got >= 0;
		for (int i = 0; i < got; i++) {
			ok &= wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == done;
			done++;
		}
	}
	CHECK(ok);
	CHECK(done == count);
	/* received, in order, resize errors, the CQ's final size (64 doubled
	 * 7 times, +1 each time, as libmlx5 rounds). */
	CHECK(t.line() == "streamed 20000 1 0 16383\n");
}

namespace {

/* Connects `n` to the "--sender" peer `t`, gives it big_receives receives
 * and starts its stream of SENDs: the completion of the first to land. */
struct ibv_wc start_stream(shmv_test::TargetPeer &t, Node &n)
{
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num));
	REQUIRE(t.line() == "ready\n");
	for (unsigned i = 0; i < big_receives; i++)
		REQUIRE(n.post_recv(i, i * big_message, big_message) == 0);
	t.send("send");
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	return wc;
}

} // namespace

/* mlx5: once ibv_modify_qp(RESET) returns, the QP's completions have left
 * its CQs (mlx5_cq_clean) and the device makes no more. A sender of another
 * process may be inside a SEND that took one of our receives just before
 * the reset (copying a large payload): the reset waits for it, and the
 * clean then removes what it completed. */
TEST_CASE("reset while a peer's SENDs are landing: no completion of the QP after it",
	  "[datapath][process][reset]")
{
	shmv_test::TargetPeer t({"self", "--sender"});
	Node n(false, BufKind::Heap, size_t(big_message) * big_receives);
	/* The first lands; the sender goes on with the next at once. */
	struct ibv_wc wc = start_stream(t, n);
	CHECK((wc.wr_id == 0 && wc.status == IBV_WC_SUCCESS));
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RESET;
	REQUIRE(ibv_modify_qp(n.qp, &a, IBV_QP_STATE) == 0);
	int late = 0;
	const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
	while (std::chrono::steady_clock::now() < until)
		late += ibv_poll_cq(n.cq, 1, &wc);
	CHECK(late == 0);
	/* The sender's next SENDs find no responder: retries exhausted. */
	unsigned ok = 0;
	int status = -1;
	REQUIRE(std::sscanf(t.line().c_str(), "sent %u %d", &ok, &status) == 2);
	CHECK(ok >= 1);
	CHECK(status == IBV_WC_RETRY_EXC_ERR);
}

namespace {

/* ibv_destroy_qp of `n`'s QP: wall-clock and CPU seconds of this thread. */
std::pair<double, double> timed_destroy(Node &n)
{
	struct rusage r0, r1;
	REQUIRE(getrusage(RUSAGE_THREAD, &r0) == 0);
	const auto start = std::chrono::steady_clock::now();
	REQUIRE(ibv_destroy_qp(n.qp) == 0);
	n.qp = nullptr;
	const double wall =
		std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
	REQUIRE(getrusage(RUSAGE_THREAD, &r1) == 0);
	auto secs = [](const struct timeval &tv) { return double(tv.tv_sec) + tv.tv_usec / 1e6; };
	return {wall, secs(r1.ru_utime) + secs(r1.ru_stime) - secs(r0.ru_utime) - secs(r0.ru_stime)};
}

} // namespace

TEST_CASE("destroy_qp does not wait for the hold of a sender that was killed",
	  "[datapath][process]")
{
	/* A sender killed mid-stream leaves its hold on our QP's in-flight
	 * count; the hold names its process, so ibv_destroy_qp sees it gone
	 * and returns at once instead of waiting out its bound (2 s), for
	 * each QP of a crashed peer. Reaped or still a zombie. */
	const bool reap = GENERATE(true, false);
	CAPTURE(reap);
	shmv_test::TargetPeer t({"self", "--sender"});
	Node n(false, BufKind::Heap, size_t(big_message) * big_receives);
	REQUIRE(start_stream(t, n).status == IBV_WC_SUCCESS);
	const pid_t pid = t.pid;
	kill(pid, SIGKILL);
	if (reap) {
		waitpid(pid, nullptr, 0);
		t.pid = -1;
	}
	auto [wall, cpu] = timed_destroy(n);
	CAPTURE(wall, cpu);
	CHECK(wall < 1.0);
}

TEST_CASE("destroy_qp waits out a stopped sender's hold asleep, not spinning a CPU",
	  "[datapath][process]")
{
	/* A sender that is alive but stopped (SIGSTOP, a debugger) keeps its
	 * hold: its WR may be halfway into our QP. destroy_qp waits for it up
	 * to its bound (2 s), without holding a CPU for it. (Whether the
	 * sender holds at the moment it stops depends on the memory path: on
	 * CMA it holds only while it copies.) */
	shmv_test::TargetPeer t({"self", "--sender"});
	Node n(false, BufKind::Heap, size_t(big_message) * big_receives);
	REQUIRE(start_stream(t, n).status == IBV_WC_SUCCESS);
	kill(t.pid, SIGSTOP);
	auto [wall, cpu] = timed_destroy(n);
	/* Before ~Node: ibv_dereg_mr waits for a live holder of the key. */
	kill(t.pid, SIGKILL);
	waitpid(t.pid, nullptr, 0);
	t.pid = -1;
	CAPTURE(wall, cpu);
	CHECK(wall < 3.0);
	CHECK(cpu < 0.2);
}

TEST_CASE("completion channel: a SEND wakes a peer sleeping in poll() on its channel",
	  "[datapath][process]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 1");
	REQUIRE(t.line() == "ready\n");
	t.send("arm");
	REQUIRE(t.line() == "armed\n");
	REQUIRE(post(n, IBV_WR_SEND, 0, 8, 0, 0, 1) == 0);
	CHECK(t.line() == "event\n");
	t.send("check");
	CHECK(t.line() == "wc 0 8 0 100\n");
}

TEST_CASE("several threads post and poll on one QP pair", "[datapath]")
{
	Node a, b;
	REQUIRE(a.connect(b.qp->qp_num) == 0);
	REQUIRE(b.connect(a.qp->qp_num) == 0);
	constexpr int per_thread = 200;
	std::atomic<int> received{0}, sent{0};
	/* Generous: the suite runs beside busy-polling perftest pairs on 2 cores. */
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
	std::thread poster([&] {
		for (int i = 0; i < per_thread; i++) {
			while (b.post_recv(i, 0, 64) == ENOMEM)
				std::this_thread::yield();
			/* Keep the unpolled send and receive completions within
			 * the CQs (64 entries): a starved poller must not turn
			 * into an overrun, which loses completions. */
			while ((i - sent.load() >= 32 || i - received.load() >= 32) &&
			       std::chrono::steady_clock::now() < end)
				std::this_thread::yield();
			while (post(a, IBV_WR_SEND, 0, 8, 0, 0, i) == ENOMEM)
				std::this_thread::yield();
		}
	});
	std::thread poller([&] {
		struct ibv_wc wc;
		while (received < per_thread && std::chrono::steady_clock::now() < end)
			if (ibv_poll_cq(b.cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			    wc.opcode == IBV_WC_RECV)
				received++;
	});
	struct ibv_wc wc;
	while (sent < per_thread && std::chrono::steady_clock::now() < end)
		if (ibv_poll_cq(a.cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS)
			sent++;
	poster.join();
	poller.join();
	CHECK(received == per_thread);
	CHECK(sent == per_thread);
}

/* ---- How peers reach registered memory (lib/mr_memory.h) ---- */

namespace {

enum class Reach { Shared, Cma, Bounce };

/* What SHMVERBS_MEMORY_PATH and the environment must give. */
Reach expected_reach(bool shareable)
{
	const char *v = std::getenv("SHMVERBS_MEMORY_PATH");
	std::string policy = v && *v ? v : "auto";
	const bool cma = cma_works();
	if (policy == "bounce")
		return Reach::Bounce;
	if (policy == "cma")
		return cma ? Reach::Cma : Reach::Bounce;
	if (shareable)
		return Reach::Shared;
	return policy == "auto" && cma ? Reach::Cma : Reach::Bounce;
}

/* What the target really set up: its buffer page mapped from its memory
 * file, or a bounce file, or neither (CMA). */
Reach observed_reach(const TargetProc &t)
{
	if (mapped_from(t.pid, uintptr_t(t.addr), "shmverbs-memory"))
		return Reach::Shared;
	return mapped_from(t.pid, 0, "shmverbs-bounce") ? Reach::Bounce : Reach::Cma;
}

} // namespace

TEST_CASE("each MR is reached by the path the policy and the environment allow",
	  "[datapath][process][paths]")
{
	if (seccomp_mode)
		REQUIRE_FALSE(cma_works());
	for (BufKind kind : {BufKind::Heap, BufKind::File}) {
		CAPTURE(kind == BufKind::Heap ? "heap" : "file");
		TargetProc t(kind);
		CHECK(int(observed_reach(t)) == int(expected_reach(kind == BufKind::Heap)));
	}
}

namespace {

/* `n` connected to the target, and one signaled 16-byte WRITE of `text`
 * (wr_id 1) done. */
void connect_and_write(TargetProc &t, Node &n, const char *text)
{
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	std::memcpy(n.buf.data(), text, 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	REQUIRE(wc.status == IBV_WC_SUCCESS);
}

} // namespace

TEST_CASE("dereg_mr makes the memory private again and a late remote write fails",
	  "[datapath][process][paths]")
{
	TargetProc t;
	Node n;
	connect_and_write(t, n, "before-the-dereg");
	struct ibv_wc wc{};

	t.send("dereg");
	CHECK(t.line() == "dereged private\n");
	/* The same rkey, after dereg_mr returned: refused, nothing placed. */
	std::memcpy(n.buf.data(), "late-late-late!!", 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 2) == 0);
	REQUIRE(n.wait_wc(wc));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	t.send("check");
	std::string data;
	for (int i = 0; i < 4 && data.rfind("data ", 0) != 0; i++)
		data = t.line();
	CHECK(data.rfind("data before-the-dereg|", 0) == 0);
}

/* The sender keeps its hold on the target's key between posts; a dereg_mr
 * in the target must still end while the sender keeps writing with that
 * key, and from then on the writes are refused: a sender that never
 * idles must not keep the key alive. */
TEST_CASE("dereg_mr ends while a peer keeps writing with the key, and the writes then fail",
	  "[datapath][process][paths]")
{
	TargetProc t;
	Node n;
	connect_and_write(t, n, "while-the-dereg!");
	struct ibv_wc wc{};

	t.send("dereg");
	const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	uint64_t writes = 0;
	do {
		REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 2 + writes) == 0);
		REQUIRE(n.wait_wc(wc));
		writes++;
	} while (wc.status == IBV_WC_SUCCESS && std::chrono::steady_clock::now() < give_up);
	INFO(writes << " writes succeeded after the dereg was asked for");
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	CHECK(t.line() == "dereged private\n");
}

TEST_CASE("fork() after reg_mr: the child does not see the parent's later remote writes",
	  "[datapath][process][paths]")
{
	TargetProc t;
	Node n;
	REQUIRE(n.connect(t.qpn) == 0);
	t.send("connect " + std::to_string(n.qp->qp_num) + " 0");
	REQUIRE(t.line() == "ready\n");
	t.send("fork");
	REQUIRE(t.line() == "forked\n");
	std::memcpy(n.buf.data(), "after-the-fork!!", 16);
	REQUIRE(post(n, IBV_WR_RDMA_WRITE, 0, 16, t.addr, t.rkey, 1) == 0);
	struct ibv_wc wc{};
	REQUIRE(n.wait_wc(wc));
	REQUIRE(wc.status == IBV_WC_SUCCESS);
	t.send("check"); /* lets the child print, then the target checks */
	CHECK(t.line() == "child |\n"); /* fork-time contents: zeros */
	CHECK(t.line().rfind("data after-the-fork!!|", 0) == 0);
}
