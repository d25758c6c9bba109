/* SPDX-License-Identifier: MIT */
/*
 * fork() without exec. The child opens the device itself and runs the data
 * path like any process (its own segment, broker registration and progress
 * thread); the parent's objects fail in the child with EIO and leave the
 * parent's state alone; the parent keeps working. Run with and without
 * RDMAV_FORK_SAFE (tests/meson.build).
 */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

using namespace lifecycle;

namespace {

using shmv_test::wait_wc;

int post_recv(struct ibv_qp *qp, struct ibv_mr *mr, const PageBuf &b, uint64_t wr_id)
{
	return shmv_test::post_recv_sge(qp, {b.addr(), 1024, mr->lkey}, wr_id);
}

int child_failures = 0;
void expect(bool ok, const char *what)
{
	if (!ok) {
		std::fprintf(stderr, "child: expected %s (errno %d)\n", what, errno);
		child_failures++;
	}
}

/* An extended CQ of the parent (ibv_start_poll() is not a context slot). */
struct ibv_cq_ex *parent_cq_ex = nullptr;
/* A completion channel of the parent. */
struct ibv_comp_channel *parent_channel = nullptr;

/* The child: first the parent's objects, then its own device. Reports its
 * UD QP number on `to_parent`; exits 0 when everything held. */
[[noreturn]] void child_main(UdEnd &parent, int to_parent, int from_parent)
{
	in_peer = true;
	/* 1. The parent's objects: EIO, nothing done. */
	errno = 0;
	expect(ibv_alloc_pd(parent.dev.ctx) == nullptr && errno == EIO, "alloc_pd EIO");
	struct ibv_device_attr da{};
	expect(ibv_query_device(parent.dev.ctx, &da) == EIO, "query_device EIO");
	expect(post_send(parent.dev.qp, parent.mr, parent.buf, 1, parent.ah,
			 parent.dev.qp->qp_num) == EIO, "post_send EIO");
	expect(post_recv(parent.dev.qp, parent.mr, parent.buf, 1) == EIO, "post_recv EIO");
	struct ibv_wc wc{};
	expect(ibv_poll_cq(parent.dev.cq, 1, &wc) < 0, "poll_cq < 0");
	struct ibv_poll_cq_attr pa{};
	expect(ibv_start_poll(parent_cq_ex, &pa) == EIO, "start_poll EIO"); /* not ENOENT */
	expect(ibv_req_notify_cq(parent.dev.cq, 0) == EIO, "req_notify_cq EIO");
	struct ibv_qp_attr qa{};
	qa.qp_state = IBV_QPS_ERR;
	expect(ibv_modify_qp(parent.dev.qp, &qa, IBV_QP_STATE) == EIO, "modify_qp EIO");
	expect(ibv_dereg_mr(parent.mr) == EIO, "dereg_mr EIO");
	errno = 0;
	expect(ibv_alloc_mw(parent.dev.pd, IBV_MW_TYPE_2) == nullptr && errno == EIO, "alloc_mw EIO");
	expect(ibv_destroy_qp(parent.dev.qp) == EIO, "destroy_qp EIO");
	/* The verbs whose convention is -1 and errno say so the same way. */
	union ibv_gid gid;
	errno = 0;
	expect(ibv_query_gid(parent.dev.ctx, 1, 0, &gid) == -1 && errno == EIO, "query_gid -1, EIO");
	__be16 pkey;
	errno = 0;
	expect(ibv_query_pkey(parent.dev.ctx, 1, 0, &pkey) == -1 && errno == EIO,
	       "query_pkey -1, EIO");
	struct ibv_async_event ev;
	errno = 0;
	expect(ibv_get_async_event(parent.dev.ctx, &ev) == -1 && errno == EIO,
	       "get_async_event -1, EIO");
	struct ibv_cq *ev_cq = nullptr;
	void *ev_ctx = nullptr;
	errno = 0;
	expect(ibv_get_cq_event(parent_channel, &ev_cq, &ev_ctx) == -1 && errno == EIO,
	       "get_cq_event -1, EIO");
	/* libibverbs' close returns 0 whatever happens; nothing is done. */
	expect(ibv_close_device(parent.dev.ctx) == 0, "close_device 0");
	expect(ibv_query_device(parent.dev.ctx, &da) == EIO, "query_device EIO after close");

	/* 2. Its own device, talking to the parent. */
	{
		UdEnd own;
		NEED(post_recv(own.dev.qp, own.mr, own.buf, 7) == 0);
		uint32_t qpn = own.dev.qp->qp_num;
		NEED(write(to_parent, &qpn, sizeof(qpn)) == sizeof(qpn));
		std::memcpy(own.buf.p + 2048, "from-the-child!", 16);
		NEED(post_send(own.dev.qp, own.mr, own.buf, 8, own.ah, parent.dev.qp->qp_num) == 0);
		NEED(wait_wc(own.dev.cq, wc));
		expect(wc.wr_id == 8 && wc.status == IBV_WC_SUCCESS, "own send completes");
		NEED(wait_wc(own.dev.cq, wc));
		expect(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS, "the parent's reply");
		expect(std::memcmp(own.buf.p + 40, "from-the-parent", 16) == 0, "reply data");
	}
	/* 3. Its own progress thread: an RC SEND waiting in RNR until the
	 * receive is posted is retried by it. */
	{
		Dev a(IBV_QPT_RC), b(IBV_QPT_RC);
		PageBuf ab, bb;
		struct ibv_mr *amr = ibv_reg_mr(a.pd, ab.p, ab.n, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *bmr = ibv_reg_mr(b.pd, bb.p, bb.n, IBV_ACCESS_LOCAL_WRITE);
		NEED((amr && bmr));
		/* Windows of its own (lib/mw.cpp keeps a registry per process). */
		struct ibv_mw *mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_1);
		expect(mw && ibv_dealloc_mw(mw) == 0, "a window of its own");
		NEED(rc_to_rts(a.qp, b.qp->qp_num, a.lid) == 0);
		NEED(rc_to_rts(b.qp, a.qp->qp_num, b.lid) == 0);
		NEED(post_send(a.qp, amr, ab, 9) == 0);
		std::this_thread::sleep_for(std::chrono::milliseconds(30));
		NEED(post_recv(b.qp, bmr, bb, 10) == 0);
		NEED(wait_wc(a.cq, wc, 5000));
		expect(wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS, "RNR retried by the progress thread");
		NEED(wait_wc(b.cq, wc));
		ibv_destroy_qp(a.qp);
		a.qp = nullptr;
		ibv_destroy_qp(b.qp);
		b.qp = nullptr;
		ibv_dereg_mr(amr);
		ibv_dereg_mr(bmr);
	}
	char c;
	(void)!read(from_parent, &c, 1); /* the parent is done with us */
	std::_Exit(child_failures ? 20 + child_failures : 0);
}

} // namespace

