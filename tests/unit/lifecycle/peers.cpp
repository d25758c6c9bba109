/* SPDX-License-Identifier: MIT */
/* The peer roles of the lifecycle tests (--peer ROLE ARGS). */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace lifecycle {

namespace {

/* One completion within ms (polled every 200 us). */
bool wait_one(struct ibv_cq *cq, struct ibv_wc &wc, int ms = 10000)
{
	return shmv_test::poll_one(cq, wc, ms, std::chrono::microseconds(200)) == 1;
}

/* A UD QP whose CQ has a completion channel: prints "qpn N", receives one
 * message, prints "got STATUS"; then exits, or with "wait" first reads a
 * line (the test kills it meanwhile). "armed": the CQ is armed before
 * "qpn N" and the message waited for with ibv_get_cq_event() (10 s at
 * most: "no event"). */
int ud_receiver(bool wait, bool armed)
{
	Dev d(IBV_QPT_UD, true);
	std::vector<char> buf(4096);
	struct ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	NEED(mr);
	struct ibv_sge sge = {uint64_t(uintptr_t(buf.data())), uint32_t(buf.size()), mr->lkey};
	struct ibv_recv_wr wr{}, *bad = nullptr;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	NEED(ibv_post_recv(d.qp, &wr, &bad) == 0);
	if (armed)
		NEED(ibv_req_notify_cq(d.cq, 0) == 0);
	std::printf("qpn %u\n", d.qp->qp_num);
	if (armed) {
		struct pollfd p = {d.ch->fd, POLLIN, 0};
		if (poll(&p, 1, 10000) != 1) {
			std::printf("no event\n");
			return 1;
		}
		struct ibv_cq *ev_cq = nullptr;
		void *ev_ctx = nullptr;
		NEED((ibv_get_cq_event(d.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == d.cq));
		ibv_ack_cq_events(d.cq, 1);
	}
	struct ibv_wc wc{};
	NEED(wait_one(d.cq, wc));
	std::printf("got %d\n", int(wc.status));
	if (wait) {
		char line[64];
		(void)!std::fgets(line, sizeof(line), stdin);
	}
	ibv_dereg_mr(mr);
	return 0;
}

/* An RC QP: prints "qpn N lid L", reads "QPN LID" (the test's QP),
 * connects and SENDs 16 bytes every 200 us, each completed before the next,
 * until told otherwise on stdin: "write RKEY ADDR" RDMA WRITEs 8 bytes
 * there, prints "wrote STATUS" and goes on sending; "stop" prints "sent N"
 * and ends. A sender that keeps posting: the progress thread's sweep never
 * finds its holds idle. */
int rc_streamer()
{
	Dev d(IBV_QPT_RC);
	PageBuf buf;
	struct ibv_mr *mr = ibv_reg_mr(d.pd, buf.p, buf.n, IBV_ACCESS_LOCAL_WRITE);
	NEED(mr);
	std::printf("qpn %u lid %u\n", d.qp->qp_num, unsigned(d.lid));
	char line[128];
	NEED(std::fgets(line, sizeof(line), stdin));
	unsigned dest = 0, lid = 0;
	NEED(std::sscanf(line, "%u %u", &dest, &lid) == 2);
	NEED(rc_to_rts(d.qp, dest, uint16_t(lid)) == 0);
	struct ibv_wc wc{};
	unsigned long sent = 0;
	for (;;) {
		struct pollfd p = {0, POLLIN, 0};
		if (poll(&p, 1, 0) == 1) {
			NEED(std::fgets(line, sizeof(line), stdin));
			unsigned rkey = 0;
			unsigned long long addr = 0;
			if (std::sscanf(line, "write %u %llu", &rkey, &addr) != 2)
				break;
			struct ibv_send_wr wr{};
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.wr.rdma.remote_addr = addr;
			wr.wr.rdma.rkey = rkey;
			NEED(shmv_test::post_send_sge(d.qp, wr, {buf.addr(), 8, mr->lkey}) == 0);
			NEED(wait_one(d.cq, wc));
			std::printf("wrote %d\n", int(wc.status));
			continue;
		}
		NEED(post_send(d.qp, mr, buf, sent) == 0);
		NEED(wait_one(d.cq, wc));
		if (wc.status != IBV_WC_SUCCESS)
			std::fprintf(stderr, "peer: SEND %lu: %s\n", sent, ibv_wc_status_str(wc.status));
		NEED(wc.status == IBV_WC_SUCCESS);
		sent++;
		std::this_thread::sleep_for(std::chrono::microseconds(200));
	}
	std::printf("sent %lu\n", sent);
	ibv_dereg_mr(mr);
	return 0;
}

} // namespace

int peer_main(const char *role, int argc, char **argv)
{
	in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	if (std::strcmp(role, "ud-receiver") == 0)
		return ud_receiver(argc > 0 && std::strcmp(argv[0], "wait") == 0,
				   argc > 1 && std::strcmp(argv[1], "armed") == 0);
	if (std::strcmp(role, "rc-streamer") == 0)
		return rc_streamer();
	std::fprintf(stderr, "unknown peer role %s\n", role);
	return 2;
}

} // namespace lifecycle
