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
#include "../common/procs.h"
#include "schedule.h"

#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using namespace stress;
using Clock = std::chrono::steady_clock;

namespace {

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

const char *opname(int op)
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

enum ibv_wc_opcode send_wc_opcode(enum ibv_wr_opcode op)
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

void Worker::fail(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	std::vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	char full[1200];
	std::snprintf(full, sizeof(full), "rank %u, round %d (seed %" PRIu64 "): %s", me_, round_,
		      c_.seed, msg);
	std::fprintf(stderr, "unit-stress: %s\n", full);
	link_.fail(full);
	_exit(1);
}

#define NEED(cond)                                                  \
	do {                                                        \
		if (!(cond))                                        \
			fail("%s:%d: %s (errno %d)", __FILE__, __LINE__, #cond, errno); \
	} while (0)

char *map_bytes(size_t n)
{
	void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

/* ---- Setup ---- */

QpRec *Worker::rec(struct ibv_qp *qp, Kind k, int peer, unsigned slot)
{
	NEED(qp);
	auto r = std::make_unique<QpRec>();
	r->qp = qp;
	r->kind = k;
	r->peer = peer;
	r->slot = slot;
	QpRec *raw = r.get();
	by_qpn_[qp->qp_num] = raw;
	qps_.push_back(std::move(r));
	return raw;
}

struct ibv_qp *Worker::make_qp(Kind k, bool ex, struct ibv_cq *scq, struct ibv_cq *rcq,
			       struct ibv_srq *srq)
{
	struct ibv_qp_init_attr_ex a{};
	a.qp_type = k == Kind::Uc ? IBV_QPT_UC : k == Kind::Ud ? IBV_QPT_UD
		  : k == Kind::Xrc ? IBV_QPT_XRC_SEND : IBV_QPT_RC;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.cap.max_send_wr = sq_depth;
	a.cap.max_recv_wr = srq || k == Kind::Xrc ? 0 : k == Kind::Ud ? 1024 : 64;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = srq || k == Kind::Xrc ? 0 : 4;
	a.cap.max_inline_data = c_.max_inline;
	a.pd = pd_;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	if (k == Kind::Xrc)
		ex = true; /* XRC_SEND only through the extended verb */
	struct ibv_qp *qp;
	if (ex) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		if (k != Kind::Ud)
			a.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
		if (k != Kind::Ud && k != Kind::Uc)
			a.send_ops_flags |= IBV_QP_EX_WITH_RDMA_READ |
					    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
					    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		qp = ibv_create_qp_ex(ctx_, &a);
	} else {
		struct ibv_qp_init_attr b{};
		b.qp_type = a.qp_type;
		b.send_cq = scq;
		b.recv_cq = rcq;
		b.srq = srq;
		b.cap = a.cap;
		qp = ibv_create_qp(pd_, &b);
		a.cap = b.cap;
	}
	NEED(qp);
	NEED(a.cap.max_inline_data >= c_.max_inline);
	return qp;
}

void Worker::setup()
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	NEED(list && n > 0);
	ctx_ = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	NEED(ctx_);
	struct ibv_port_attr pa{};
	NEED(ibv_query_port(ctx_, 1, &pa) == 0);
	lid_ = pa.lid;
	NEED((128u << pa.active_mtu) == c_.ud_mtu);
	pd_ = ibv_alloc_pd(ctx_);
	NEED(pd_);

	/* Three CQs, three ways of polling; C wakes us through a channel. */
	ch_ = ibv_create_comp_channel(ctx_);
	NEED(ch_);
	NEED(fcntl(ch_->fd, F_SETFL, fcntl(ch_->fd, F_GETFL) | O_NONBLOCK) == 0);
	cq_a_ = ibv_create_cq(ctx_, 8192, nullptr, nullptr, 0);
	NEED(cq_a_);
	struct ibv_cq_init_attr_ex ca{};
	ca.cqe = 8192;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	cq_b_ = ibv_create_cq_ex(ctx_, &ca);
	NEED(cq_b_);
	ca.channel = ch_;
	ca.cq_context = this;
	cq_c_ = ibv_create_cq_ex(ctx_, &ca);
	NEED(cq_c_);
	struct ibv_cq *cqs[3] = {cq_a_, ibv_cq_ex_to_cq(cq_b_), ibv_cq_ex_to_cq(cq_c_)};

	/* Memory: arenas for payloads, windows for incoming WRITEs, a
	 * pattern-filled area for READs, counters, the lock. */
	const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	send_arena_ = map_bytes(arena_bytes);
	recv_arena_ = map_bytes(arena_bytes);
	size_t win_bytes = size_t(c_.procs) * c_.slots() * window_bytes;
	win_ = map_bytes(win_bytes);
	read_ = map_bytes(read_area_bytes);
	atom_bytes_ = counters * 8 + size_t(c_.procs) * c_.slots() * c_.rounds * 8;
	atom_ = reinterpret_cast<uint64_t *>(map_bytes(atom_bytes_));
	lock_ = reinterpret_cast<uint64_t *>(map_bytes(4096));
	NEED(send_arena_ && recv_arena_ && win_ && read_ && atom_ && lock_);
	pattern_fill(read_, read_area_bytes, read_area_key(c_.seed, me_), 0);
	send_mr_ = ibv_reg_mr(pd_, send_arena_, arena_bytes, IBV_ACCESS_LOCAL_WRITE);
	recv_mr_ = ibv_reg_mr(pd_, recv_arena_, arena_bytes, IBV_ACCESS_LOCAL_WRITE);
	win_mr_ = ibv_reg_mr(pd_, win_, win_bytes, remote);
	read_mr_ = ibv_reg_mr(pd_, read_, read_area_bytes, IBV_ACCESS_REMOTE_READ);
	atom_mr_ = ibv_reg_mr(pd_, atom_, atom_bytes_,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ);
	lock_mr_ = ibv_reg_mr(pd_, lock_, 4096, remote | IBV_ACCESS_REMOTE_ATOMIC);
	NEED(send_mr_ && recv_mr_ && win_mr_ && read_mr_ && atom_mr_ && lock_mr_);

	struct ibv_srq_init_attr sa{};
	sa.attr.max_wr = 1024;
	sa.attr.max_sge = 4;
	srq_ = ibv_create_srq(pd_, &sa);
	NEED(srq_);
	struct ibv_xrcd_init_attr xa{};
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = O_CREAT;
	xrcd_ = ibv_open_xrcd(ctx_, &xa);
	NEED(xrcd_);
	struct ibv_srq_init_attr_ex xs{};
	xs.attr.max_wr = 1024;
	xs.attr.max_sge = 4;
	xs.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
		       IBV_SRQ_INIT_ATTR_PD;
	xs.srq_type = IBV_SRQT_XRC;
	xs.xrcd = xrcd_;
	xs.cq = cqs[2];
	xs.pd = pd_;
	xsrq_ = ibv_create_srq_ex(ctx_, &xs);
	NEED(xsrq_);

	/* The QPs. Which are created extended (and may then post either way)
	 * and which CQs they use varies with slot and peer. */
	for (unsigned p = 0; p < c_.procs; p++) {
		if (p == me_)
			continue;
		for (unsigned s = 0; s < c_.slots(); s++) {
			Kind k = c_.kind(s);
			if (k == Kind::Ud)
				continue;
			create_pair_qps(p, s);
		}
	}
	ud_ = rec(make_qp(Kind::Ud, me_ % 2 == 0, cqs[0], cqs[1], nullptr), Kind::Ud, -1,
		  c_.nrc + 3);
	if (me_ % 2 == 0)
		ud_->qpx = ibv_qp_to_qp_ex(ud_->qp);
	struct ibv_ah_attr ah{};
	ah.dlid = lid_; /* one fabric: every process's port has the same LID */
	ah.port_num = 1;
	ah_ = ibv_create_ah(pd_, &ah);
	NEED(ah_);
	noise_setup();
}

/* The QP(s) toward peer p in slot s (XRC: our XRC_SEND and our XRC_RECV
 * for p's XRC_SEND). Which are created extended (and may then post either
 * way) and which CQs they use varies with slot and peer. */
void Worker::create_pair_qps(unsigned p, unsigned s)
{
	struct ibv_cq *cqs[3] = {cq_a_, ibv_cq_ex_to_cq(cq_b_), ibv_cq_ex_to_cq(cq_c_)};
	Kind k = c_.kind(s);
	unsigned sel = s + p + me_;
	struct ibv_cq *scq = cqs[sel % 3], *rcq = cqs[(sel + 1) % 3];
	bool ex = sel % 3 != 0;
	QpRec *r = rec(make_qp(k, ex, scq, rcq, k == Kind::SrqRc ? srq_ : nullptr), k, int(p), s);
	r->qpx = ex || k == Kind::Xrc ? ibv_qp_to_qp_ex(r->qp) : nullptr;
	out_qp_[p][s] = r;
	if (k == Kind::Xrc) {
		struct ibv_qp_init_attr_ex a{};
		a.qp_type = IBV_QPT_XRC_RECV;
		a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
		a.xrcd = xrcd_;
		QpRec *x = rec(ibv_create_qp_ex(ctx_, &a), k, int(p), s);
		x->xrc_recv = true;
		xrc_recv_qp_[p] = x;
	}
}

void Worker::drop_qp(QpRec *r)
{
	NEED(r->sq.empty() && r->rq.empty());
	by_qpn_.erase(r->qp->qp_num);
	NEED(ibv_destroy_qp(r->qp) == 0);
	for (auto it = qps_.begin(); it != qps_.end(); ++it)
		if (it->get() == r) {
			qps_.erase(it);
			return;
		}
}

/*
 * Between rounds (everything quiet): the pairs' QPs the schedule names are
 * reset (same numbers) or destroyed and created again (new numbers; peers
 * learn them in the exchange that follows), then connected again.
 */
void Worker::churn_qps()
{
	std::vector<std::pair<unsigned, unsigned>> redo;
	for (unsigned p = 0; p < c_.procs; p++)
		for (unsigned s = 0; p != me_ && s < c_.slots(); s++) {
			Churn ch = churn(c_, unsigned(round_), me_, p, s);
			if (ch == Churn::None)
				continue;
			redo.push_back({p, s});
			stats_.churned++;
			if (ch == Churn::Reset) {
				struct ibv_qp_attr a{};
				a.qp_state = IBV_QPS_RESET;
				NEED(ibv_modify_qp(out_qp_[p][s]->qp, &a, IBV_QP_STATE) == 0);
				out_qp_[p][s]->trailing_unsignaled = 0;
				if (c_.kind(s) == Kind::Xrc)
					NEED(ibv_modify_qp(xrc_recv_qp_[p]->qp, &a, IBV_QP_STATE) == 0);
				continue;
			}
			drop_qp(out_qp_[p][s]);
			if (c_.kind(s) == Kind::Xrc)
				drop_qp(xrc_recv_qp_[p]);
			create_pair_qps(p, s);
		}
	exchange(); /* every round, churned or not: the same steps everywhere */
	for (auto [p, s] : redo)
		connect_pair(p, s);
}

void Worker::exchange()
{
	info_.clear();
	Info mine{};
	mine.lid = lid_;
	mine.ud_qpn = ud_->qp->qp_num;
	NEED(ibv_get_srq_num(xsrq_, &mine.xrc_srqn) == 0);
	for (unsigned p = 0; p < c_.procs; p++)
		for (unsigned s = 0; s < c_.slots(); s++)
			if (QpRec *r = out_qp_[p][s]) {
				mine.qpn[p][s] = r->qp->qp_num;
				if (r->kind == Kind::Xrc) {
					mine.xrc_send[p] = r->qp->qp_num;
					mine.xrc_recv[p] = xrc_recv_qp_[p]->qp->qp_num;
				}
			}
	mine.win_addr = uintptr_t(win_);
	mine.read_addr = uintptr_t(read_);
	mine.atom_addr = uintptr_t(atom_);
	mine.lock_addr = uintptr_t(lock_);
	mine.win_rkey = win_mr_->rkey;
	mine.read_rkey = read_mr_->rkey;
	mine.atom_rkey = atom_mr_->rkey;
	mine.lock_rkey = lock_mr_->rkey;
	mine.noise_out = noise_out_->qp_num;
	mine.noise_in = noise_in_->qp_num;
	mine.noise_addr = uintptr_t(noise_mem_);
	mine.noise_rkey = noise_mr_->rkey;
	std::vector<char> blob(reinterpret_cast<char *>(&mine), reinterpret_cast<char *>(&mine + 1));
	auto all = link_.allgather(blob, wait_ms);
	NEED(all.size() == c_.procs);
	for (auto &b : all) {
		NEED(b.size() == sizeof(Info));
		Info i;
		std::memcpy(&i, b.data(), sizeof(i));
		info_.push_back(i);
	}
	for (unsigned p = 0; p < c_.procs; p++)
		ud_peer_[info_[p].ud_qpn] = p;
}

int modify(struct ibv_qp *qp, enum ibv_qp_type t, uint32_t dest, uint16_t dlid)
{
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (t == IBV_QPT_UD) {
		a.qkey = ud_qkey;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		if (t != IBV_QPT_UC)
			a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	if (int e = ibv_modify_qp(qp, &a, mask))
		return e;
	a = {};
	a.qp_state = IBV_QPS_RTR;
	mask = IBV_QP_STATE;
	if (t != IBV_QPT_UD) {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dest;
		a.ah_attr.dlid = dlid;
		a.ah_attr.port_num = 1;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (t != IBV_QPT_UC) {
			a.max_dest_rd_atomic = 16;
			a.min_rnr_timer = 1;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	if (int e = ibv_modify_qp(qp, &a, mask))
		return e;
	if (t == IBV_QPT_XRC_RECV)
		return 0;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND) {
		/* 1.07 s x 8 tries before RETRY_EXC_ERR: a peer starved of CPU on a
		 * loaded machine is slow, not dead. */
		a.timeout = 18;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 16;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	return ibv_modify_qp(qp, &a, mask);
}

void Worker::connect_pair(unsigned p, unsigned s)
{
	QpRec *r = out_qp_[p][s];
	if (r->kind == Kind::Xrc) {
		NEED(modify(r->qp, IBV_QPT_XRC_SEND, info_[p].xrc_recv[me_], info_[p].lid) == 0);
		NEED(modify(xrc_recv_qp_[p]->qp, IBV_QPT_XRC_RECV, info_[p].xrc_send[me_],
			    info_[p].lid) == 0);
	} else {
		NEED(modify(r->qp, r->qp->qp_type, info_[p].qpn[me_][s], info_[p].lid) == 0);
	}
}

void Worker::connect()
{
	for (unsigned p = 0; p < c_.procs; p++)
		for (unsigned s = 0; p != me_ && s < c_.slots(); s++)
			if (out_qp_[p][s])
				connect_pair(p, s);
	NEED(modify(ud_->qp, IBV_QPT_UD, 0, 0) == 0);
	unsigned next = (me_ + 1) % c_.procs, prev = (me_ + c_.procs - 1) % c_.procs;
	NEED(modify(noise_out_, IBV_QPT_RC, info_[next].noise_in, info_[next].lid) == 0);
	NEED(modify(noise_in_, IBV_QPT_RC, info_[prev].noise_out, info_[prev].lid) == 0);
}

void Worker::teardown()
{
	if (unacked_events_)
		ibv_ack_cq_events(ibv_cq_ex_to_cq(cq_c_), unacked_events_);
	for (auto &r : qps_)
		NEED(ibv_destroy_qp(r->qp) == 0);
	NEED(ibv_destroy_qp(noise_out_) == 0);
	NEED(ibv_destroy_qp(noise_in_) == 0);
	NEED(ibv_dereg_mr(noise_mr_) == 0);
	NEED(ibv_dereg_mr(noise_local_mr_) == 0);
	NEED(ibv_destroy_cq(noise_cq_) == 0);
	NEED(ibv_destroy_ah(ah_) == 0);
	NEED(ibv_destroy_srq(xsrq_) == 0);
	NEED(ibv_destroy_srq(srq_) == 0);
	NEED(ibv_close_xrcd(xrcd_) == 0);
	for (struct ibv_mr *mr : {send_mr_, recv_mr_, win_mr_, read_mr_, atom_mr_, lock_mr_})
		NEED(ibv_dereg_mr(mr) == 0);
	NEED(ibv_destroy_cq(cq_a_) == 0);
	NEED(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_b_)) == 0);
	NEED(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_c_)) == 0);
	NEED(ibv_destroy_comp_channel(ch_) == 0);
	NEED(ibv_dealloc_pd(pd_) == 0);
	NEED(ibv_close_device(ctx_) == 0);
}

