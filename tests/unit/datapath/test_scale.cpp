/* SPDX-License-Identifier: MIT */
/*
 * Scale: the cost of idle QPs. A process may hold thousands of QPs of which
 * few are busy; the progress thread must not spend its time visiting the
 * idle ones (lib/progress.cpp).
 */
#include "loopback.h"

#include <sys/resource.h>

namespace {

double cpu_seconds()
{
	struct rusage ru{};
	getrusage(RUSAGE_SELF, &ru);
	return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

} // namespace

TEST_CASE("thousands of idle QPs cost the progress thread nothing while one waits on RNR",
	  "[scale]")
{
	loopback::Options o;
	o.cqe = 16;
	loopback::Pair p(o);
	constexpr int idle_qps = 4096;
	std::vector<struct ibv_qp *> idle;
	for (int i = 0; i < idle_qps; i++) {
		struct ibv_qp_init_attr a{};
		a.send_cq = p.a.cq;
		a.recv_cq = p.a.cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = 4;
		a.cap.max_recv_wr = 4;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		struct ibv_qp *qp = ibv_create_qp(p.pd, &a);
		REQUIRE(qp);
		idle.push_back(qp);
	}
	/* b has no receive posted: a's SEND waits on the RNR timer (10 us,
	 * retried forever), so the progress thread runs every millisecond. */
	REQUIRE(loopback::Pair::up(p.a, p.b.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	REQUIRE(loopback::Pair::up(p.b, p.a.qp->qp_num, p.lid, IBV_QPT_RC) == 0);
	struct ibv_sge sg = {p.a.addr(0), 64, p.a.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 7;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	REQUIRE(ibv_post_send(p.a.qp, &wr, &bad) == 0);
	std::this_thread::sleep_for(std::chrono::milliseconds(50));

	/* This thread sleeps: what the process burns is the progress thread's.
	 * Visiting every QP each millisecond costs over 20% of a CPU here;
	 * retrying only the waiting one costs a wake-up. */
	auto t0 = std::chrono::steady_clock::now();
	double c0 = cpu_seconds();
	std::this_thread::sleep_for(std::chrono::milliseconds(500));
	double cpu = cpu_seconds() - c0;
	double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	INFO("progress thread: " << cpu * 1e3 << " ms of CPU in " << wall * 1e3 << " ms");
	CHECK(cpu < 0.10 * wall);

	/* The waiting WR is still retried: a receive lets it through. */
	struct ibv_wc wc{};
	CHECK(loopback::Pair::quiet(p.a, 5));
	REQUIRE(loopback::Pair::post_recv(p.b, 9, 0, 64) == 0);
	REQUIRE(loopback::Pair::wait_wc(p.a, wc));
	CHECK(wc.wr_id == 7);
	CHECK(wc.status == IBV_WC_SUCCESS);
	REQUIRE(loopback::Pair::wait_wc(p.b, wc));
	CHECK(wc.wr_id == 9);
	for (struct ibv_qp *qp : idle)
		CHECK(ibv_destroy_qp(qp) == 0);
}
