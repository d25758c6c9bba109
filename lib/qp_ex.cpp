/* SPDX-License-Identifier: MIT */
/*
 * ibv_qp_ex: work requests built piece by piece.
 *
 * ibv_wr_start() takes the QP's batch lock (held until wr_complete() or
 * wr_abort(), as libmlx5 holds its SQ lock): an ibv_post_send() of another
 * thread waits for the batch to end, and one of the thread inside it, a
 * nested wr_start() and a wr_complete() without a batch are EINVAL where
 * libmlx5 would deadlock or let go of a lock it does not hold. Each builder (wr_send,
 * wr_rdma_write, ...) starts a new SendWr with qpx->wr_id and qpx->wr_flags
 * as they are at that moment; the setters (wr_set_sge, wr_set_inline_data,
 * wr_set_ud_addr, wr_set_xrc_srqn) fill in the WR built last. Nothing
 * reaches the send queue before wr_complete(), which hands the whole batch
 * to the same engine ibv_post_send() feeds (QpEngine::submit), so every
 * semantic (ordering, RNR, errors, flush) is shared.
 *
 * Errors are libmlx5's: a builder or setter that cannot do its job latches
 * the first error (ENOMEM for a full queue, too many SGEs or inline data
 * over max_inline_data; EINVAL for a setter with no WR to set, EOPNOTSUPP
 * for memory windows); wr_complete() returns it and posts nothing of the
 * batch. wr_complete() on a QP that cannot post (RESET, INIT, RTR) returns
 * EINVAL, as libmlx5's does from RESET until RTS.
 */
#include "qp_ex.h"

#include "ah.h"
#include "datapath.h"
#include "qp.h"

#include <cerrno>
#include <cstring>

namespace shmverbs {

namespace {

QpEngine *engine_of(struct ibv_qp_ex *q)
{
	Qp *qp = Qp::from(&q->qp_base);
	/* QpEngine is the only data path (attach_data_path). */
	return static_cast<QpEngine *>(qp->core->data_path.get());
}

const QpCaps &caps_of(struct ibv_qp_ex *q) { return Qp::from(&q->qp_base)->core->caps; }

QpExBatch *batch_of(struct ibv_qp_ex *q)
{
	QpEngine *e = engine_of(q);
	return e ? &e->wr_batch : nullptr;
}

void latch(QpExBatch &b, int err)
{
	if (!b.err)
		b.err = err;
}

/* Starts a WR of `opcode`; nullptr (error latched) when it cannot. */
[[gnu::always_inline]] inline SendWr *begin(struct ibv_qp_ex *q, enum ibv_wr_opcode opcode)
{
	QpEngine *e = engine_of(q);
	if (!e)
		return nullptr;
	QpExBatch *b = &e->wr_batch;
	/* libmlx5's _common_wqe_init_op: the WRs outstanding and those of the
	 * batch against max_send_wr. */
	if (e->sq_outstanding() + b->count >= caps_of(q).created.max_send_wr) {
		latch(*b, ENOMEM); /* the queue overflows */
		return nullptr;
	}
	if (b->count == b->wrs.size())
		b->wrs.emplace_back();
	SendWr &w = b->wrs[b->count++];
	w.opcode = opcode;
	w.wr_id = q->wr_id;
	w.send_flags = q->wr_flags & ~unsigned(IBV_SEND_INLINE); /* inline comes from the setter */
	w.imm_data = 0;
	/* What this QP type's WRs may read; submit() resets the retry state
	 * of a WR that does not complete at once. */
	w.reset_operands();
	const enum ibv_qp_type type = q->qp_base.qp_type;
	if (type == IBV_QPT_UD || type == IBV_QPT_XRC_SEND)
		w.reset_address();
	return &w;
}

/* The WR the setters act on; nullptr (EINVAL latched) when none was built
 * or the last builder failed. */
SendWr *current(struct ibv_qp_ex *q)
{
	QpExBatch *b = batch_of(q);
	if (!b)
		return nullptr;
	if (!b->count) {
		latch(*b, EINVAL);
		return nullptr;
	}
	return &b->wrs[b->count - 1];
}

void wr_start(struct ibv_qp_ex *q)
{
	QpExBatch *b = batch_of(q);
	if (!b)
		return;
	/* A second wr_start() inside this thread's own batch: libmlx5
	 * deadlocks on its SQ lock; the batch fails instead. */
	if (b->mine()) {
		latch(*b, EINVAL);
		return;
	}
	b->lock.lock();
	b->owner.store(QpExBatch::me(), std::memory_order_relaxed);
	b->count = 0;
	b->err = 0;
}

/* The end of this thread's batch (the lock let go); false when it has none
 * open, and then another thread's batch is left alone. */
bool end_batch(QpExBatch &b)
{
	if (!b.mine())
		return false;
	b.count = 0;
	b.err = 0;
	b.owner.store(nullptr, std::memory_order_relaxed);
	b.lock.unlock();
	return true;
}

int wr_complete(struct ibv_qp_ex *q)
{
	QpEngine *e = engine_of(q);
	if (!e)
		return EINVAL;
	QpExBatch &b = e->wr_batch;
	if (!b.mine())
		return EINVAL; /* no ibv_wr_start() in this thread */
	/* libmlx5 installs a wr_complete that fails every batch with EINVAL
	 * until RTS, whatever the builders latched. */
	int err = e->takes_sends() ? b.err : EINVAL;
	/* A QP of the parent, used in a forked child (lib/fork.h). */
	if (!err && Context::from(q->qp_base.context)->inherited.load(std::memory_order_relaxed))
		err = EIO;
	if (!err)
		err = e->submit(std::span(b.wrs.data(), b.count));
	end_batch(b);
	return err;
}

void wr_abort(struct ibv_qp_ex *q)
{
	if (QpExBatch *b = batch_of(q))
		end_batch(*b);
}

/* ---- Builders ---- */

void wr_send(struct ibv_qp_ex *q) { begin(q, IBV_WR_SEND); }

void wr_send_imm(struct ibv_qp_ex *q, __be32 imm)
{
	if (SendWr *w = begin(q, IBV_WR_SEND_WITH_IMM))
		w->imm_data = imm;
}

void wr_send_inv(struct ibv_qp_ex *q, uint32_t invalidate_rkey)
{
	if (SendWr *w = begin(q, IBV_WR_SEND_WITH_INV))
		w->imm_data = invalidate_rkey;
}

void wr_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t remote_addr)
{
	if (SendWr *w = begin(q, IBV_WR_RDMA_WRITE)) {
		w->rkey = rkey;
		w->remote_addr = remote_addr;
	}
}

void wr_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t remote_addr, __be32 imm)
{
	if (SendWr *w = begin(q, IBV_WR_RDMA_WRITE_WITH_IMM)) {
		w->rkey = rkey;
		w->remote_addr = remote_addr;
		w->imm_data = imm;
	}
}