/* ---- Buffers ---- */

char *Worker::send_alloc(size_t n)
{
	send_used_ += local_.below(8); /* misaligned at times */
	NEED(send_used_ + n <= arena_bytes);
	char *p = send_arena_ + send_used_;
	send_used_ += n;
	return p;
}

char *Worker::recv_alloc(size_t n)
{
	recv_used_ += local_.below(8);
	NEED(recv_used_ + n <= arena_bytes);
	char *p = recv_arena_ + recv_used_;
	recv_used_ += n;
	return p;
}

/* `len` bytes at p as `nsge` SGEs of random lengths (all > 0 when len > 0). */
void Worker::split(char *p, uint32_t len, unsigned nsge, uint32_t lkey,
		   std::vector<struct ibv_sge> &out)
{
	out.clear();
	if (nsge == 0)
		return;
	/* nsge - 1 distinct cut points in (0, len): callers keep nsge <= len. */
	std::set<uint32_t> cuts;
	while (cuts.size() + 1 < nsge)
		cuts.insert(uint32_t(local_.range(1, len - 1)));
	cuts.insert(len);
	uint32_t at = 0;
	for (uint32_t end : cuts) {
		out.push_back({uint64_t(uintptr_t(p + at)), end - at, lkey});
		at = end;
	}
}

