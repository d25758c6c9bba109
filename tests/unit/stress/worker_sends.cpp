/* SPDX-License-Identifier: MIT */
/*
 * The stress worker: sends (both posting APIs), critical sections, the
 * noise thread, the end of a round and the final checks (worker.h).
 */
#include "worker.h"

namespace stress {

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

} // namespace stress
