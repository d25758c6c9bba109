/* SPDX-License-Identifier: MIT */
/* Helpers of the lifecycle tests (main.cpp): peer processes, bounded waits. */
#pragma once

#include <infiniband/verbs.h>

#include "../common/peer.h"

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace lifecycle {

/* Set in a peer process: NEED (../common/peer.h) exits there instead of
 * REQUIRE. */
using shmv_test::in_peer;

/* The peer side of the binary (--peer ROLE ARGS): peers.cpp. */
int peer_main(const char *role, int argc, char **argv);

/* A child process (this binary as a peer, or another program) whose stdin
 * and stdout are pipes to us; its lines come without their newline. Killed
 * (SIGKILL) and reaped at scope end. */
struct Proc : shmv_test::PeerProc {
	/* argv[0] is the program; "self" re-executes this binary. */
	explicit Proc(std::vector<std::string> argv) : PeerProc(std::move(argv), Lines::Trimmed) {}
};

/* An open device with a PD, a CQ (with a completion channel if asked)
 * and a QP of `type` in RTS (UD) or INIT (RC). */
struct Dev {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	struct ibv_comp_channel *ch = nullptr;
	struct ibv_cq *cq = nullptr;
	struct ibv_qp *qp = nullptr;
	uint16_t lid = 0;

	explicit Dev(enum ibv_qp_type type = IBV_QPT_UD, bool channel = false);
	~Dev();
	Dev(const Dev &) = delete;
	Dev &operator=(const Dev &) = delete;
};

constexpr uint32_t ud_qkey = 0x11111111;

/* An RC QP (in INIT, as Dev makes it) to RTS toward `dest` on port 1. */
int rc_to_rts(struct ibv_qp *qp, uint32_t dest, uint16_t lid, uint8_t min_rnr_timer = 1);

/* Page-aligned memory (registered ranges are whole pages under
 * ibv_fork_init, as rdma-core programs allocate them). */
struct PageBuf {
	char *p = nullptr;
	size_t n = 4096;
	PageBuf();
	~PageBuf();
	PageBuf(const PageBuf &) = delete;
	PageBuf &operator=(const PageBuf &) = delete;
	uint64_t addr(size_t off = 0) const { return uint64_t(uintptr_t(p + off)); }
};

/* A SEND of 16 bytes from b + 2048 (UD: to qpn through ah, ud_qkey). */
int post_send(struct ibv_qp *qp, struct ibv_mr *mr, const PageBuf &b, uint64_t wr_id,
	      struct ibv_ah *ah = nullptr, uint32_t qpn = 0);

/* A UD Dev with a registered PageBuf and an AH to its own port. */
struct UdEnd {
	Dev dev{IBV_QPT_UD};
	PageBuf buf;
	struct ibv_mr *mr = nullptr;
	struct ibv_ah *ah = nullptr;

	UdEnd();
	~UdEnd();
	UdEnd(const UdEnd &) = delete;
	UdEnd &operator=(const UdEnd &) = delete;
};

/* A call running in a thread of its own, so that a test can watch it
 * block. A call that never returns ends the test binary (exit 1) when the
 * Call goes out of scope: the thread cannot be abandoned safely. */
class Call {
public:
	explicit Call(std::function<void()> fn);
	~Call();
	Call(const Call &) = delete;
	Call &operator=(const Call &) = delete;
	bool returned() const;
	/* Waits up to ms for the call to return: whether it did. */
	bool wait(int ms);

private:
	std::shared_ptr<std::atomic<bool>> done_;
	std::thread thread_;
};

/* Open descriptors of this process. */
int count_fds();
/* Of those, the eventfds (a completion channel's, among others). */
int count_eventfds();

/* Polls until pred() or ms elapsed; pred()'s last value. */
bool eventually(const std::function<bool()> &pred, int ms = 10000);

} // namespace lifecycle
