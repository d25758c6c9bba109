/* SPDX-License-Identifier: MIT */
/* The stress worker: setup, exchange, receives, completions (worker.h). */
#include "worker.h"

#include "../common/qp_path.h"

namespace stress {

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
	shmv_test::QpPath path;
	path.qkey = ud_qkey;
	path.access = IBV_ACCESS_REMOTE_WRITE;
	if (t != IBV_QPT_UC)
		path.access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	path.max_rd_atomic = 16;
	/* 1.07 s x 8 tries before RETRY_EXC_ERR: a peer starved of CPU on a
	 * loaded machine is slow, not dead. */
	path.timeout = 18;
	path.retry_cnt = 7;
	return shmv_test::qp_to_rts(qp, t, dest, dlid, path);
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

} // namespace stress
