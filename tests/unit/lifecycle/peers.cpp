/* SPDX-License-Identifier: MIT */
/* The peer roles of the lifecycle tests (--peer ROLE ARGS). */
#include "lifecycle.h"

#include <catch2/catch.hpp>

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
 * line (the test kills it meanwhile). */
int ud_receiver(bool wait)
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
	std::printf("qpn %u\n", d.qp->qp_num);
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

} // namespace

int peer_main(const char *role, int argc, char **argv)
{
	in_peer = true;
	setvbuf(stdout, nullptr, _IOLBF, 0);
	if (std::strcmp(role, "ud-receiver") == 0)
		return ud_receiver(argc > 0 && std::strcmp(argv[0], "wait") == 0);
	std::fprintf(stderr, "unknown peer role %s\n", role);
	return 2;
}

} // namespace lifecycle