void wr_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t remote_addr)
{
	if (SendWr *w = begin(q, IBV_WR_RDMA_READ)) {
		w->rkey = rkey;
		w->remote_addr = remote_addr;
	}
}

void wr_atomic_cmp_swp(struct ibv_qp_ex *q, uint32_t rkey, uint64_t remote_addr,
		       uint64_t compare, uint64_t swap)
{
	if (SendWr *w = begin(q, IBV_WR_ATOMIC_CMP_AND_SWP)) {
		w->rkey = rkey;
		w->remote_addr = remote_addr;
		w->compare_add = compare;
		w->swap = swap;
	}
}

void wr_atomic_fetch_add(struct ibv_qp_ex *q, uint32_t rkey, uint64_t remote_addr, uint64_t add)
{
	if (SendWr *w = begin(q, IBV_WR_ATOMIC_FETCH_AND_ADD)) {
		w->rkey = rkey;
		w->remote_addr = remote_addr;
		w->compare_add = add;
	}
}

void wr_local_inv(struct ibv_qp_ex *q, uint32_t invalidate_rkey)
{
	if (SendWr *w = begin(q, IBV_WR_LOCAL_INV))
		w->imm_data = invalidate_rkey;
}

/* A window of another context is EINVAL; a range over 2 GiB EOPNOTSUPP,
 * as ibv_post_send's (libmlx5's KLM limit). */
void wr_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey,
		const struct ibv_mw_bind_info *info)
{
	SendWr *w = begin(q, IBV_WR_BIND_MW);
	if (!w)
		return;
	struct ibv_context *ctx = q->qp_base.context;
	if (!mw || !info || mw->context != ctx || (info->mr && info->mr->context != ctx)) {
		latch(*batch_of(q), EINVAL);
		return;
	}
	if (info->length > (1ull << 31)) {
		latch(*batch_of(q), EOPNOTSUPP);
		return;
	}
	w->bind = mw_bind_of(mw, rkey, *info);
}

/* ---- Setters ---- */

void wr_set_sge(struct ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length)
{
	SendWr *w = current(q);
	if (!w)
		return;
	w->sge.clear();
	w->inline_data.clear();
	if (length) { /* an empty SGE adds nothing, as in libmlx5 */
		struct ibv_sge &s = w->sge.emplace_back();
		s.addr = addr;
		s.length = length;
		s.lkey = lkey;
	}
}