/* ---- Receives ---- */

void Worker::post_wqes(Queue qu, QpRec *owner, const std::vector<uint32_t> &sizes)
{
	size_t i = 0;
	while (i < sizes.size()) {
		size_t chain = std::min<size_t>(sizes.size() - i, local_.range(1, 8));
		std::vector<struct ibv_recv_wr> wrs(chain);
		for (size_t k = 0; k < chain; k++) {
			uint32_t len = sizes[i + k] + uint32_t(local_.below(17)); /* slack */
			unsigned nsge = len ? unsigned(local_.range(1, std::min<uint32_t>(3, len)))
					    : unsigned(local_.below(2));
			Wqe w{{}, qu, owner, false};
			split(recv_alloc(len), len, nsge, recv_mr_->lkey, w.sge);
			uint32_t idx = uint32_t(wqes_.size());
			wqes_.push_back(std::move(w));
			Wqe &stored = wqes_.back();
			wrs[k].wr_id = recv_tag | idx;
			wrs[k].sg_list = stored.sge.data();
			wrs[k].num_sge = int(stored.sge.size());
			wrs[k].next = k + 1 < chain ? &wrs[k + 1] : nullptr;
			if (qu == Queue::Rq)
				owner->rq.push_back(idx); /* one sender: consumed in this order */
		}
		struct ibv_recv_wr *bad = nullptr;
		int err = qu == Queue::Srq ? ibv_post_srq_recv(srq_, wrs.data(), &bad)
			: qu == Queue::XrcSrq ? ibv_post_srq_recv(xsrq_, wrs.data(), &bad)
			: ibv_post_recv(owner->qp, wrs.data(), &bad);
		if (err)
			fail("posting %zu receives: error %d", chain, err);
		i += chain;
	}
}

/* A reliable queue may get only some of its receives now, the rest
 * during the send phase. */
void Worker::post_or_defer(Queue qu, QpRec *owner, const std::vector<uint32_t> &sizes)
{
	size_t now = sizes.size();
	if (now && local_.chance(25))
		now = local_.below(now);
	post_wqes(qu, owner, std::vector<uint32_t>(sizes.begin(), sizes.begin() + long(now)));
	if (now < sizes.size())
		deferred_.push_back({qu, owner, std::vector<uint32_t>(sizes.begin() + long(now), sizes.end())});
}

void Worker::post_deferred(size_t max)
{
	for (; max && !deferred_.empty(); max--) {
		size_t i = local_.below(deferred_.size());
		/* A queue defers one group, its tail: order holds. */
		Deferred d = deferred_[i];
		deferred_.erase(deferred_.begin() + long(i));
		post_wqes(d.qu, d.owner, d.sizes);
		stats_.late_recvs += d.sizes.size();
	}
}

void Worker::post_receives()
{
	wqes_.clear();
	wqes_.reserve(4096); /* the WRs point into the stored SGE vectors */
	recv_used_ = 0;
	std::vector<uint32_t> srq_sizes, xrc_sizes, ud_sizes;
	uint32_t srq_max = 0, xrc_max = 0, ud_max = 0;
	for (unsigned src = 0; src < c_.procs; src++) {
		if (src == me_)
			continue;
		for (unsigned s = 0; s < c_.slots(); s++) {
			InChan &ch = in_[src][s];
			ch = InChan{};
			ch.ops = schedule(c_, unsigned(round_), src, me_, s);
			std::vector<uint32_t> sizes;
			for (const Op &o : ch.ops)
				if (o.consumes_recv()) {
					ch.recv_ops.push_back(o.seq);
					uint32_t need = o.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? 0 : o.len;
					sizes.push_back(need);
				}
			recvs_left_ += ch.recv_ops.size();
			uint32_t mx = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
			switch (c_.kind(s)) {
			case Kind::Rc:
				post_or_defer(Queue::Rq, out_qp_[src][s], sizes);
				break;
			case Kind::Uc: /* unreliable: all posted before anyone sends */
				post_wqes(Queue::Rq, out_qp_[src][s], sizes);
				break;
			case Kind::SrqRc:
				srq_sizes.resize(srq_sizes.size() + sizes.size());
				srq_max = std::max(srq_max, mx);
				break;
			case Kind::Xrc:
				xrc_sizes.resize(xrc_sizes.size() + sizes.size());
				xrc_max = std::max(xrc_max, mx);
				break;
			case Kind::Ud:
				ud_sizes.resize(ud_sizes.size() + sizes.size());
				ud_max = std::max(ud_max, mx + 40); /* the GRH's room */
				break;
			}
		}
	}
	/* Shared queues: any WQE may take any message, so all are as large
	 * as the largest. */
	std::fill(srq_sizes.begin(), srq_sizes.end(), srq_max);
	std::fill(xrc_sizes.begin(), xrc_sizes.end(), xrc_max);
	std::fill(ud_sizes.begin(), ud_sizes.end(), ud_max);
	post_or_defer(Queue::Srq, nullptr, srq_sizes);
	post_or_defer(Queue::XrcSrq, nullptr, xrc_sizes);
	post_wqes(Queue::Ud, ud_, ud_sizes);
	/* The lock of this round lives here: fresh for the round. */
	if (me_ == unsigned(round_) % c_.procs)
		std::memset(lock_, 0, 24);
}

