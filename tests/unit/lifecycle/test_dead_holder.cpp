/* SPDX-License-Identifier: MIT */
/*
 * ibv_dereg_mr and a remote process holding the key (item: a peer that died
 * holding a key must not hang dereg). The holder is a real process that
 * takes the key in our segment exactly as the send engine does and then
 * stops itself in the middle of its "operation" (tests/unit/lifecycle/
 * key_holder.cpp). Last, a live holder that keeps posting: the send
 * engine of a peer that wrote to the MR and streams SENDs on.
 */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <vector>

using namespace lifecycle;

namespace {

struct HeldKey {
	Dev dev{IBV_QPT_RC};
	/* Pages of its own: ibv_dereg_mr() runs in a thread while this one
	 * reads the holder's pipe into a stdio buffer on the heap, and a
	 * system call writing into a page that dereg switches back to private
	 * memory fails with EFAULT (docs/verbs.md, ibv_reg_mr). */
	PageBuf buf;
	struct ibv_mr *mr = nullptr;

	HeldKey()
	{
		mr = ibv_reg_mr(dev.pd, buf.p, buf.n,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		REQUIRE(mr);
	}
	std::vector<std::string> holder_argv() const
	{
		const char *path = getenv("SHMVERBS_TEST_KEY_HOLDER");
		REQUIRE(path);
		return {path, std::to_string(dev.qp->qp_num), std::to_string(mr->rkey)};
	}
};

} // namespace

TEST_CASE("dereg_mr waits while a live process holds the key, and returns when it lets go",
	  "[lifecycle][dead-holder]")
{
	HeldKey k;
	Proc holder(k.holder_argv());
	REQUIRE(holder.line() == "held");
	REQUIRE(holder.wait_stopped());
	int rc = -1;
	{
		Call dereg([&] { rc = ibv_dereg_mr(k.mr); });
		/* Stopped, but alive: its operation may still touch the memory. */
		CHECK_FALSE(dereg.wait(300));
		REQUIRE(kill(holder.pid, SIGCONT) == 0);
		CHECK(holder.line() == "released");
		CHECK(dereg.wait(5000));
	}
	CHECK(rc == 0);
	CHECK(holder.reap() == 0);
}

TEST_CASE("dereg_mr returns promptly when the process holding the key is killed mid-hold",
	  "[lifecycle][dead-holder]")
{
	for (bool reaped : {false, true}) {
		CAPTURE(reaped);
		HeldKey k;
		Proc holder(k.holder_argv());
		REQUIRE(holder.line() == "held");
		REQUIRE(holder.wait_stopped());
		int rc = -1;
		{
			Call dereg([&] { rc = ibv_dereg_mr(k.mr); });
			CHECK_FALSE(dereg.wait(200));
			REQUIRE(kill(holder.pid, SIGKILL) == 0);
			/* Unreaped, the holder is a zombie: as dead as a reaped one. */
			if (reaped)
				CHECK(holder.reap() == 128 + SIGKILL);
			auto t0 = std::chrono::steady_clock::now();
			CHECK(dereg.wait(1000));
			CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
		}
		CHECK(rc == 0);
	}
}

/* A sender keeps the rkey of its last RDMA WRITE held between posts (one
 * hold, no locked instruction per WR), and the progress thread lets go of
 * holds only when no post came for a while. A sender that goes on posting
 * SENDs must still let go of that rkey once its owner deregisters it: the
 * end of each post looks whether a held key was withdrawn. */
TEST_CASE("dereg_mr returns while the peer that wrote to it keeps sending to us",
	  "[lifecycle][held-key]")
{
	Dev me(IBV_QPT_RC);
	/* A receive queue of its own, deep enough that the stream never meets
	 * RNR (whose retry lets go of every hold and would hide a missing
	 * check). */
	struct ibv_qp_init_attr qa{};
	qa.send_cq = qa.recv_cq = me.cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = 1024;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(me.pd, &qa);
	REQUIRE(qp);
	shmv_test::QpPath path;
	path.access = IBV_ACCESS_REMOTE_WRITE;
	REQUIRE(shmv_test::qp_to_init(qp, IBV_QPT_RC, path) == 0); /* receives go in from INIT */
	PageBuf target, rbuf;
	struct ibv_mr *wmr = ibv_reg_mr(me.pd, target.p, target.n,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(me.pd, rbuf.p, rbuf.n, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE((wmr && rmr));
	auto post_recv = [&](uint64_t id) {
		return shmv_test::post_recv_sge(qp, {rbuf.addr(64 * (id % 64)), 64, rmr->lkey}, id);
	};
	int refused = 0;
	for (uint64_t i = 0; i < 1024; i++)
		refused += post_recv(i) != 0;
	REQUIRE(refused == 0);

	Proc peer({"self", "--peer", "rc-streamer"});
	unsigned qpn = 0, lid = 0;
	REQUIRE(std::sscanf(peer.line().c_str(), "qpn %u lid %u", &qpn, &lid) == 2);
	REQUIRE(shmv_test::qp_init_to_rts(qp, IBV_QPT_RC, qpn, uint16_t(lid), path) == 0);
	peer.send(std::to_string(qp->qp_num) + " " + std::to_string(me.lid));

	/* Our side of the stream: every receive reposted as it completes. */
	std::atomic<bool> stop{false};
	std::atomic<uint64_t> received{0};
	std::thread receiver([&] {
		struct ibv_wc wc;
		while (!stop.load()) {
			if (ibv_poll_cq(me.cq, 1, &wc) != 1) {
				std::this_thread::yield();
				continue;
			}
			if (wc.status == IBV_WC_SUCCESS && post_recv(wc.wr_id + 1024) == 0)
				received.fetch_add(1);
		}
	});
	/* The stream runs; one WRITE in its middle, then more SENDs. */
	REQUIRE(eventually([&] { return received.load() >= 20; }, 5000));
	REQUIRE(peer.ask("write " + std::to_string(wmr->rkey) + " " +
			 std::to_string(target.addr())) == "wrote 0");
	const uint64_t at_write = received.load();
	REQUIRE(eventually([&] { return received.load() >= at_write + 20; }, 5000));
	int rc = -1;
	std::string sent;
	{
		Call dereg([&] { rc = ibv_dereg_mr(wmr); });
		CHECK(dereg.wait(3000));
		/* It returned while the stream went on. */
		const uint64_t at_dereg = received.load();
		CHECK(eventually([&] { return received.load() >= at_dereg + 20; }, 5000));
		sent = peer.ask("stop"); /* a hold still kept ends with the stream */
		CHECK(dereg.wait(10000));
	}
	CHECK(rc == 0);
	stop = true;
	receiver.join();
	CHECK(sent.rfind("sent ", 0) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
	ibv_dereg_mr(rmr);
}

namespace {

/* ibv_bind_mw() of `mw` over `len` bytes of mr (0: unbind) on qp, and its
 * completion: the status, or -1 when none came within ms. */
int bind_and_wait(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mw *mw, struct ibv_mr *mr,
		  uint64_t len, int ms)
{
	struct ibv_mw_bind bind{};
	bind.wr_id = 77;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info.mr = mr;
	bind.bind_info.addr = uint64_t(uintptr_t(mr->addr));
	bind.bind_info.length = len;
	bind.bind_info.mw_access_flags = len ? IBV_ACCESS_REMOTE_WRITE : 0;
	if (ibv_bind_mw(qp, mw, &bind))
		return -2;
	struct ibv_wc wc{};
	if (shmv_test::poll_one(cq, wc, ms) != 1)
		return -1;
	return wc.wr_id == 77 ? int(wc.status) : -3;
}

} // namespace

/* More processes than a key has holder entries hold a window's key at
 * once; the one counted anonymously is killed mid-hold. Its hold can be
 * told from a live one by nobody: the window's next bind, which runs on
 * the send queue and may not block there, waits for it 2 s, as
 * ibv_dereg_mr() does, and not for ever. */
TEST_CASE("a window's rebind waits at most 2 s for a hold of a process it cannot name",
	  "[lifecycle][dead-holder][mw]")
{
	Dev dev(IBV_QPT_RC);
	REQUIRE(rc_to_rts(dev.qp, dev.qp->qp_num, dev.lid) == 0);
	std::vector<char> buf(4096);
	struct ibv_mr *mr = ibv_reg_mr(dev.pd, buf.data(), buf.size(),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	REQUIRE(mr);
	struct ibv_mw *mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_1);
	REQUIRE(mw);
	REQUIRE(bind_and_wait(dev.qp, dev.cq, mw, mr, buf.size(), 5000) == IBV_WC_SUCCESS);

	const char *path = getenv("SHMVERBS_TEST_KEY_HOLDER");
	REQUIRE(path);
	const std::vector<std::string> argv = {path, std::to_string(dev.qp->qp_num),
					       std::to_string(mw->rkey)};
	std::vector<std::unique_ptr<Proc>> named;
	for (int i = 0; i < 6; i++) { /* key_holder_entries */
		named.push_back(std::make_unique<Proc>(argv));
		REQUIRE(named.back()->line() == "held");
		REQUIRE(named.back()->wait_stopped());
	}
	{
		Proc unnamed(argv);
		REQUIRE(unnamed.line() == "held");
		REQUIRE(unnamed.wait_stopped());
		REQUIRE(kill(unnamed.pid, SIGKILL) == 0);
		CHECK(unnamed.reap() == 128 + SIGKILL);
	}
	for (auto &p : named) {
		REQUIRE(kill(p->pid, SIGCONT) == 0);
		CHECK(p->line() == "released");
		CHECK(p->reap() == 0);
	}
	const auto t0 = std::chrono::steady_clock::now();
	CHECK(bind_and_wait(dev.qp, dev.cq, mw, mr, 0, 10000) == IBV_WC_SUCCESS);
	const auto waited = std::chrono::steady_clock::now() - t0;
	CHECK(waited >= std::chrono::milliseconds(1900));
	CHECK(waited < std::chrono::seconds(6));
	/* Given up on once: the slot's later withdrawals do not wait for that
	 * hold again (a bind, an unbind, the deallocation). */
	const auto t1 = std::chrono::steady_clock::now();
	CHECK(bind_and_wait(dev.qp, dev.cq, mw, mr, buf.size(), 10000) == IBV_WC_SUCCESS);
	CHECK(bind_and_wait(dev.qp, dev.cq, mw, mr, 0, 10000) == IBV_WC_SUCCESS);
	CHECK(ibv_dealloc_mw(mw) == 0);
	CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(1500));
	CHECK(ibv_dereg_mr(mr) == 0);
}
