/* SPDX-License-Identifier: MIT */
/*
 * The stress test's worker (one process of unit-stress): its verbs objects,
 * the bookkeeping of every WR and WQE it posted, and the checks. See
 * stress.cpp for what is tested; schedule.h for what every process does.
 * worker.cpp: setup, receives, completions; worker_sends.cpp: sends,
 * critical sections, the noise thread, end-of-round and final checks.
 */
#pragma once

#include "../common/procs.h"
#include "schedule.h"

#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace stress {

using Clock = std::chrono::steady_clock;

constexpr unsigned max_procs = 8;
constexpr unsigned max_slots = 8;
constexpr uint32_t ud_qkey = 0x11111111;
constexpr size_t arena_bytes = 64ull << 20;
constexpr int wait_ms = 60000;     /* any single wait: only reached on failure */
constexpr uint64_t recv_tag = 1ull << 63;
constexpr unsigned sq_depth = 128;

/* What a worker tells the others (allgather at start). */
struct Info {
	uint16_t lid;
	uint32_t ud_qpn;
	uint32_t xrc_srqn;
	uint32_t qpn[max_procs][max_slots]; /* my QP facing peer p in slot s (RC, UC, SRQ-RC) */
	uint32_t xrc_send[max_procs];       /* my XRC_SEND toward peer p */
	uint32_t xrc_recv[max_procs];       /* my XRC_RECV for peer p's XRC_SEND */
	uint64_t win_addr, read_addr, atom_addr, lock_addr;
	uint32_t win_rkey, read_rkey, atom_rkey, lock_rkey;
	uint32_t noise_out, noise_in; /* QPNs toward the next rank, from the previous */
	uint64_t noise_addr;
	uint32_t noise_rkey;
};

/* A FETCH_AND_ADD's result, gathered at the end. */
struct AddRecord {
	uint32_t owner, counter;
	uint64_t old, add;
};

struct Stats {
	uint64_t ops[16]; /* by ibv_wr_opcode */
	uint64_t noise_iters, noise_adds;
	uint64_t bytes, recvs, late_recvs, churned, events, cs, cas_retries, ex_batches, legacy_posts;
};

inline const char *opname(int op)
{
	switch (op) {
	case IBV_WR_SEND: return "SEND";
	case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
	case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
	case IBV_WR_RDMA_READ: return "RDMA_READ";
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return "FETCH_AND_ADD";
	case IBV_WR_ATOMIC_CMP_AND_SWP: return "CMP_AND_SWP";
	default: return "?";
	}
}

inline enum ibv_wc_opcode send_wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
	default: return IBV_WC_SEND;
	}
}

/* A completion, whichever API polled it. */
struct Wc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, imm, qp_num, src_qp, flags;
	uint16_t slid;
	const char *cq;
};

/* A send WR posted and not yet retired. */
struct Pending {
	uint64_t wr_id;
	bool signaled;
	int chan; /* index in Worker::out_, -1: a critical-section op */
	int op;
	enum ibv_wr_opcode opcode;
	uint32_t len;
	char *local;
};

struct QpRec {
	struct ibv_qp *qp = nullptr;
	struct ibv_qp_ex *qpx = nullptr; /* created with ibv_create_qp_ex: ibv_wr_* allowed */
	Kind kind = Kind::Rc;
	int peer = -1;
	unsigned slot = 0;
	bool xrc_recv = false;
	std::deque<Pending> sq;
	unsigned trailing_unsignaled = 0;
	std::deque<uint32_t> rq; /* our receive WQEs, in posting order */
};

enum class Queue { Rq, Srq, XrcSrq, Ud };

struct Wqe {
	std::vector<struct ibv_sge> sge;
	Queue queue;
	QpRec *owner; /* Queue::Rq */
	bool used;
};

struct OutChan {
	unsigned peer, slot;
	QpRec *q;
	std::vector<Op> ops;
	size_t next = 0;
};

struct InChan {
	std::vector<Op> ops;
	std::vector<uint32_t> recv_ops; /* indices of ops consuming a receive */
	size_t next_recv = 0;
	size_t writes_checked = 0;      /* WRITEs of ops[0, this) verified */
};