/* ---- Completions ---- */

int Worker::pump()
{
	int got = 0;
	struct ibv_wc wc[16];
	Wc w{};
	auto from_wc = [&](const struct ibv_wc &x, const char *name) {
		w = Wc{x.wr_id, x.status, x.opcode, x.byte_len, ntohl(x.imm_data), x.qp_num,
		       x.src_qp, x.wc_flags, x.slid, name};
		on_wc(w);
	};
	int n = ibv_poll_cq(cq_a_, int(local_.range(1, 16)), wc);
	NEED(n >= 0);
	for (int i = 0; i < n; i++)
		from_wc(wc[i], "A");
	got += n;
	n = ibv_poll_cq(ibv_cq_ex_to_cq(cq_c_), int(local_.range(1, 16)), wc);
	NEED(n >= 0);
	for (int i = 0; i < n; i++)
		from_wc(wc[i], "C");
	got += n;

	struct ibv_poll_cq_attr pa{};
	int err = ibv_start_poll(cq_b_, &pa);
	if (err == ENOENT)
		return got;
	NEED(err == 0);
	int budget = int(local_.range(1, 32));
	do {
		w = Wc{};
		w.wr_id = cq_b_->wr_id;
		w.status = cq_b_->status;
		w.opcode = ibv_wc_read_opcode(cq_b_);
		w.byte_len = ibv_wc_read_byte_len(cq_b_);
		w.flags = ibv_wc_read_wc_flags(cq_b_);
		w.imm = w.flags & IBV_WC_WITH_IMM ? ntohl(ibv_wc_read_imm_data(cq_b_)) : 0;
		w.qp_num = ibv_wc_read_qp_num(cq_b_);
		w.src_qp = ibv_wc_read_src_qp(cq_b_);
		w.slid = uint16_t(ibv_wc_read_slid(cq_b_));
		w.cq = "B";
		on_wc(w);
		got++;
		err = --budget ? ibv_next_poll(cq_b_) : ENOENT;
	} while (err == 0);
	NEED(err == ENOENT);
	ibv_end_poll(cq_b_);
	return got;
}

/* Pumps until done() (bounded): when idle, sleeps on C's channel for at
 * most a millisecond (A and B have none). */
void Worker::wait_for(const char *what, const std::function<bool()> &done)
{
	auto end = Clock::now() + std::chrono::milliseconds(wait_ms);
	post_deferred(deferred_.size()); /* a peer may be waiting in RNR for them */
	while (!done()) {
		if (Clock::now() > end)
			fail("timed out waiting for %s; missing: %s", what, missing().c_str());
		if (pump())
			continue;
		NEED(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq_c_), int(local_.below(2))) == 0);
		if (pump())
			continue;
		struct pollfd pf = {ch_->fd, POLLIN, 0};
		if (poll(&pf, 1, 1) == 1) {
			struct ibv_cq *cq = nullptr;
			void *ctx = nullptr;
			if (ibv_get_cq_event(ch_, &cq, &ctx) == 0) {
				NEED(cq == ibv_cq_ex_to_cq(cq_c_) && ctx == this);
				stats_.events++;
				if (++unacked_events_ >= 16) {
					ibv_ack_cq_events(cq, unacked_events_);
					unacked_events_ = 0;
				}
			}
		}
	}
}

std::string Worker::missing() const
{
	std::string s;
	for (const auto &r : qps_)
		if (!r->sq.empty())
			s += "QP " + std::to_string(r->qp->qp_num) + " has " +
			     std::to_string(r->sq.size()) + " send WRs outstanding (first wr_id " +
			     std::to_string(r->sq.front().wr_id) + " " + opname(r->sq.front().opcode) +
			     "); ";
	for (unsigned src = 0; src < c_.procs; src++)
		for (unsigned sl = 0; sl < c_.slots(); sl++) {
			const InChan &ch = in_[src][sl];
			if (ch.next_recv < ch.recv_ops.size())
				s += "from rank " + std::to_string(src) + " slot " + std::to_string(sl) +
				     ": " + std::to_string(ch.recv_ops.size() - ch.next_recv) +
				     " receives (next op " + std::to_string(ch.recv_ops[ch.next_recv]) +
				     "); ";
		}
	return s.empty() ? "nothing" : s;
}

void Worker::on_wc(const Wc &wc)
{
	auto it = by_qpn_.find(wc.qp_num);
	if (wc.status != IBV_WC_SUCCESS) {
		std::string what = "unknown QP";
		if (it != by_qpn_.end()) {
			const QpRec &q = *it->second;
			static const char *kinds[] = {"RC", "UC", "SRQ-RC", "XRC", "UD"};
			what = std::string(kinds[int(q.kind)]) + (q.xrc_recv ? " recv" : "") +
			       " QP to rank " + std::to_string(q.peer) + " slot " + std::to_string(q.slot);
			for (const Pending &p : q.sq)
				if (p.wr_id == wc.wr_id) {
					const Op *o = p.chan >= 0 ? &out_[size_t(p.chan)].ops[size_t(p.op)] : nullptr;
					what += std::string(", ") + opname(p.opcode) + " of " + std::to_string(p.len) +
						" bytes" + (o && o->inl ? " inline" : "") +
						(o ? ", " + std::to_string(o->nsge) + " SGEs, op " + std::to_string(o->seq)
						   : std::string(", critical section"));
				}
		}
		fail("CQ %s: completion with status %s (%d), wr_id 0x%" PRIx64 ", QP %u (%s)", wc.cq,
		     ibv_wc_status_str(wc.status), int(wc.status), wc.wr_id, wc.qp_num, what.c_str());
	}
	if (it == by_qpn_.end())
		fail("CQ %s: completion for unknown QP %u", wc.cq, wc.qp_num);
	if (wc.wr_id & recv_tag)
		on_recv(*it->second, wc);
	else
		on_send(*it->second, wc);
}

void Worker::on_send(QpRec &q, const Wc &wc)
{
	if (wc.opcode & IBV_WC_RECV)
		fail("send wr_id 0x%" PRIx64 " completed as a receive (opcode %d)", wc.wr_id,
		     int(wc.opcode));
	/* In order: unsignaled WRs ahead of this one completed with it. */
	while (!q.sq.empty() && q.sq.front().wr_id != wc.wr_id) {
		if (q.sq.front().signaled)
			fail("QP %u: send completion wr_id %" PRIu64 " before signaled wr_id %" PRIu64,
			     q.qp->qp_num, wc.wr_id, q.sq.front().wr_id);
		retire(q.sq.front());
		q.sq.pop_front();
	}
	if (q.sq.empty())
		fail("QP %u: unexpected send completion wr_id %" PRIu64 " (duplicate?)", q.qp->qp_num,
		     wc.wr_id);
	const Pending &p = q.sq.front();
	if (!p.signaled)
		fail("QP %u: completion for unsignaled wr_id %" PRIu64, q.qp->qp_num, wc.wr_id);
	if (wc.opcode != send_wc_opcode(p.opcode))
		fail("QP %u: %s wr_id %" PRIu64 " completed with opcode %d", q.qp->qp_num,
		     opname(p.opcode), wc.wr_id, int(wc.opcode));
	bool atomic = p.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || p.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
	if ((p.opcode == IBV_WR_RDMA_READ && wc.byte_len != p.len) || (atomic && wc.byte_len != 8))
		fail("QP %u: %s wr_id %" PRIu64 " of %u bytes: byte_len %u", q.qp->qp_num,
		     opname(p.opcode), wc.wr_id, p.len, wc.byte_len);
	retire(p);
	q.sq.pop_front();
}