void wr_set_sge_list(struct ibv_qp_ex *q, size_t num_sge, const struct ibv_sge *sg_list)
{
	SendWr *w = current(q);
	if (!w)
		return;
	if (num_sge > caps_of(q).created.max_send_sge) {
		latch(*batch_of(q), ENOMEM);
		return;
	}
	if (num_sge && !sg_list) {
		latch(*batch_of(q), EINVAL);
		return;
	}
	w->sge.clear();
	w->inline_data.clear();
	for (size_t i = 0; i < num_sge; i++)
		if (sg_list[i].length)
			w->sge.push_back(sg_list[i]);
}

/* Inline data is copied now: the caller may reuse its buffer at once.
 * Inlined into both setters: with one buffer (a message of ib_write_lat
 * and ib_send_lat sets one) the loops fold away. */
[[gnu::always_inline]] inline void set_inline(struct ibv_qp_ex *q, size_t num_buf, const struct ibv_data_buf *bufs)
{
	SendWr *w = current(q);
	if (!w)
		return;
	/* Each length against what is left, as libmlx5 adds them: a sum
	 * could wrap. */
	const size_t limit = caps_of(q).created.max_inline_data;
	size_t total = 0;
	for (size_t i = 0; i < num_buf; i++) {
		if (bufs[i].length > limit - total) {
			latch(*batch_of(q), ENOMEM);
			return;
		}
		total += bufs[i].length;
	}
	w->sge.clear();
	w->inline_data.clear();
	for (size_t i = 0; i < num_buf; i++) {
		const char *p = static_cast<const char *>(bufs[i].addr);
		if (bufs[i].length && !p) {
			latch(*batch_of(q), EINVAL);
			return;
		}
		w->inline_data.append(p, bufs[i].length);
	}
}

void wr_set_inline_data(struct ibv_qp_ex *q, void *addr, size_t length)
{
	struct ibv_data_buf b = {addr, length};
	set_inline(q, 1, &b);
}

void wr_set_inline_data_list(struct ibv_qp_ex *q, size_t num_buf, const struct ibv_data_buf *list)
{
	if (num_buf && !list) {
		if (QpExBatch *b = batch_of(q))
			latch(*b, EINVAL);
		return;
	}
	set_inline(q, num_buf, list);
}

void wr_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	SendWr *w = current(q);
	if (!w)
		return;
	/* The AH must be one of ours, on this QP's context: its address is
	 * copied now, as ibv_post_send copies it, so it may be destroyed
	 * once the WR is posted. */
	if (!ah || ah->context != q->qp_base.context) { /* the QP's own context only */
		latch(*batch_of(q), EINVAL);
		return;
	}
	w->ah_attr = Ah::from(ah)->attr;
	w->remote_qpn = remote_qpn;
	w->remote_qkey = remote_qkey;
}

void wr_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t remote_srqn)
{
	if (SendWr *w = current(q))
		w->xrc_srqn = remote_srqn;
}

} // namespace

void install_qp_ex_ops(struct ibv_qp_ex &q)
{
	q.wr_start = wr_start;
	q.wr_complete = wr_complete;
	q.wr_abort = wr_abort;
	q.wr_send = wr_send;
	q.wr_send_imm = wr_send_imm;
	q.wr_set_sge = wr_set_sge;
	q.wr_set_sge_list = wr_set_sge_list;
	q.wr_set_inline_data = wr_set_inline_data;
	q.wr_set_inline_data_list = wr_set_inline_data_list;
	switch (q.qp_base.qp_type) {
	case IBV_QPT_RC:
	case IBV_QPT_XRC_SEND:
		q.wr_rdma_read = wr_rdma_read;
		q.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
		q.wr_atomic_fetch_add = wr_atomic_fetch_add;
		if (q.qp_base.qp_type == IBV_QPT_XRC_SEND)
			q.wr_set_xrc_srqn = wr_set_xrc_srqn;
		[[fallthrough]];
	case IBV_QPT_UC:
		q.wr_send_inv = wr_send_inv;
		q.wr_rdma_write = wr_rdma_write;
		q.wr_rdma_write_imm = wr_rdma_write_imm;
		q.wr_bind_mw = wr_bind_mw;
		q.wr_local_inv = wr_local_inv;
		break;
	case IBV_QPT_UD:
		q.wr_set_ud_addr = wr_set_ud_addr;
		break;
	default:
		break;
	}
}

} // namespace shmverbs