class Worker {
public:
	Worker(const Config &c, unsigned rank) : c_(c), me_(rank), local_(key_of(c.seed, rank, 0x10ca1)) {}
	int run();

private:
	[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
	void setup();
	void exchange();
	void connect();
	void connect_pair(unsigned p, unsigned s);
	void create_pair_qps(unsigned p, unsigned s);
	void drop_qp(QpRec *r);
	void churn_qps();
	void teardown();
	void post_receives();
	void send_phase();
	void noise_setup();
	void noise_loop();
	void end_of_round();
	void final_checks();

	/* The data path. */
	int pump();
	void wait_for(const char *what, const std::function<bool()> &done);
	void on_wc(const Wc &wc);
	void on_send(QpRec &q, const Wc &wc);
	void on_recv(QpRec &q, const Wc &wc);
	void retire(const Pending &p);
	void check_window(unsigned src, unsigned slot, const Op &o, const char *why);
	void verify_writes(unsigned src, unsigned slot, InChan &ch, size_t upto);
	void post_batch(OutChan &ch, size_t n);
	void post_wrs(QpRec &q, unsigned peer, unsigned slot, std::vector<const Op *> ops,
		      std::vector<Pending> &pend);
	void sync_op(QpRec &q, enum ibv_wr_opcode op, uint64_t off, uint64_t cmp, uint64_t swp,
		     char *local, uint32_t len);
	void critical_section();
	std::string missing() const;

	char *send_alloc(size_t n);
	char *recv_alloc(size_t n);
	void split(char *p, uint32_t len, unsigned nsge, uint32_t lkey, std::vector<struct ibv_sge> &out);
	uint64_t window_addr(unsigned dst, unsigned src, unsigned slot) const
	{
		return info_[dst].win_addr + uint64_t(src * c_.slots() + slot) * window_bytes;
	}
	uint64_t cas_offset(unsigned src, unsigned slot, unsigned round) const
	{
		return counters * 8 + ((uint64_t(src) * c_.slots() + slot) * c_.rounds + round) * 8;
	}
	QpRec *rec(struct ibv_qp *qp, Kind k, int peer, unsigned slot);
	struct ibv_qp *make_qp(Kind k, bool ex, struct ibv_cq *scq, struct ibv_cq *rcq,
			       struct ibv_srq *srq);
	void post_wqes(Queue qu, QpRec *owner, const std::vector<uint32_t> &sizes);
	void post_or_defer(Queue qu, QpRec *owner, const std::vector<uint32_t> &sizes);
	void post_deferred(size_t max);

	Config c_;
	unsigned me_;
	Rng local_;
	int round_ = -1;
	shmv_test::WorkerLink link_;

	struct ibv_context *ctx_ = nullptr;
	struct ibv_pd *pd_ = nullptr;
	struct ibv_comp_channel *ch_ = nullptr;
	struct ibv_cq *cq_a_ = nullptr;       /* ibv_create_cq, ibv_poll_cq */
	struct ibv_cq_ex *cq_b_ = nullptr;    /* ibv_create_cq_ex, ibv_start_poll */
	struct ibv_cq_ex *cq_c_ = nullptr;    /* ibv_create_cq_ex with a channel, ibv_poll_cq */
	struct ibv_srq *srq_ = nullptr;
	struct ibv_xrcd *xrcd_ = nullptr;
	struct ibv_srq *xsrq_ = nullptr;
	struct ibv_ah *ah_ = nullptr;
	struct ibv_mr *send_mr_ = nullptr, *recv_mr_ = nullptr, *win_mr_ = nullptr,
		      *read_mr_ = nullptr, *atom_mr_ = nullptr, *lock_mr_ = nullptr;
	char *send_arena_ = nullptr, *recv_arena_ = nullptr, *win_ = nullptr, *read_ = nullptr;
	uint64_t *atom_ = nullptr, *lock_ = nullptr;
	size_t atom_bytes_ = 0;
	size_t send_used_ = 0, recv_used_ = 0;
	uint16_t lid_ = 0;
	unsigned unacked_events_ = 0;

	std::vector<std::unique_ptr<QpRec>> qps_;
	std::unordered_map<uint32_t, QpRec *> by_qpn_;
	QpRec *out_qp_[max_procs][max_slots] = {};
	QpRec *xrc_recv_qp_[max_procs] = {};
	QpRec *ud_ = nullptr;
	std::vector<Info> info_;
	std::unordered_map<uint32_t, unsigned> ud_peer_; /* peer's UD QPN -> rank */

	std::vector<OutChan> out_;
	InChan in_[max_procs][max_slots];
	std::vector<Wqe> wqes_;
	/* Receives held back into the send phase (reliable queues only): the
	 * senders meet RNR and retry. Posted at the latest when we wait. */
	struct Deferred {
		Queue qu;
		QpRec *owner;
		std::vector<uint32_t> sizes;
	};
	std::deque<Deferred> deferred_;
	uint64_t next_wr_id_ = 1;
	uint64_t recvs_left_ = 0;
	uint64_t sends_left_ = 0;
	uint64_t sync_wr_id_ = 0;
	uint64_t sync_raddr_ = 0;
	bool sync_done_ = false;
	std::vector<AddRecord> adds_;
	Stats stats_{};

	/* A second thread posting and polling concurrently with the main one,
	 * on QPs and a CQ of its own: WRITE, READ back, FETCH_AND_ADD toward
	 * the next rank (noise memory: [0] counter, then a window). */
	static constexpr size_t noise_bytes = 64 * 1024;
	struct ibv_cq *noise_cq_ = nullptr;
	struct ibv_qp *noise_out_ = nullptr, *noise_in_ = nullptr;
	struct ibv_mr *noise_mr_ = nullptr, *noise_local_mr_ = nullptr;
	char *noise_mem_ = nullptr, *noise_local_ = nullptr;
	std::thread noise_thread_;
	std::atomic<bool> noise_stop_{false};
	uint64_t noise_iter_ = 0, noise_added_ = 0; /* the noise thread's own */
};

/* Fails the worker (reported to the coordinator, which kills everyone). */
#define NEED(cond)                                                  \
	do {                                                        \
		if (!(cond))                                        \
			fail("%s:%d: %s (errno %d)", __FILE__, __LINE__, #cond, errno); \
	} while (0)

inline char *map_bytes(size_t n)
{
	void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

} // namespace stress