void Worker::retire(const Pending &p)
{
	sends_left_--;
	if (p.chan < 0) {
		if (p.wr_id == sync_wr_id_)
			sync_done_ = true;
		return;
	}
	const OutChan &ch = out_[size_t(p.chan)];
	const Op &o = ch.ops[size_t(p.op)];
	uint64_t old;
	switch (o.opcode) {
	case IBV_WR_RDMA_READ:
		if (int64_t at = pattern_check(p.local, o.len, o.pkey, o.pstart); at >= 0)
			fail("RDMA_READ of %u bytes from rank %u slot %u op %u (%s): byte %" PRId64
			     " wrong", o.len, ch.peer, ch.slot, o.seq,
			     o.read_window ? "read-back of a WRITE" : "read area", at);
		break;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		std::memcpy(&old, p.local, 8);
		adds_.push_back({ch.peer, o.counter, old, o.add});
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		std::memcpy(&old, p.local, 8);
		if (old != o.expect_old)
			fail("CMP_AND_SWP at rank %u slot %u op %u returned %" PRIu64 ", expected %" PRIu64,
			     ch.peer, ch.slot, o.seq, old, o.expect_old);
		break;
	default:
		break;
	}
}

/* Scattered bytes (after `skip` bytes) against pattern(key) from 0. */
int64_t check_sges(const std::vector<struct ibv_sge> &sges, uint64_t skip, uint64_t len,
		   uint64_t key)
{
	uint64_t pos = 0; /* in the message, skip included */
	for (const struct ibv_sge &s : sges) {
		const char *p = reinterpret_cast<const char *>(uintptr_t(s.addr));
		for (uint32_t i = 0; i < s.length && pos < skip + len; i++, pos++)
			if (pos >= skip && uint8_t(p[i]) != pattern_byte(key, pos - skip))
				return int64_t(pos - skip);
	}
	return pos < skip + len ? int64_t(pos) : -1;
}

void Worker::check_window(unsigned src, unsigned slot, const Op &o, const char *why)
{
	const char *p = win_ + uint64_t(src * c_.slots() + slot) * window_bytes + o.win_off;
	if (int64_t at = pattern_check(p, o.len, o.pkey, 0); at >= 0)
		fail("%s of %u bytes from rank %u slot %u op %u at window offset %u: byte %" PRId64
		     " wrong (checked %s)", opname(o.opcode), o.len, src, slot, o.seq, o.win_off, at, why);
}