TEST_CASE("fork: the child opens the device and runs the data path; the parent's objects are EIO "
	  "there; the parent keeps working",
	  "[lifecycle][fork]")
{
	UdEnd parent;
	REQUIRE(post_recv(parent.dev.qp, parent.mr, parent.buf, 1) == 0);
	struct ibv_cq_init_attr_ex cqa{};
	cqa.cqe = 4;
	cqa.wc_flags = IBV_WC_STANDARD_FLAGS;
	parent_cq_ex = ibv_create_cq_ex(parent.dev.ctx, &cqa);
	REQUIRE(parent_cq_ex);
	parent_channel = ibv_create_comp_channel(parent.dev.ctx);
	REQUIRE(parent_channel);
	struct CqExGuard {
		~CqExGuard()
		{
			ibv_destroy_cq(ibv_cq_ex_to_cq(parent_cq_ex));
			parent_cq_ex = nullptr;
			ibv_destroy_comp_channel(parent_channel);
			parent_channel = nullptr;
		}
	} cq_ex_guard;
	int up[2], down[2];
	REQUIRE(pipe(up) == 0);
	REQUIRE(pipe(down) == 0);
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0)
		child_main(parent, up[1], down[0]);
	close(up[1]);
	close(down[0]);

	uint32_t child_qpn = 0;
	struct pollfd p = {up[0], POLLIN, 0};
	REQUIRE(poll(&p, 1, 15000) == 1);
	REQUIRE(read(up[0], &child_qpn, sizeof(child_qpn)) == sizeof(child_qpn));
	struct ibv_wc wc{};
	REQUIRE(wait_wc(parent.dev.cq, wc));
	CHECK(wc.wr_id == 1);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(wc.src_qp == child_qpn);
	CHECK(std::memcmp(parent.buf.p + 40, "from-the-child!", 16) == 0);
	std::memcpy(parent.buf.p + 2048, "from-the-parent", 16);
	REQUIRE(post_send(parent.dev.qp, parent.mr, parent.buf, 2, parent.ah, child_qpn) == 0);
	REQUIRE(wait_wc(parent.dev.cq, wc));
	CHECK(wc.wr_id == 2);
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(write(down[1], "x", 1) == 1);
	int status = -1;
	REQUIRE(eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 20000));
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);
	close(up[0]);
	close(down[1]);

	/* The parent's objects are intact: a SEND to itself. */
	REQUIRE(post_recv(parent.dev.qp, parent.mr, parent.buf, 3) == 0);
	REQUIRE(post_send(parent.dev.qp, parent.mr, parent.buf, 4, parent.ah,
			  parent.dev.qp->qp_num) == 0);
	int got = 0;
	for (int i = 0; i < 2 && wait_wc(parent.dev.cq, wc); i++) {
		CHECK(wc.status == IBV_WC_SUCCESS);
		got++;
	}
	CHECK(got == 2);
}
