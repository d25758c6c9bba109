/* SPDX-License-Identifier: MIT */
/*
 * Multi-process stress test of the data path, through <infiniband/verbs.h>
 * only. The binary is its own coordinator (no verbs) and re-executes itself
 * as N workers (tests/unit/common/procs.h). Every pair of workers connects
 * `nrc` RC QPs, a UC QP, an RC QP on each side's SRQ and an XRC path each
 * way (XRC_SEND -> XRC_RECV -> XRC SRQ); each worker has one UD QP that
 * talks to all. Rounds:
 *
 *   1. every worker posts exactly the receives the schedule (schedule.h)
 *      says its peers will consume this round (on RC queues it may hold
 *      back a tail of them until its send phase: senders then wait in RNR
 *      and the progress thread retries);                allgather (barrier)
 *   2. every worker posts its own schedule, randomly interleaved across
 *      channels, batched, through ibv_post_send or ibv_wr_*, and runs its
 *      critical sections (CMP_AND_SWP lock at the round's holder), while
 *      polling its CQs (ibv_poll_cq, ibv_start_poll, a completion channel);
 *      it waits until every send WR retired and every expected receive
 *      arrived;                                           allgather (barrier)
 *   3. the holder checks the lock's protected counters; anything polled
 *      now is unexpected.
 *
 * Alongside, each worker's second thread posts and polls on QPs and a CQ
 * of its own (WRITE, READ back, FETCH_AND_ADD toward the next rank), and
 * between rounds some QPs are reset or re-created and connected again.
 *
 * At the end: every FETCH_AND_ADD result is gathered and each counter's
 * owner checks that the returned values tile [0, final) exactly (atomicity
 * across processes) and that final = the sum of the schedules' adds; every
 * CMP_AND_SWP word holds what its schedule leaves.
 *
 * Checked on every completion: status, wr_id (send: in posting order per
 * QP, unsignaled WRs retired by the next signaled one; receive: the WQE the
 * queue had to consume), opcode, byte_len, imm_data, src_qp and slid (UD),
 * and every payload byte (SEND at the receiver, WRITE by the owner at the
 * next receive of the channel or at the end of the round, READ at the
 * initiator). Nothing may be lost: receives are posted before the round
 * starts, so neither UC nor UD has a reason to drop.
 *
 * Usage: unit-stress [--procs N] [--rounds R] [--ops M] [--rc K] [--seed S]
 *                    [--quick]
 */
#include "worker.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace stress;

int main(int argc, char **argv)
{
	Config c;
	bool worker = false, seeded = false;
	unsigned rank = 0;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto num = [&](unsigned long long &out) {
			if (i + 1 >= argc)
				return false;
			char *end = nullptr;
			out = std::strtoull(argv[++i], &end, 0);
			return *end == 0;
		};
		unsigned long long v = 0;
		bool ok = true;
		if (a == "--quick") {
			c.rounds = 40;
			c.max_ops = 12;
		} else if (a == "--worker") {
			worker = true;
			ok = num(v);
			rank = unsigned(v);
		} else if (a == "--procs") {
			ok = num(v) && v >= 2 && v <= max_procs;
			c.procs = unsigned(v);
		} else if (a == "--rounds") {
			ok = num(v) && v >= 1 && v <= 10000;
			c.rounds = unsigned(v);
		} else if (a == "--ops") {
			ok = num(v) && v <= 64;
			c.max_ops = unsigned(v);
		} else if (a == "--rc") {
			ok = num(v) && v >= 1 && v + 4 <= max_slots;
			c.nrc = unsigned(v);
		} else if (a == "--seed") {
			ok = num(v);
			c.seed = v;
			seeded = true;
		} else {
			ok = false;
		}
		if (!ok) {
			std::fprintf(stderr, "usage: %s [--procs 2..%u] [--rounds R] [--ops M] [--rc K] "
				     "[--seed S] [--quick]\n", argv[0], max_procs);
			return 2;
		}
	}
	if (!seeded)
		c.seed = (uint64_t(std::random_device()()) << 32) | std::random_device()();
	if (worker) {
		/* The port's MTU decides how large a UD message may be. */
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);
		if (list && n > 0) {
			if (struct ibv_context *ctx = ibv_open_device(list[0])) {
				struct ibv_port_attr pa{};
				if (ibv_query_port(ctx, 1, &pa) == 0)
					c.ud_mtu = 128u << pa.active_mtu;
				ibv_close_device(ctx);
			}
		}
		if (list)
			ibv_free_device_list(list);
		Worker w(c, rank);
		return w.run();
	}
	std::printf("unit-stress: seed %" PRIu64 ", %u processes, %u rounds, up to %u ops per channel "
		    "(reproduce with --seed %" PRIu64 ")\n", c.seed, c.procs, c.rounds, c.max_ops, c.seed);
	std::fflush(stdout);
	auto start = Clock::now();
	shmv_test::ProcessGroup group(int(c.procs), [&](int r) {
		return std::vector<std::string>{argv[0], "--worker", std::to_string(r),
			"--procs", std::to_string(c.procs), "--rounds", std::to_string(c.rounds),
			"--ops", std::to_string(c.max_ops), "--rc", std::to_string(c.nrc),
			"--seed", std::to_string(c.seed)};
	});
	std::string err = group.serve(2 * wait_ms);
	double secs = std::chrono::duration<double>(Clock::now() - start).count();
	if (!err.empty()) {
		std::fprintf(stderr, "unit-stress: FAILED after %.1f s, seed %" PRIu64 ": %s\n", secs,
			     c.seed, err.c_str());
		return 1;
	}
	std::printf("unit-stress: passed in %.1f s (seed %" PRIu64 ")\n", secs, c.seed);
	return 0;
}