void Worker::verify_writes(unsigned src, unsigned slot, InChan &ch, size_t upto)
{
	for (; ch.writes_checked < upto; ch.writes_checked++) {
		const Op &o = ch.ops[ch.writes_checked];
		if (o.opcode == IBV_WR_RDMA_WRITE || o.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
			check_window(src, slot, o, "at a later receive or round end");
	}
}

void Worker::on_recv(QpRec &q, const Wc &wc)
{
	uint64_t idx = wc.wr_id & ~recv_tag;
	if (idx >= wqes_.size())
		fail("receive completion with unknown wr_id 0x%" PRIx64, wc.wr_id);
	Wqe &w = wqes_[idx];
	if (w.used)
		fail("receive WQE %" PRIu64 " completed twice", idx);
	w.used = true;
	unsigned src, slot;
	Queue expect;
	if (q.kind == Kind::Ud) {
		auto it = ud_peer_.find(wc.src_qp);
		if (it == ud_peer_.end() || it->second == me_)
			fail("UD receive from unknown src_qp %u", wc.src_qp);
		src = it->second;
		slot = c_.nrc + 3;
		expect = Queue::Ud;
		if (wc.slid != info_[src].lid || (wc.flags & IBV_WC_GRH))
			fail("UD receive from rank %u: slid %u (expected %u), wc_flags 0x%x", src,
			     wc.slid, info_[src].lid, wc.flags);
	} else {
		src = unsigned(q.peer);
		slot = q.slot;
		expect = q.xrc_recv ? Queue::XrcSrq : q.kind == Kind::SrqRc ? Queue::Srq : Queue::Rq;
		if (q.kind == Kind::Xrc && !q.xrc_recv)
			fail("receive completion on XRC_SEND QP %u", q.qp->qp_num);
		if (expect == Queue::Rq) {
			if (q.rq.empty() || q.rq.front() != idx)
				fail("QP %u: receive consumed WQE %" PRIu64 ", expected %d", q.qp->qp_num,
				     idx, q.rq.empty() ? -1 : int(q.rq.front()));
			q.rq.pop_front();
		}
	}
	if (w.queue != expect || (expect == Queue::Rq && w.owner != &q))
		fail("QP %u: receive took WQE %" PRIu64 " of another queue", q.qp->qp_num, idx);
	InChan &ch = in_[src][slot];
	if (ch.next_recv >= ch.recv_ops.size())
		fail("unexpected receive from rank %u slot %u on QP %u (all %zu arrived)", src, slot,
		     q.qp->qp_num, ch.recv_ops.size());
	const Op &o = ch.ops[ch.recv_ops[ch.next_recv++]];
	recvs_left_--;
	stats_.recvs++;
	/* Everything the channel wrote before this message has landed. */
	verify_writes(src, slot, ch, o.seq);
	const bool ud = q.kind == Kind::Ud;
	const bool imm = o.opcode != IBV_WR_SEND;
	enum ibv_wc_opcode op = o.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM
								       : IBV_WC_RECV;
	uint32_t len = o.len + (ud ? 40 : 0);
	if (wc.opcode != op || wc.byte_len != len || bool(wc.flags & IBV_WC_WITH_IMM) != imm ||
	    (imm && wc.imm != o.imm))
		fail("receive of %s op %u from rank %u slot %u: opcode %d (expected %d), byte_len %u "
		     "(expected %u), wc_flags 0x%x, imm 0x%x (expected 0x%x)", opname(o.opcode), o.seq,
		     src, slot, int(wc.opcode), int(op), wc.byte_len, len, wc.flags, wc.imm, o.imm);
	if (o.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
		check_window(src, slot, o, "at its immediate");
		ch.writes_checked = o.seq + 1u;
	} else if (int64_t at = check_sges(w.sge, ud ? 40 : 0, o.len, o.pkey); at >= 0) {
		fail("%s of %u bytes from rank %u slot %u op %u: byte %" PRId64 " wrong",
		     opname(o.opcode), o.len, src, slot, o.seq, at);
	}
}

/* ---- Sends ---- */

void Worker::post_wrs(QpRec &q, unsigned peer, unsigned slot, std::vector<const Op *> ops,
		      std::vector<Pending> &pend)
{
	const Info &to = info_[peer];
	const bool ex = q.qpx && local_.chance(50);
	struct Wr {
		struct ibv_send_wr wr;
		std::vector<struct ibv_sge> sge;
		std::vector<struct ibv_data_buf> bufs;
	};
	std::vector<Wr> wrs(ops.size());
	for (size_t i = 0; i < ops.size(); i++) {
		const Op &o = *ops[i];
		Pending &p = pend[i];
		Wr &w = wrs[i];
		bool atomic = o.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
			      o.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
		bool into_local = atomic || o.opcode == IBV_WR_RDMA_READ;
		if (!p.local) {
			p.local = send_alloc(o.len);
			if (into_local)
				std::memset(p.local, 0xa5, o.len);
			else
				pattern_fill(p.local, o.len, o.pkey, 0);
		}
		split(p.local, o.len, o.nsge, send_mr_->lkey, w.sge);
		for (auto &s : w.sge)
			w.bufs.push_back({reinterpret_cast<void *>(uintptr_t(s.addr)), s.length});
		/* Keep the SQ drainable: never a long run of unsignaled WRs. */
		if (!p.signaled && q.trailing_unsignaled >= 32)
			p.signaled = true;
		q.trailing_unsignaled = p.signaled ? 0 : q.trailing_unsignaled + 1;
		p.len = o.len;
		p.opcode = o.opcode;
		p.wr_id = next_wr_id_++;

		uint64_t raddr = 0;
		uint32_t rkey = 0;
		switch (o.opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			raddr = window_addr(peer, me_, slot) + o.win_off;
			rkey = to.win_rkey;
			break;
		case IBV_WR_RDMA_READ:
			raddr = o.read_window ? window_addr(peer, me_, slot) + o.win_off
					      : to.read_addr + o.read_off;
			rkey = o.read_window ? to.win_rkey : to.read_rkey;
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			raddr = to.atom_addr + o.counter * 8;
			rkey = to.atom_rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			raddr = to.atom_addr + cas_offset(me_, slot, unsigned(round_));
			rkey = to.atom_rkey;
			break;
		default:
			break;
		}
		if (p.chan < 0) { /* a critical-section op: the lock's memory */
			raddr = sync_raddr_;
			rkey = to.lock_rkey;
		}
		stats_.ops[o.opcode]++;
		stats_.bytes += o.len;
		if (ex) {
			struct ibv_qp_ex *x = q.qpx;
			if (i == 0)
				ibv_wr_start(x);
			x->wr_id = p.wr_id;
			x->wr_flags = (p.signaled ? IBV_SEND_SIGNALED : 0) |
				      (local_.chance(10) ? IBV_SEND_SOLICITED : 0);
			switch (o.opcode) {
			case IBV_WR_SEND: ibv_wr_send(x); break;
			case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(x, htonl(o.imm)); break;
			case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(x, rkey, raddr); break;
			case IBV_WR_RDMA_WRITE_WITH_IMM:
				ibv_wr_rdma_write_imm(x, rkey, raddr, htonl(o.imm));
				break;
			case IBV_WR_RDMA_READ: ibv_wr_rdma_read(x, rkey, raddr); break;
			case IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_atomic_fetch_add(x, rkey, raddr, o.add); break;
			case IBV_WR_ATOMIC_CMP_AND_SWP:
				ibv_wr_atomic_cmp_swp(x, rkey, raddr, o.cmp, o.swp);
				break;
			default: fail("opcode %d", int(o.opcode));
			}
			if (q.kind == Kind::Ud)
				ibv_wr_set_ud_addr(x, ah_, to.ud_qpn, ud_qkey);
			if (q.kind == Kind::Xrc)
				ibv_wr_set_xrc_srqn(x, to.xrc_srqn);
			if (o.inl && w.bufs.size() == 1 && local_.chance(50))
				ibv_wr_set_inline_data(x, w.bufs[0].addr, w.bufs[0].length);
			else if (o.inl)
				ibv_wr_set_inline_data_list(x, w.bufs.size(), w.bufs.data());
			else if (w.sge.size() == 1 && local_.chance(50))
				ibv_wr_set_sge(x, w.sge[0].lkey, w.sge[0].addr, w.sge[0].length);
			else
				ibv_wr_set_sge_list(x, w.sge.size(), w.sge.data());
			continue;
		}
		struct ibv_send_wr &wr = w.wr;
		wr = {};
		wr.wr_id = p.wr_id;
		wr.opcode = o.opcode;
		wr.sg_list = w.sge.data();
		wr.num_sge = int(w.sge.size());
		wr.send_flags = (p.signaled ? IBV_SEND_SIGNALED : 0) | (o.inl ? IBV_SEND_INLINE : 0) |
				(local_.chance(10) ? IBV_SEND_SOLICITED : 0);
		wr.imm_data = htonl(o.imm);
		if (atomic) {
			wr.wr.atomic.remote_addr = raddr;
			wr.wr.atomic.rkey = rkey;
			wr.wr.atomic.compare_add = o.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? o.add : o.cmp;
			wr.wr.atomic.swap = o.swp;
		} else if (q.kind == Kind::Ud) {
			wr.wr.ud.ah = ah_;
			wr.wr.ud.remote_qpn = to.ud_qpn;
			wr.wr.ud.remote_qkey = ud_qkey;
		} else {
			wr.wr.rdma.remote_addr = raddr;
			wr.wr.rdma.rkey = rkey;
		}
		if (q.kind == Kind::Xrc)
			wr.qp_type.xrc.remote_srqn = to.xrc_srqn;
		if (i > 0)
			wrs[i - 1].wr.next = &wr;
	}
	int err;
	if (ex) {
		err = ibv_wr_complete(q.qpx);
		stats_.ex_batches++;
	} else {
		struct ibv_send_wr *bad = nullptr;
		err = ibv_post_send(q.qp, &wrs[0].wr, &bad);
		stats_.legacy_posts++;
	}
	if (err)
		fail("posting %zu WRs (%s first) on QP %u via %s: error %d", ops.size(),
		     opname(ops[0]->opcode), q.qp->qp_num, ex ? "ibv_wr_complete" : "ibv_post_send", err);
	for (Pending &p : pend)
		q.sq.push_back(p);
	sends_left_ += pend.size();
}

void Worker::post_batch(OutChan &ch, size_t n)
{
	QpRec &q = *ch.q;
	wait_for("send queue room", [&] { return q.sq.size() + n <= sq_depth; });
	std::vector<const Op *> ops;
	std::vector<Pending> pend;
	for (size_t i = 0; i < n; i++) {
		const Op &o = ch.ops[ch.next];
		ops.push_back(&o);
		pend.push_back(Pending{0, o.signaled, int(&ch - out_.data()), int(ch.next), o.opcode,
				       o.len, nullptr});
		ch.next++;
	}
	post_wrs(q, ch.peer, ch.slot, ops, pend);
}

/* One signaled WR of a critical section at the lock's memory (offset
 * `off` in the holder's lock MR), waited for. */
void Worker::sync_op(QpRec &q, enum ibv_wr_opcode opcode, uint64_t off, uint64_t cmp, uint64_t swp,
		     char *local, uint32_t len)
{
	Op o{};
	o.opcode = opcode;
	o.len = len;
	o.nsge = 1;
	o.signaled = true;
	o.cmp = cmp;
	o.swp = swp;
	o.inl = opcode == IBV_WR_RDMA_WRITE && local_.chance(50);
	std::vector<Pending> pend{Pending{0, true, -1, -1, opcode, len, local}};
	sync_raddr_ = info_[unsigned(q.peer)].lock_addr + off;
	post_wrs(q, unsigned(q.peer), q.slot, {&o}, pend);
	sync_wr_id_ = pend[0].wr_id;
	sync_done_ = false;
	wait_for("a critical-section operation", [&] { return sync_done_; });
}

/*
 * A lock at the round's holder: [0] the lock word (0 free, else the owner's
 * rank + 1), [1] and [2] two counters only a lock owner may touch, read and
 * written back non-atomically (RDMA READ, RDMA WRITE). Mutual exclusion by
 * CMP_AND_SWP is what keeps them equal and counting every section.
 */
void Worker::critical_section()
{
	unsigned holder = unsigned(round_) % c_.procs;
	QpRec &q = *out_qp_[holder][0];
	char *word = send_alloc(8);
	const uint64_t mine = me_ + 1;
	auto end = Clock::now() + std::chrono::milliseconds(wait_ms);
	for (;;) {
		sync_op(q, IBV_WR_ATOMIC_CMP_AND_SWP, 0, 0, mine, word, 8);
		uint64_t old;
		std::memcpy(&old, word, 8);
		if (old == 0)
			break;
		if (old > c_.procs || old == mine)
			fail("lock at rank %u holds %" PRIu64 " (we are %" PRIu64 ")", holder, old, mine);
		stats_.cas_retries++;
		if (Clock::now() > end)
			fail("lock at rank %u never freed (held by %" PRIu64 ")", holder, old);
		usleep(useconds_t(local_.range(10, 200)));
	}
	char *data = send_alloc(16);
	sync_op(q, IBV_WR_RDMA_READ, 8, 0, 0, data, 16);
	uint64_t v[2];
	std::memcpy(v, data, 16);
	if (v[0] != v[1])
		fail("lock-protected counters at rank %u differ: %" PRIu64 " %" PRIu64, holder, v[0], v[1]);
	v[0]++;
	v[1]++;
	char *out = send_alloc(16);
	std::memcpy(out, v, 16);
	sync_op(q, IBV_WR_RDMA_WRITE, 8, 0, 0, out, 16);
	sync_op(q, IBV_WR_ATOMIC_CMP_AND_SWP, 0, mine, 0, word, 8);
	uint64_t old;
	std::memcpy(&old, word, 8);
	if (old != mine)
		fail("releasing the lock at rank %u: it held %" PRIu64 ", not us (%" PRIu64 ")", holder,
		     old, mine);
	stats_.cs++;
}

void Worker::noise_setup()
{
	noise_cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
	NEED(noise_cq_);
	noise_out_ = make_qp(Kind::Rc, true, noise_cq_, noise_cq_, nullptr);
	noise_in_ = make_qp(Kind::Rc, false, noise_cq_, noise_cq_, nullptr);
	noise_mem_ = map_bytes(noise_bytes);
	noise_local_ = map_bytes(2 * noise_bytes);
	NEED(noise_mem_ && noise_local_);
	noise_mr_ = ibv_reg_mr(pd_, noise_mem_, noise_bytes,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	noise_local_mr_ = ibv_reg_mr(pd_, noise_local_, 2 * noise_bytes, IBV_ACCESS_LOCAL_WRITE);
	NEED(noise_mr_ && noise_local_mr_);
}

/* The noise thread: until stopped (at least once, at most 16 times a
 * round), WRITE a pattern into
 * our window at the next rank, READ it back, FETCH_AND_ADD its counter; only
 * the last WR signaled (it retires the others). Own RNG, own CQ. */
void Worker::noise_loop()
{
	const Info &to = info_[(me_ + 1) % c_.procs];
	Rng r(key_of(c_.seed, me_, unsigned(round_), 0x4015e));
	char *src = noise_local_, *dst = noise_local_ + noise_bytes / 2, *old = noise_local_ + noise_bytes;
	uint64_t budget = r.range(1, 16);
	do {
		uint32_t len = uint32_t(r.range(1, noise_bytes / 2 - 8));
		uint64_t off = 8 + r.below(noise_bytes - 8 - len);
		uint64_t key = key_of(c_.seed, me_, 0x4015e, noise_iter_);
		uint64_t add = r.range(1, 1000);
		pattern_fill(src, len, key, 0);
		std::memset(dst, 0, len);
		struct ibv_sge sg[3] = {{uint64_t(uintptr_t(src)), len, noise_local_mr_->lkey},
					{uint64_t(uintptr_t(dst)), len, noise_local_mr_->lkey},
					{uint64_t(uintptr_t(old)), 8, noise_local_mr_->lkey}};
		uint64_t wr_id = 0x4015e00000000ull + noise_iter_;
		if (r.chance(50)) {
			struct ibv_qp_ex *x = ibv_qp_to_qp_ex(noise_out_);
			ibv_wr_start(x);
			x->wr_id = 1;
			x->wr_flags = 0;
			ibv_wr_rdma_write(x, to.noise_rkey, to.noise_addr + off);
			ibv_wr_set_sge_list(x, 1, &sg[0]);
			x->wr_id = 2;
			ibv_wr_rdma_read(x, to.noise_rkey, to.noise_addr + off);
			ibv_wr_set_sge_list(x, 1, &sg[1]);
			x->wr_id = wr_id;
			x->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_atomic_fetch_add(x, to.noise_rkey, to.noise_addr, add);
			ibv_wr_set_sge_list(x, 1, &sg[2]);
			NEED(ibv_wr_complete(x) == 0);
		} else {
			struct ibv_send_wr w[3] = {}, *bad = nullptr;
			w[0].opcode = IBV_WR_RDMA_WRITE;
			w[0].wr.rdma = {to.noise_addr + off, to.noise_rkey};
			w[1].opcode = IBV_WR_RDMA_READ;
			w[1].wr.rdma = {to.noise_addr + off, to.noise_rkey};
			w[2].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
			w[2].wr.atomic.remote_addr = to.noise_addr;
			w[2].wr.atomic.rkey = to.noise_rkey;
			w[2].wr.atomic.compare_add = add;
			w[2].wr_id = wr_id;
			w[2].send_flags = IBV_SEND_SIGNALED;
			for (int i = 0; i < 3; i++) {
				w[i].sg_list = &sg[i];
				w[i].num_sge = 1;
				w[i].next = i < 2 ? &w[i + 1] : nullptr;
			}
			NEED(ibv_post_send(noise_out_, w, &bad) == 0);
		}
		struct ibv_wc wc{};
		auto end = Clock::now() + std::chrono::milliseconds(wait_ms);
		int n;
		while ((n = ibv_poll_cq(noise_cq_, 1, &wc)) == 0 && Clock::now() < end)
			std::this_thread::yield();
		if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id ||
		    wc.opcode != IBV_WC_FETCH_ADD)
			fail("noise thread: completion %d, status %d, wr_id 0x%" PRIx64 ", opcode %d", n,
			     int(wc.status), wc.wr_id, int(wc.opcode));
		if (int64_t at = pattern_check(dst, len, key, 0); at >= 0)
			fail("noise thread: READ back of a %u-byte WRITE: byte %" PRId64 " wrong", len, at);
		noise_added_ += add;
		noise_iter_++;
		usleep(useconds_t(r.below(300))); /* noise, not a CPU hog */
	} while (!noise_stop_.load(std::memory_order_relaxed) && --budget);
}

void Worker::send_phase()
{
	noise_stop_ = false;
	noise_thread_ = std::thread([this] { noise_loop(); });
	send_used_ = 0;
	out_.clear();
	size_t total = 0;
	for (unsigned p = 0; p < c_.procs; p++) {
		if (p == me_)
			continue;
		for (unsigned s = 0; s < c_.slots(); s++) {
			OutChan ch{p, s, c_.kind(s) == Kind::Ud ? ud_ : out_qp_[p][s],
				   schedule(c_, unsigned(round_), me_, p, s)};
			total += ch.ops.size();
			out_.push_back(std::move(ch));
		}
	}
	/* The critical sections happen at random points of the interleaving. */
	std::vector<size_t> cs_at;
	for (unsigned i = critical_sections(c_, unsigned(round_), me_); i; i--)
		cs_at.push_back(local_.below(total + 1));
	std::sort(cs_at.begin(), cs_at.end(), std::greater<>());
	size_t posted = 0;
	std::vector<size_t> open;
	for (;;) {
		while (!cs_at.empty() && cs_at.back() <= posted) {
			critical_section();
			cs_at.pop_back();
		}
		open.clear();
		for (size_t i = 0; i < out_.size(); i++)
			if (out_[i].next < out_[i].ops.size())
				open.push_back(i);
		if (open.empty())
			break;
		OutChan &ch = out_[open[local_.below(open.size())]];
		size_t n = std::min<size_t>(ch.ops.size() - ch.next, local_.range(1, 4));
		post_batch(ch, n);
		posted += n;
		if (local_.chance(30))
			pump();
		if (local_.chance(10))
			post_deferred(1);
	}
	while (!cs_at.empty()) {
		critical_section();
		cs_at.pop_back();
	}
	wait_for("the round's completions", [&] { return sends_left_ == 0 && recvs_left_ == 0; });
	noise_stop_ = true;
	noise_thread_.join();
}

void Worker::end_of_round()
{
	/* Everybody is done: whatever completes now was never expected. */
	if (int n = pump())
		fail("%d completions after the round ended", n);
	for (unsigned src = 0; src < c_.procs; src++)
		if (src != me_)
			for (unsigned s = 0; s < c_.slots(); s++)
				verify_writes(src, s, in_[src][s], in_[src][s].ops.size());
	for (const Wqe &w : wqes_)
		if (!w.used)
			fail("a receive WQE was not consumed");
	if (me_ == unsigned(round_) % c_.procs) {
		uint64_t sections = 0;
		for (unsigned p = 0; p < c_.procs; p++)
			sections += critical_sections(c_, unsigned(round_), p);
		if (lock_[0] != 0 || lock_[1] != sections || lock_[2] != sections)
			fail("lock after the round: word %" PRIu64 ", counters %" PRIu64 " %" PRIu64
			     ", expected 0 %" PRIu64 " %" PRIu64, lock_[0], lock_[1], lock_[2], sections,
			     sections);
	}
}

std::vector<char> bytes_of(const void *p, size_t n)
{
	const char *c = static_cast<const char *>(p);
	return std::vector<char>(c, c + n);
}

void Worker::final_checks()
{
	/* FETCH_AND_ADD: the returned values at each counter must tile
	 * [0, final) exactly, and final must be the sum of all adds. */
	auto all = link_.allgather(bytes_of(adds_.data(), adds_.size() * sizeof(AddRecord)), wait_ms);
	NEED(all.size() == c_.procs);
	std::vector<std::vector<AddRecord>> mine(counters);
	for (auto &b : all) {
		NEED(b.size() % sizeof(AddRecord) == 0);
		for (size_t at = 0; at < b.size(); at += sizeof(AddRecord)) {
			AddRecord r;
			std::memcpy(&r, b.data() + at, sizeof(r));
			if (r.owner == me_) {
				NEED(r.counter < counters);
				mine[r.counter].push_back(r);
			}
		}
	}
	std::vector<uint64_t> expect(counters, 0);
	std::vector<size_t> count(counters, 0);
	for (unsigned r = 0; r < c_.rounds; r++)
		for (unsigned src = 0; src < c_.procs; src++)
			for (unsigned s = 0; src != me_ && s < c_.slots(); s++) {
				std::vector<Op> ops = schedule(c_, r, src, me_, s);
				for (const Op &o : ops)
					if (o.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
						expect[o.counter] += o.add;
						count[o.counter]++;
					}
				uint64_t cas = 0;
				std::memcpy(&cas, reinterpret_cast<char *>(atom_) + cas_offset(src, s, r), 8);
				if (cas != cas_final(ops))
					fail("CMP_AND_SWP word of rank %u slot %u round %u: %" PRIu64
					     ", expected %" PRIu64, src, s, r, cas, cas_final(ops));
			}
	for (unsigned k = 0; k < counters; k++) {
		auto &v = mine[k];
		std::sort(v.begin(), v.end(), [](const AddRecord &a, const AddRecord &b) { return a.old < b.old; });
		uint64_t at = 0;
		for (const AddRecord &r : v) {
			if (r.old != at)
				fail("counter %u: a FETCH_AND_ADD returned %" PRIu64 " where %" PRIu64
				     " was due (lost or doubled add)", k, r.old, at);
			at += r.add;
		}
		if (v.size() != count[k] || at != expect[k] || atom_[k] != expect[k])
			fail("counter %u: %" PRIu64 " after %zu adds returned (%zu scheduled), expected %" PRIu64,
			     k, atom_[k], v.size(), count[k], expect[k]);
	}
	stats_.noise_iters = noise_iter_;
	stats_.noise_adds = noise_added_;
	all = link_.allgather(bytes_of(&stats_, sizeof(stats_)), wait_ms);
	NEED(all.size() == c_.procs);
	/* The previous rank's noise thread alone added to our noise counter. */
	Stats prev;
	NEED(all[(me_ + c_.procs - 1) % c_.procs].size() == sizeof(Stats));
	std::memcpy(&prev, all[(me_ + c_.procs - 1) % c_.procs].data(), sizeof(prev));
	uint64_t noise_counter;
	std::memcpy(&noise_counter, noise_mem_, 8);
	if (noise_counter != prev.noise_adds || prev.noise_iters < c_.rounds)
		fail("noise counter %" PRIu64 ", expected %" PRIu64 " (%" PRIu64 " iterations)",
		     noise_counter, prev.noise_adds, prev.noise_iters);
	if (me_ == 0) {
		Stats t{};
		for (auto &b : all) {
			NEED(b.size() == sizeof(Stats));
			Stats s;
			std::memcpy(&s, b.data(), sizeof(s));
			for (int i = 0; i < 16; i++)
				t.ops[i] += s.ops[i];
			t.bytes += s.bytes;
			t.recvs += s.recvs;
			t.late_recvs += s.late_recvs;
			t.churned += s.churned;
			t.noise_iters += s.noise_iters;
			t.events += s.events;
			t.cs += s.cs;
			t.cas_retries += s.cas_retries;
			t.ex_batches += s.ex_batches;
			t.legacy_posts += s.legacy_posts;
		}
		std::printf("unit-stress: %u processes, %u rounds: ", c_.procs, c_.rounds);
		for (int op : {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
			       IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
			       IBV_WR_ATOMIC_CMP_AND_SWP})
			std::printf("%s %" PRIu64 ", ", opname(op), t.ops[op]);
		std::printf("%" PRIu64 " bytes, %" PRIu64 " receives (%" PRIu64 " posted late), %" PRIu64
			    " critical sections (%" PRIu64
			    " lock retries), %" PRIu64 " ibv_wr batches, %" PRIu64 " ibv_post_send calls, %" PRIu64
			    " channel events, %" PRIu64 " QP reset or re-created, %" PRIu64
			    " noise-thread iterations\n", t.bytes, t.recvs,
			    t.late_recvs, t.cs, t.cas_retries, t.ex_batches,
			    t.legacy_posts, t.events, t.churned, t.noise_iters);
		std::fflush(stdout);
	}
}

int Worker::run()
{
	setup();
	exchange();
	connect();
	for (round_ = 0; round_ < int(c_.rounds); round_++) {
		if (round_ > 0)
			churn_qps();
		post_receives();
		NEED(link_.allgather({}, wait_ms).size() == c_.procs); /* receives posted */
		send_phase();
		NEED(link_.allgather({}, wait_ms).size() == c_.procs); /* all done */
		end_of_round();
	}
	final_checks();
	NEED(link_.allgather({}, wait_ms).size() == c_.procs); /* nobody needs us any more */
	teardown();
	link_.end();
	return 0;
}

} // namespace

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
