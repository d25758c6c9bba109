/* SPDX-License-Identifier: MIT */
#include "datapath.h"
#include "datapath_internal.h"

#include "ah.h"
#include "cma.h"
#include "cq_produce.h"

#include "log.h"
#include "mr.h"
#include "process.h"
#include "remote_memory.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <thread>

namespace shmverbs {

namespace {

using Clock = std::chrono::steady_clock;

/*
 * Set around execute() when the WR at the head of a send queue waits for
 * its RNR timer and is tried before it expires: the target may have posted
 * a receive meanwhile (the application's empty poll_cq and the progress
 * thread look; progress_poll_waiting()). An early try that finds the queue
 * still empty changes nothing: the retry count and the timer stay, so
 * rnr_retry exhaustion (IBV_WC_RNR_RETRY_EXC_ERR) comes after the same
 * number of timer periods as on a device; one that finds a WQE delivers at
 * once, as the device's retry would at the timer.
 */
thread_local bool rnr_early_attempt = false;
constexpr auto rnr_look_period = std::chrono::microseconds(20);

} // namespace

thread_local unsigned rnr_early_misses = 0;

namespace {

constexpr uint32_t key_chunk_bits = 12;
constexpr uint32_t key_chunk_slots = 1u << key_chunk_bits;

/* IB's RNR NAK timer encoding (IBA table 45), in microseconds. */
constexpr double rnr_timer_us[32] = {
	655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
	480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
	20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

Clock::duration scaled_us(double us)
{
	return std::chrono::microseconds(int64_t(us * time_scale()));
}

/* Local ACK timeout x (retry_cnt + 1): how long an RC requester waits for a
 * peer that does not answer. Timeout 0 means "infinite" in IB; a dead peer
 * must never hang anyone, so it counts as 2^14 (67 ms) here. */
Clock::duration dead_peer_wait(const struct ibv_qp_attr &a)
{
	unsigned t = a.timeout ? a.timeout : 14;
	double us = 4.096 * double(1ull << std::min(t, 31u)) * (a.retry_cnt + 1);
	return scaled_us(us);
}

} // namespace

/* Helpers shared with the UD and SRQ code (lib/datapath_internal.h). */
namespace dp {

/* The target's key in its segment's key table (lib/mr.h slots): held until
 * the KeyRef goes, so the owner's dereg_mr waits for us. */
KeyRef acquire_key(const PeerSegment &seg, uint32_t key)
{
	uint32_t index = key >> 8;
	if (index < 3)
		return {}; /* never a remotely usable key (null MR, reserved) */
	uint32_t chunk = index >> key_chunk_bits;
	if (chunk >= shm::key_chunk_count)
		return {};
	auto *hdr = seg.at<shm::SegmentHeader>(0);
	uint64_t off = hdr->key_chunks[chunk].load(std::memory_order_acquire);
	auto *slots = off ? seg.at<KeySlot>(off, sizeof(KeySlot) * key_chunk_slots) : nullptr;
	if (!slots)
		return {};
	/* Held in our name (lib/mr.h KeySlot), so that the owner's dereg_mr
	 * does not wait for us if we die holding it. */
	return acquire_remote_key(slots[index & (key_chunk_slots - 1)], key);
}

/* Local SGEs checked against our key table; iovecs of our memory (ODP
 * memory staged in `odp`; without one, an ODP key is refused). */
enum ibv_wc_status local_iovecs(const KeyTable &keys, uint32_t pdn, const struct ibv_sge *sges,
				int count, uint32_t access, std::vector<struct iovec> &out,
				LocalKeyCache &refs, uint64_t &total, OdpStage *odp)
{
	total = 0;
	for (const ibv_sge &s : std::span(sges, size_t(count))) {
		if (!s.length)
			continue;
		const KeyRef *held = refs.get(keys, s.lkey);
		if (!held)
			return IBV_WC_LOC_PROT_ERR;
		const KeyRef &ref = *held;
		if ((ref->kind != KeyKind::NullMr && ref->pdn != pdn) ||
		    !ref.permits(s.addr, s.length, access))
			return IBV_WC_LOC_PROT_ERR;
		if (ref->kind == KeyKind::NullMr) {
			/* Writes are discarded and reads return zeros
			 * (ibv_alloc_null_mr(3)): data placed here goes to a
			 * sink, data sent from here comes from zeros nothing
			 * ever writes. */
			static thread_local std::vector<char> sink, zeros;
			std::vector<char> &v = (access & IBV_ACCESS_LOCAL_WRITE) ? sink : zeros;
			if (v.size() < s.length)
				v.resize(s.length);
			out.push_back({v.data(), s.length});
		} else if (is_odp(ref->access)) {
			const uint64_t at = ref.address_of(s.addr);
			void *staged = !odp ? nullptr
				: (access & IBV_ACCESS_LOCAL_WRITE) ? odp->write_out(at, s.length)
								     : odp->read_in(at, s.length);
			if (!staged)
				return IBV_WC_LOC_PROT_ERR;
			out.push_back({staged, s.length});
		} else {
			out.push_back({reinterpret_cast<void *>(ref.address_of(s.addr)), s.length});
		}
		total += s.length;
	}
	return IBV_WC_SUCCESS;
}

/* A CQ ring in a peer's segment, its slot array checked against the
 * mapping (none: an empty target). */
CqTarget peer_cq(const PeerSegment &seg, uint64_t off)
{
	auto *ring = off ? seg.at<shm::CqRing>(off, shm::cq_slots_offset) : nullptr;
	if (!ring || ring->magic != shm::cq_magic)
		return {};
	CqTarget t{ring, 0, int64_t(off), int64_t(seg.size - off)};
	t.owner_alive = seg.owner_alive_word();
	if (!cq_detail::adopt_array(t, ring->array.load(std::memory_order_acquire)))
		return {};
	return t;
}

/* A receive queue in a peer's segment, geometry copied and validated
 * (PeerRq: lib/datapath_internal.h). */

bool peer_rq(const PeerSegment &seg, uint64_t off, PeerRq &out)
{
	auto *rq = off ? seg.at<shm::RecvQueue>(off, shm::rq_slots_offset) : nullptr;
	if (!rq || rq->magic != shm::rq_magic)
		return false;
	out.rq = rq;
	out.entries = rq->entries;
	out.max_sge = rq->max_sge;
	out.stride = rq->stride;
	if (!out.entries || (out.entries & (out.entries - 1)) || out.max_sge > 1024 ||
	    out.stride != sizeof(shm::RecvWqe) + sizeof(shm::RecvSge) * out.max_sge)
		return false;
	return seg.at<char>(off, shm::rq_slots_offset + uint64_t(out.entries) * out.stride) != nullptr;
}

/* Takes one receive WQE (a copy) from a ring, or returns false when empty. */
bool consume_wqe(const PeerRq &q, shm::RecvWqe &wqe, std::vector<shm::RecvSge> &sges)
{
	return take_wqe(q, wqe, [&](shm::RecvWqe &w, const char *slot) {
		const uint32_t n = std::min(w.num_sge, q.max_sge);
		if (sges.size() != n) /* the callers' vectors keep their size */
			sges.resize(n);
		/* SGE by SGE: fixed-size copies the compiler inlines (a WQE
		 * may have none: then sges.data() may be null). */
		for (uint32_t i = 0; i < n; i++)
			std::memcpy(&sges[i], slot + sizeof(w) + i * sizeof(shm::RecvSge),
				    sizeof(shm::RecvSge));
		w.num_sge = n;
		return true;
	});
}

void rq_publish(char *slot, const struct ibv_recv_wr &wr, uint64_t index, bool skip_empty)
{
	uint32_t n = 0;
	for (int i = 0; i < wr.num_sge; i++) {
		if (skip_empty && !wr.sg_list[i].length)
			continue;
		shm::RecvSge s{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
		std::memcpy(slot + sizeof(shm::RecvWqe) + n * sizeof(s), &s, sizeof(s));
		n++;
	}
	shm::RecvWqe wqe{wr.wr_id, n, 0};
	std::memcpy(slot, &wqe, offsetof(shm::RecvWqe, seq));
	/* Pairs with the consumers' acquire load of seq. */
	rq_slot_seq(slot).store(uint32_t(index + 1), std::memory_order_release);
}

/* Whether an early RNR retry (rnr_early_attempt) should take a WQE now:
 * only once the target has posted receives for the whole `backlog` (the
 * WRs queued behind the RNR, this one included; half its ring at most), so
 * that the retry drains the queue in one go and the posts after it run
 * direct again. With less, the sender would trail its receiver a few
 * receives at a time, each batch an RNR and a look period (ib_send_bw 8 B,
 * rx_depth 512, a threshold of 32: runs with ~1000 early tries, at ~1 M
 * messages/s instead of ~8); short of it the timer decides. */
static bool rq_refilled(const PeerRq &q, uint64_t backlog)
{
	/* head first: tail, read after, is at least that head. */
	uint64_t head = q.rq->head.load(std::memory_order_relaxed);
	uint64_t tail = q.rq->tail.load(std::memory_order_acquire);
	return tail - head >= std::clamp<uint64_t>(backlog, 1, std::max(q.entries / 2, 1u));
}

} // namespace dp

using namespace dp;

const KeyRef &HeldKey::take(const PeerSegment &peer, uint32_t k)
{
	ref = acquire_key(peer, k); /* releases the one held */
	key = k;
	seg = &peer;
	direct = false;
	window.reset();
	if (!ref)
		return ref;
	const KeyEntry &e = *ref;
	iova = e.iova;
	length = e.length;
	access = e.access;
	pdn = e.pdn;
	bound_qpn = e.bound_qpn;
	null_mr = e.kind == KeyKind::NullMr;
	if (null_mr)
		return ref;
	/* Reached directly when the whole MR is: our own memory (a loopback
	 * target) but ODP memory, or a Shared MR whose window covers it. */
	if (peer.local && !is_odp(e.access)) {
		direct = true;
		delta = e.addr - e.iova;
	} else if (e.path == MemPath::Shared) {
		SharedWindow w;
		if (!shared_window(peer, e, w) && w.covers(peer, e.addr, e.length)) {
			direct = true;
			delta = e.addr + w.delta - e.iova;
			window = std::move(w.hold);
		}
	}
	return ref;
}

namespace {

enum ibv_wc_opcode send_wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	default:
		return IBV_WC_SEND;
	}
}

constexpr uint32_t op_bit(enum ibv_wr_opcode op)
{
	return 1u << op;
}

/* The opcodes of the direct path (QpEngine::run_direct), those of them
 * that place data into the local SGEs, and the SENDs among them. */
constexpr uint32_t into_local_ops = op_bit(IBV_WR_RDMA_READ) | op_bit(IBV_WR_ATOMIC_CMP_AND_SWP) |
				    op_bit(IBV_WR_ATOMIC_FETCH_AND_ADD);
constexpr uint32_t send_ops = op_bit(IBV_WR_SEND) | op_bit(IBV_WR_SEND_WITH_IMM);
constexpr uint32_t direct_ops = op_bit(IBV_WR_RDMA_WRITE) | into_local_ops | send_ops;
constexpr uint32_t atomic_ops = op_bit(IBV_WR_ATOMIC_CMP_AND_SWP) | op_bit(IBV_WR_ATOMIC_FETCH_AND_ADD);
/* The opcodes ibv_post_send() takes on any QP type: those libmlx5 has a
 * device opcode for (mlx5_ib_opcode[], IBV_WR_RDMA_WRITE to
 * IBV_WR_DRIVER1), every one verbs defines; the rest are EINVAL. One the
 * QP type cannot carry (a READ on UC, a WRITE on UD) is posted and fails
 * at execution with IBV_WC_LOC_QP_OP_ERR, as the device (and rxe's
 * requester) fails it. */
constexpr uint32_t posted_ops = (op_bit(IBV_WR_DRIVER1) << 1) - 1;

/* Whether bit `op` of an opcode mask is set; opcodes of 32 and above (an
 * application's garbage) never are. */
bool in_mask(uint32_t mask, int op)
{
	return unsigned(op) < 32 && (mask >> op) & 1;
}

/* How a failed access `err` to the memory of `peer` (not the shared
 * mapping: cross-memory attach or the bounce helper) ends the WR. A peer
 * that is gone (ESRCH, EPIPE, its owner-alive word released, which a
 * zombie's is) answers nothing: IBV_WC_SUCCESS here, for the caller's
 * unreachable(), which retries until timeout x retry_cnt and then reports
 * IBV_WC_RETRY_EXC_ERR, as for a peer it never reached. One that gave no
 * answer in the bounce path's time (stopped, its helper stuck): that
 * status at once (a retry could run an atomic twice). Anything else is
 * its memory refusing: IBV_WC_REM_ACCESS_ERR. */
enum ibv_wc_status remote_failure(int err, const PeerSegment &peer)
{
	if (err == ESRCH || err == EPIPE || !peer.alive())
		return IBV_WC_SUCCESS;
	return err == ETIMEDOUT ? IBV_WC_RETRY_EXC_ERR : IBV_WC_REM_ACCESS_ERR;
}

/* Where ibv_post_send's atomic `wr` (its opcode checked) puts the 8-byte
 * response: libmlx5 tells the device that every non-empty SGE of an atomic
 * is 8 bytes long (set_data_ptr_seg_atomic), whatever its length says, so
 * the response lands whole in the first; that SGE, in `one`, or none when
 * every SGE is empty. (The builders' ibv_wr_set_sge keeps the lengths.) */
std::span<const struct ibv_sge> atomic_scatter(const struct ibv_send_wr &wr, struct ibv_sge &one)
{
	for (int i = 0; i < wr.num_sge; i++) {
		if (wr.sg_list[i].length) {
			one = wr.sg_list[i];
			one.length = 8;
			return std::span(&one, 1);
		}
	}
	return {};
}

/* A WR's opcode as the int the application stored: C lets it store any
 * value in the enum, and C++ must not load one outside the enum's range as
 * the enum (undefined; UBSan's enum check reports it). */
int raw_opcode(const struct ibv_send_wr &wr)
{
	int op;
	static_assert(sizeof(op) == sizeof(wr.opcode));
	std::memcpy(&op, &wr.opcode, sizeof(op));
	return op;
}

bool opcode_allowed(enum ibv_qp_type type, int op)
{
	switch (op) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return true;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
	case IBV_WR_BIND_MW:
		return type != IBV_QPT_UD;
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
	default:
		return false;
	}
}

} // namespace

/* ---- Construction ---- */

QpEngine::QpEngine(Qp &qp)
	: qp_(qp), core_(*qp.core), seg_(Segment::of(qp.core->device->index)), device_(qp.core->device->index),
	  qpn_(qp.core->qp_num), type_(qp.core->type), allowed_ops_(0), direct_ops_(0), lane_ops_(0),
	  rxe_(qp.core->device->profile->is(ProfileKind::Rxe)),
	  max_msg_(qp.core->device->profile->port_attr(LinkLayer::InfiniBand).max_msg_sz),
	  pdn_(qp.pd ? qp.pd->pdn : 0),
	  send_cq_(qp.send_cq), recv_cq_(qp.recv_cq),
	  send_target_(send_cq_ && send_cq_->ring ? own_cq_target(*send_cq_->ring) : CqTarget{}),
	  local_keys_(KeyTable::of(*qp.ctx->device))
{
	for (int op = 0; op < 32; op++)
		if (opcode_allowed(type_, op))
			allowed_ops_ |= 1u << op;
	if (type_ == IBV_QPT_RC || type_ == IBV_QPT_UC)
		direct_ops_ = direct_ops;
	/* direct_one()'s, which post_send() tries before its checks: opcodes
	 * every RC, UC and UD QP allows; none for a QP whose WRs take no SGE
	 * (one without send WRs never holds the target direct_one() needs). */
	if (qp.core->caps.created.max_send_sge) {
		if (direct_ops_)
			lane_ops_ = op_bit(IBV_WR_RDMA_WRITE) | send_ops;
		else if (type_ == IBV_QPT_UD)
			lane_ops_ = send_ops;
	}
	desc_off_ = seg_.alloc(sizeof(shm::QpDesc));
	if (!desc_off_)
		return;
	desc_ = seg_.at<shm::QpDesc>(desc_off_);
	desc_->qpn = qpn_;
	desc_->type = type_;
	desc_->pdn = pdn_;
	desc_->state.store(IBV_QPS_RESET);
	desc_->comm_est.store(0, std::memory_order_relaxed);
	desc_->srqn = qp.srq ? qp.srq->srq_num : 0;
	desc_->xrc_domain = qp.core->xrc_domain;
	if (recv_cq_) {
		desc_->recv_cq_off = recv_cq_->ring_off;
		desc_->recv_cq_has_channel = recv_cq_->channel != nullptr;
	}
	if (!qp.srq && type_ != IBV_QPT_XRC_SEND && type_ != IBV_QPT_XRC_RECV) {
		uint32_t entries = std::max(qp.core->caps.created.max_recv_wr, 1u);
		uint32_t e = 1;
		while (e < entries)
			e <<= 1;
		rq_entries_ = e;
		rq_max_sge_ = std::max(qp.core->caps.created.max_recv_sge, 1u);
		rq_stride_ = uint32_t(sizeof(shm::RecvWqe) + sizeof(shm::RecvSge) * rq_max_sge_);
		rq_bytes_ = shm::rq_slots_offset + uint64_t(rq_entries_) * rq_stride_;
		rq_off_ = seg_.alloc(rq_bytes_);
		if (rq_off_) {
			rq_ = seg_.at<shm::RecvQueue>(rq_off_);
			rq_->entries = rq_entries_;
			rq_->max_sge = rq_max_sge_;
			rq_->stride = rq_stride_;
			rq_->magic = shm::rq_magic;
			desc_->rq_off = rq_off_;
			if (recv_cq_ && recv_cq_->ring) {
				rq_room_ = std::make_shared<RqRoom>(0, false);
				rq_counted_ = true;
				cq_track_rq(*recv_cq_, qpn_, rq_room_);
			}
		}
	} else if (qp.srq && qp.srq->room && recv_cq_ && recv_cq_->ring) {
		/* Its receive completions give the SRQ's WQEs back. */
		cq_track_rq(*recv_cq_, qpn_, qp.srq->room);
	}
	if (send_cq_) {
		SqWatch w = cq_watch_sq(*send_cq_, qpn_);
		sq_retired_ = std::move(w.retired);
		sq_slot_ = w.slot;
		if (sq_retired_)
			sq_tail_.store(&sq_retired_->tail, std::memory_order_release);
	}
	desc_->magic = shm::qp_magic;
	progress_register(this);
}

QpEngine::~QpEngine()
{
	progress_unregister(this);
	{
		std::lock_guard guard(sq_lock_);
		release_holds();
	}
	quiesce();
	if (published_)
		seg_.withdraw(broker::ObjectKind::Qp, qpn_);
	seg_.free(rq_off_, rq_bytes_);
	seg_.free(desc_off_, sizeof(shm::QpDesc));
}

int QpEngine::publish()
{
	if (!desc_)
		return ENOMEM;
	if (int err = seg_.publish(broker::ObjectKind::Qp, qpn_, desc_off_))
		return err;
	published_ = true;
	if (recv_cq_ && recv_cq_->channel)
		seg_.attach_fd(broker::ObjectKind::Qp, qpn_, 0, recv_cq_->channel->ibv.fd);
	return 0;
}

void QpEngine::quiesce()
{
	if (!desc_)
		return;
	desc_->dead.store(1, std::memory_order_seq_cst);
	drain_senders(std::chrono::seconds(2), true);
}

void QpEngine::drain_senders(std::chrono::milliseconds bound, bool own_engines)
{
	/* Those of other processes see `dead` or a state that takes nothing
	 * at their next use, and let go (keep_holds, execute, send_ud), or
	 * let go when their progress thread finds them idle (sweep_holds,
	 * 10-20 ms). A sender increments the count and then checks (seq_cst):
	 * either we see its count or it sees what we stored. Holding the
	 * count from before its check until after its completion, a sender
	 * that found the QP ready is gone once the count is seen at zero. */
	if (own_engines)
		for_each_engine([this](QpEngine &e) { e.drop_target(*desc_); });
	/* A live sender lets go within microseconds, or at its progress
	 * thread's next sweep. One that died holding never does: its entry
	 * in `holders` names it, and once it is gone its count is left out
	 * (and the entry cleared for others); an anonymous count (no entry
	 * was free) costs the whole bound. After the first millisecond the
	 * wait sleeps rather than spins, and only then asks whether holders
	 * are gone (a syscall or a /proc read each), so that a process
	 * destroying many QPs of a dead peer spends neither time nor a CPU
	 * on it. The sleep doubles from 0.5 ms to 8 ms: a stopped holder
	 * costs a few hundred checks over the 2 s bound, not thousands. */
	const auto start = Clock::now();
	const auto give_up = start + bound;
	auto nap = std::chrono::microseconds(500);
	while (Clock::now() < give_up) {
		const bool patient = Clock::now() - start < std::chrono::milliseconds(1);
		if (!held_by_others(!patient))
			return;
		if (patient) {
			std::this_thread::yield();
		} else {
			std::this_thread::sleep_for(nap);
			nap = std::min(nap * 2, std::chrono::microseconds(8000));
		}
	}
}

bool QpEngine::held_by_others(bool ask_if_gone)
{
	return desc_->inflight.load(std::memory_order_seq_cst) != 0 ||
	       (ask_if_gone ? live_holds(desc_->holders, "QP", qpn_) : any_holds(desc_->holders));
}

/* ---- Control-path hooks (core lock held) ---- */

void QpEngine::snapshot_attr()
{
	attr_ = core_.attr;
	if (!desc_)
		return;
	desc_->qkey.store(attr_.qkey);
	desc_->dest_qpn.store(attr_.dest_qp_num);
	desc_->min_rnr_timer.store(attr_.min_rnr_timer);
	desc_->path_mtu.store(attr_.path_mtu);
	desc_->port.store(attr_.port_num);
	/* What the responder checks (mlx5: no READ or atomic without
	 * max_dest_rd_atomic). */
	desc_->access_flags.store(core_.device->profile->responder_access(attr_),
				  std::memory_order_release);
	const Port *port = core_.device->port(uint8_t(attr_.port_num));
	const bool ib = port && port->attr.link_layer == IBV_LINK_LAYER_INFINIBAND;
	lrh_slid_ = ib ? port->attr.lid : 0;
	lrh_sl_ = ib ? attr_.ah_attr.sl : 0;
	recv_grh_ = attr_.ah_attr.is_global ? uint32_t(IBV_WC_GRH) : 0;
}

void QpEngine::state_changed(enum ibv_qp_state, enum ibv_qp_state to)
{
	std::lock_guard guard(sq_lock_);
	snapshot_attr();
	state_.store(to);
	if (to == IBV_QPS_RTS)
		sq_opened_.store(true, std::memory_order_relaxed);
	if (desc_)
		desc_->state.store(to, std::memory_order_release);
	/* SQE: the send queue stops and what it holds is flushed; receives
	 * go on (senders still take our RQ: responder_ready()). */
	if (to == IBV_QPS_SQE)
		flush_sq_locked();
}

void QpEngine::reset()
{
	{
		std::lock_guard guard(sq_lock_);
		snapshot_attr();
		state_.store(IBV_QPS_RESET);
		sq_opened_.store(false, std::memory_order_relaxed);
		if (desc_) {
			desc_->state.store(IBV_QPS_RESET, std::memory_order_seq_cst);
			/* A responder error a sender left for check_remote_errors()
			 * belonged to the QP's previous life: the QP it would
			 * have moved to ERR is being reset anyway. */
			desc_->remote_error.store(shm::remote_error_none, std::memory_order_relaxed);
			desc_->comm_est.store(0, std::memory_order_relaxed);
		}
		sq_.clear();
		/* Every WR posted retires (the CQ clean that follows removes
		 * their completions); wait_for_senders() then gives the QP
		 * a new count in the send CQ, which no completion of the old
		 * life names. */
		sq_posted_.store(sq_tail_.load(std::memory_order_relaxed)->load(std::memory_order_acquire),
				 std::memory_order_relaxed);
		if (rq_) {
			std::lock_guard rq_guard(rq_lock_);
			rq_->head.store(rq_->tail.load());
		}
	}
}

void QpEngine::flush()
{
	std::lock_guard guard(sq_lock_);
	state_.store(IBV_QPS_ERR);
	if (desc_)
		desc_->state.store(IBV_QPS_ERR, std::memory_order_seq_cst);
	flush_locked();
	/* On an SRQ the control path reports LAST_WQE_REACHED next: a sender
	 * that saw this QP ready before may still be taking an SRQ WQE for it.
	 * Wait, bounded for a sender that died inside, until none is (our
	 * send lock held: our own engines let go at their next post or
	 * sweep). */
	if (desc_ && desc_->srqn)
		drain_senders(std::chrono::milliseconds(100), false);
}

void QpEngine::wait_for_senders()
{
	/* A sender that took a receive WQE before the reset publishes its
	 * completion before it lets go; the CQ clean that follows removes
	 * it. 100 ms bound: a sender that died holding the count (never
	 * released) or is stopped; a live idle one lets go within 20 ms. */
	if (desc_)
		drain_senders(std::chrono::milliseconds(100), true);
	/* A completion of the old life that a poll hands out after the reset
	 * (another thread's poll before the clean, an entry the clean could
	 * not take yet) retires into the old count. */
	renumber_sq(1);
	/* The RQ's whole room back (reset() moved head to the tail): a new
	 * count from the tail, installed after the CQ dropped the old life's
	 * completions (cq_track_rq cleans first, under the CQ's lock), so
	 * that none of them counts in it. */
	if (rq_counted_) {
		const uint64_t tail = rq_->tail.load(std::memory_order_relaxed);
		auto room = std::make_shared<RqRoom>(tail, false);
		cq_track_rq(*recv_cq_, qpn_, room);
		std::lock_guard guard(rq_lock_);
		rq_room_ = std::move(room);
		rq_freed_seen_ = tail;
	}
}

void QpEngine::renumber_sq(uint32_t next)
{
	/* A new count (SqRetired) in a new slot of the send CQ. The CQ's
	 * lock first, so no QP lock held. */
	if (!send_cq_)
		return;
	SqWatch w = cq_watch_sq(*send_cq_, qpn_, next - 1);
	if (!w.retired)
		return; /* the old count goes on (reset() numbered from its tail) */
	std::lock_guard guard(sq_lock_);
	sq_retired_before_ = std::move(sq_retired_);
	sq_retired_ = std::move(w.retired);
	sq_slot_ = w.slot;
	sq_posted_.store(next - 1, std::memory_order_relaxed);
	sq_tail_.store(&sq_retired_->tail, std::memory_order_release);
}

void QpEngine::flush_sq_locked()
{
	while (!sq_.empty()) {
		const SendWr &wr = sq_.front();
		sq_completing_ = wr.seq;
		complete_send(wr.wr_id, wr.send_flags, wr.opcode, IBV_WC_WR_FLUSH_ERR, 0);
		sq_.pop_front();
	}
}

void QpEngine::flush_locked()
{
	flush_sq_locked();
	if (rq_ && recv_cq_) {
		PeerRq q{rq_, rq_entries_, rq_max_sge_, rq_stride_};
		shm::RecvWqe wqe;
		std::vector<shm::RecvSge> sges;
		while (consume_wqe(q, wqe, sges))
			deliver_completion(*recv_cq_, make_completion(wqe.wr_id, IBV_WC_WR_FLUSH_ERR,
								      IBV_WC_RECV, qpn_));
	}
}

void QpEngine::check_remote_errors()
{
	/* A peer that overran our receive CQ through this QP set the ring's
	 * word and raised nothing (it has no way to our async_fd): the event
	 * comes from here, or from the CQ's next poll, whichever is first, so
	 * that an application that polls no more (asleep on its completion
	 * channel, which an overrun never fires) still gets IBV_EVENT_CQ_ERR
	 * as from a device. One load. (Only we complete into the send CQ,
	 * and report what we overrun at once.) */
	if (recv_cq_ && recv_cq_->ring &&
	    recv_cq_->ring->overrun.load(std::memory_order_relaxed)) [[unlikely]]
		cq_detail::report_overrun(*recv_cq_);
	if (!desc_)
		return;
	if (desc_->comm_est.load(std::memory_order_relaxed) == 1) [[unlikely]] {
		uint32_t noted = 1;
		if (desc_->comm_est.compare_exchange_strong(noted, 2))
			post_qp_event(core_, IBV_EVENT_COMM_EST);
	}
	/* A load first: the progress thread sweeps every QP, and a swap would
	 * pull each descriptor's line away from the senders using it. */
	if (desc_->remote_error.load(std::memory_order_relaxed) == shm::remote_error_none)
		return;
	/* The QP enters ERR before the error is cleared, so that senders
	 * find it not ready throughout (responder_ready). Of two threads
	 * here, one moves it (and raises the event), the other finds it in
	 * ERR already; a reset meanwhile cleared the error itself. */
	uint32_t err = desc_->remote_error.load(std::memory_order_acquire);
	if (err == shm::remote_error_none)
		return;
	/* The error's event first, then what entering ERR raises (an SRQ
	 * QP's LAST_WQE_REACHED), as the device reports the fault before
	 * the QP's last WQE: an application that destroys the QP on
	 * LAST_WQE_REACHED has read why it failed. */
	std::optional<enum ibv_event_type> cause;
	if (err == shm::remote_error_access)
		cause = IBV_EVENT_QP_ACCESS_ERR;
	else if (err == shm::remote_error_cq)
		cause = IBV_EVENT_QP_FATAL;
	else if (err == shm::remote_error_inv_req)
		cause = IBV_EVENT_QP_REQ_ERR;
	qp_async_error(core_, IBV_QPS_ERR, cause);
	desc_->remote_error.compare_exchange_strong(err, shm::remote_error_none);
}

/* ---- Posting ---- */

[[gnu::always_inline]] inline void QpEngine::prefetch_send_lines()
{
	if (target_.rq) {
		/* head: moved by senders' CAS (ours), a line in our cache. */
		const uint64_t head = target_.rq->head.load(std::memory_order_relaxed);
		__builtin_prefetch(reinterpret_cast<char *>(target_.rq) + shm::rq_slots_offset +
					   (head & (target_.rq_entries - 1)) * target_.rq_stride,
				   0);
	}
	if (target_.cq) {
		/* The array last checked: one the ring has left costs a
		 * useless prefetch, nothing more. */
		const uint64_t p = target_.cq.ring->prod.load(std::memory_order_relaxed);
		__builtin_prefetch(cq_detail::RingArray{target_.cq.slots, target_.cq.lg, target_.cq.mask}.at(p), 1);
	}
}

int QpEngine::post_recv(struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	if (!wr)
		return 0; /* libmlx5: an empty list posts nothing */
	if (!rq_) {
		*bad_wr = wr;
		return core_.has_srq ? EINVAL : ENOMEM;
	}
	remote_error_first();
	int st = state_.load();
	if (st == IBV_QPS_RESET) {
		*bad_wr = wr;
		return EINVAL;
	}
	{
		std::lock_guard guard(rq_lock_);
		char *slots = reinterpret_cast<char *>(rq_) + shm::rq_slots_offset;
		for (; wr; wr = wr->next) {
			uint64_t tail = rq_->tail.load(std::memory_order_relaxed);
			/* A WQE holds its place until its completion is polled
			 * (libmlx5's mlx5_post_recv: the tail moves in
			 * ibv_poll_cq), which the receive CQ counts (RqRoom),
			 * a line of this process: never the head senders
			 * move, unless the CQ has no ring to count in. */
			if (tail - rq_freed_seen_ >= core_.caps.created.max_recv_wr)
				rq_freed_seen_ = rq_room_ ? rq_room_->freed.load(std::memory_order_acquire)
							  : rq_->head.load(std::memory_order_acquire);
			if (tail - rq_freed_seen_ >= core_.caps.created.max_recv_wr) {
				*bad_wr = wr;
				return ENOMEM;
			}
			if (wr->num_sge < 0 || uint32_t(wr->num_sge) > rq_max_sge_) {
				*bad_wr = wr;
				return EINVAL;
			}
			rq_publish(slots + (tail & (rq_entries_ - 1)) * rq_stride_, *wr, tail, true);
			/* Pairs with the SRQ limit's acquire load of tail. */
			rq_->tail.store(tail + 1, std::memory_order_release);
		}
	}
	/* Most applications reply right after they repost (ping-pong): the
	 * lines the reply's SEND will need start coming now. */
	if (sends_.load(std::memory_order_relaxed) && sq_lock_.try_lock()) {
		prefetch_send_lines();
		sq_lock_.unlock();
	}
	if (state_.load() == IBV_QPS_ERR) {
		std::lock_guard guard(sq_lock_);
		flush_locked();
	}
	return 0;
}

int QpEngine::fill(SendWr &w, const struct ibv_send_wr *wr)
{
	const QpCaps &caps = core_.caps;
	w.opcode = wr->opcode;
	w.wr_id = wr->wr_id;
	w.send_flags = wr->send_flags;
	w.imm_data = wr->imm_data;
	w.reset_rest();
	if (wr->send_flags & IBV_SEND_INLINE) {
		size_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		if (total > caps.created.max_inline_data)
			return ENOMEM; /* libmlx5's set_data_inl_seg */
	}
	/* Inline data is the data a SEND or WRITE sends; a READ's or an
	 * atomic's response lands in the SGEs all the same (ibv_post_send(3):
	 * inline is for those two; rxe ignores it for the others). */
	if ((wr->send_flags & IBV_SEND_INLINE) && !in_mask(into_local_ops, wr->opcode)) {
		for (int i = 0; i < wr->num_sge; i++)
			w.inline_data.append(reinterpret_cast<const char *>(wr->sg_list[i].addr),
					     wr->sg_list[i].length);
	} else if (in_mask(atomic_ops, wr->opcode) && !rxe_) {
		struct ibv_sge one;
		const std::span<const struct ibv_sge> s = atomic_scatter(*wr, one);
		w.sge.assign(s.data(), s.data() + s.size());
	} else {
		w.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
	}
	w.remote_addr = wr->wr.rdma.remote_addr;
	w.rkey = wr->wr.rdma.rkey;
	if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		w.remote_addr = wr->wr.atomic.remote_addr;
		w.rkey = wr->wr.atomic.rkey;
		w.compare_add = wr->wr.atomic.compare_add;
		w.swap = wr->wr.atomic.swap;
	}
	if (type_ == IBV_QPT_UD) {
		struct ibv_ah *ah = wr->wr.ud.ah;
		/* Our own context is the common case: a pointer compare (to_context()
		 * looks the device up); any other, ours or not, is not the QP's. */
		if (!ah || ah->context != qp_.ctx->abi())
			return EINVAL;
		w.ah_attr = Ah::from(ah)->attr;
		w.remote_qpn = wr->wr.ud.remote_qpn;
		w.remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (type_ == IBV_QPT_XRC_SEND)
		w.xrc_srqn = wr->qp_type.xrc.remote_srqn;
	if (wr->opcode == IBV_WR_BIND_MW && in_mask(allowed_ops_, IBV_WR_BIND_MW)) {
		const struct ibv_mw_bind_info &b = wr->bind_mw.bind_info;
		struct ibv_context *ctx = qp_.ctx->abi();
		if (!wr->bind_mw.mw || wr->bind_mw.mw->context != ctx || (b.mr && b.mr->context != ctx))
			return EINVAL;
		/* libmlx5: a KLM covers 2 GiB at most. */
		if (b.length > (1ull << 31))
			return EOPNOTSUPP;
		w.bind = mw_bind_of(wr->bind_mw.mw, wr->bind_mw.rkey, b);
	}
	return 0;
}

bool QpEngine::run_now(SendWr &wr, bool &fatal)
{
	struct ibv_wc wc{};
	Outcome o = execute(wr, wc);
	if (o == Outcome::Wait)
		return false;
	complete_send(wr.wr_id, wr.send_flags, wr.opcode, wc.status, wc.byte_len);
	fatal = o == Outcome::Fatal;
	return true;
}

/*
 * Posting executes in the calling thread, in order. While the queue is empty
 * (nothing waits for RNR or an unreachable peer) a WR runs at once from
 * scratch_ and never enters the queue; once one waits, everything behind it
 * is queued and the progress thread takes over. After a fatal completion the
 * rest is queued too and flushed when the QP enters ERR.
 */
[[gnu::noinline, gnu::cold]] int QpEngine::post_send_beside_batch(struct ibv_send_wr *wr,
								  struct ibv_send_wr **bad_wr)
{
	if (!wr)
		return 0;
	if (wr_batch.mine()) {
		*bad_wr = wr;
		return EINVAL;
	}
	std::lock_guard batch(wr_batch.lock); /* then sq_lock_, as wr_complete() */
	return post_send_now(wr, bad_wr);
}

/* librxe's validate_send_wr(), before it looks at the queue's room: more
 * SGEs than the QP has, inline data over its limit, an atomic with less
 * than 8 bytes of SGEs or a misaligned address, a BIND_MW with data or
 * immediate or on another type than RC/UC are EINVAL (libmlx5: ENOMEM for
 * the first two, and the others go to the device). */
int QpEngine::rxe_refuses(const struct ibv_send_wr &wr) const
{
	const QpCaps &caps = core_.caps;
	if (uint32_t(wr.num_sge) > caps.created.max_send_sge)
		return EINVAL;
	uint64_t length = 0;
	for (int i = 0; i < wr.num_sge; i++)
		length += wr.sg_list[i].length;
	if (in_mask(atomic_ops, wr.opcode) && (length < 8 || (wr.wr.atomic.remote_addr & 7)))
		return EINVAL;
	if ((wr.send_flags & IBV_SEND_INLINE) && length > caps.created.max_inline_data)
		return EINVAL;
	if (wr.opcode == IBV_WR_BIND_MW &&
	    (length || wr.num_sge || wr.imm_data || (type_ != IBV_QPT_RC && type_ != IBV_QPT_UC)))
		return EINVAL;
	return 0;
}

int QpEngine::post_send_now(struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	if (!wr)
		return 0; /* libmlx5: an empty list posts nothing */
	remote_error_first();
	if (!takes_sends()) {
		/* libmlx5 fails the WR as over the state's SGE limit (-1 before
		 * RTS): ENOMEM, after its opcode check. */
		*bad_wr = wr;
		return type_ == IBV_QPT_XRC_RECV || !in_mask(posted_ops, raw_opcode(*wr)) ? EINVAL
											 : ENOMEM;
	}
	const QpCaps &caps = core_.caps;
	int err = 0;
	bool fatal = false, queued = false, list = false;
	{
		std::lock_guard guard(sq_lock_);
		if (wr && in_mask(direct_ops_ & send_ops, raw_opcode(*wr)))
			prefetch_send_lines(); /* RC, UC */
		for (; wr; wr = wr->next) {
			const int op = raw_opcode(*wr);
			/* The WR's number, which its completion carries; it
			 * counts as posted once taken (sq_posted_). */
			const uint32_t seq = sq_posted_.load(std::memory_order_relaxed) + 1;
			sq_completing_ = seq;
			const bool room = sq_outstanding() < caps.created.max_send_wr;
			/* The common WR first. lane_ops_ holds only opcodes the
			 * QP allows, and none when it has no room for one WR of
			 * one SGE, so the checks below pass for what
			 * direct_one() takes. */
			if (room && in_mask(lane_ops_, op) && wr->num_sge == 1 && sq_.empty() &&
			    !fatal && sq_runs(state_.load()) && direct_one(*wr)) {
				sq_posted_.store(seq, std::memory_order_relaxed);
				continue;
			}
			if (!in_mask(posted_ops, op) || wr->num_sge < 0) {
				err = EINVAL;
				break;
			}
			if (rxe_ && (err = rxe_refuses(*wr))) [[unlikely]]
				break;
			/* libmlx5: "work queue overflow", "max gs exceeded". */
			if (!room || uint32_t(wr->num_sge) > caps.created.max_send_sge) {
				err = ENOMEM;
				break;
			}
			if (sq_.empty() && !fatal && sq_runs(state_.load())) {
				if (Direct d = in_mask(allowed_ops_, op) ? try_direct(*wr) : Direct::NotTaken;
				    d != Direct::NotTaken) {
					sq_posted_.store(seq, std::memory_order_relaxed);
					fatal = d == Direct::Fatal;
					continue;
				}
				if ((err = fill(scratch_, wr)))
					break;
				sq_posted_.store(seq, std::memory_order_relaxed);
				if (!run_now(scratch_, fatal)) {
					scratch_.seq = seq;
					sq_.push_back(std::move(scratch_));
					queued = true;
				}
				continue;
			}
			SendWr &w = sq_.emplace_back();
			if ((err = fill(w, wr))) {
				sq_.pop_back();
				break;
			}
			w.seq = seq;
			sq_posted_.store(seq, std::memory_order_relaxed);
			queued = true;
		}
		list = keep_holds();
		flush_if_halted();
	}
	if (list)
		progress_hold(this);
	if (err)
		*bad_wr = wr;
	if (fatal) {
		/* RC: the QP enters ERR and flushes the rest; UC and UD enter
		 * SQE and flush the rest of the SQ. */
		qp_async_error(core_, send_error_state());
	} else if (queued && progress()) {
		progress_wait(this);
	}
	return err;
}

int QpEngine::submit(std::span<SendWr> batch)
{
	remote_error_first();
	if (!takes_sends())
		return EINVAL;
	sq_lock_.lock();
	/* The usual batch: one WR to an empty queue, which the direct path
	 * takes (ib_write_lat's every post). It needs none of the loop's
	 * bookkeeping below (callgrind, ibv_wr_complete per ib_write_lat
	 * post: 379 -> 354 instructions). The builders checked the queue's
	 * room for it. */
	/* The builders checked the room for it (a post of another thread
	 * since may make it one over: no harm here). */
	if (batch.size() == 1 && sq_.empty() && sq_runs(state_.load())) {
		if (in_mask(direct_ops_ & send_ops, batch[0].opcode))
			prefetch_send_lines(); /* RC, UC */
		const uint32_t seq = sq_posted_.load(std::memory_order_relaxed) + 1;
		sq_completing_ = seq;
		if (direct_one(batch[0])) {
			sq_posted_.store(seq, std::memory_order_relaxed);
			const bool list = keep_holds();
			flush_if_halted();
			sq_lock_.unlock();
			if (list)
				progress_hold(this);
			return 0;
		}
	}
	bool fatal = false, queued = false, list = false;
	{
		std::lock_guard guard(sq_lock_, std::adopt_lock);
		/* The builders checked the room for each WR, but another
		 * thread's posts may have taken it since. */
		if (sq_outstanding() + batch.size() > core_.caps.created.max_send_wr)
			return ENOMEM;
		if (!batch.empty() && in_mask(direct_ops_ & send_ops, batch[0].opcode))
			prefetch_send_lines(); /* RC, UC */
		for (SendWr &w : batch) {
			/* Every WR of the batch is taken from here on. */
			w.seq = sq_posted_.load(std::memory_order_relaxed) + 1;
			sq_posted_.store(w.seq, std::memory_order_relaxed);
			sq_completing_ = w.seq;
			if (sq_.empty() && !fatal && sq_runs(state_.load())) {
				if (direct_one(w))
					continue;
				if (Direct d = try_direct(w); d != Direct::NotTaken) {
					fatal = d == Direct::Fatal;
					continue;
				}
				w.reset_retry(); /* the builders leave it (begin()) */
				if (run_now(w, fatal))
					continue;
			} else {
				w.reset_retry();
			}
			sq_.push_back(std::move(w));
			queued = true;
		}
		list = keep_holds();
		flush_if_halted();
	}
	if (list)
		progress_hold(this);
	if (fatal)
		qp_async_error(core_, send_error_state());
	else if (queued && progress())
		progress_wait(this);
	return 0;
}

/* ---- Execution ---- */

/* ---- Local keys held between operations ---- */

const KeyRef *LocalKeyCache::get_slow(const KeyTable &keys, uint32_t lkey)
{
	Entry *victim = nullptr;
	for (Entry &e : entries_) {
		if (e.ref && e.lkey == lkey) {
			if (e.ref.names(lkey)) {
				e.stamp = stamp_;
				last_ = unsigned(&e - entries_);
				return &e.ref;
			}
			e.ref.release(); /* withdrawn since */
		}
		/* Evict nothing this WR uses: its memory is being touched. */
		if (e.stamp != stamp_ && (!victim || !e.ref || (victim->ref && e.stamp < victim->stamp)))
			victim = &e;
	}
	KeyRef ref = keys.acquire(lkey);
	/* A window's key is an rkey only. */
	if (!ref || ref->kind == KeyKind::Mw)
		return nullptr;
	if (!victim) {
		extra_.push_back(std::move(ref));
		return &extra_.back();
	}
	victim->ref = std::move(ref); /* releases the one it held */
	victim->lkey = lkey;
	victim->stamp = stamp_;
	last_ = unsigned(victim - entries_);
	return &victim->ref;
}

void LocalKeyCache::drop(const KeySlot &slot)
{
	for (Entry &e : entries_)
		if (e.ref.slot() == &slot)
			e.ref.release();
}

void LocalKeyCache::clear()
{
	extra_.clear();
	for (Entry &e : entries_)
		e.ref.release();
}

void LocalKeyCache::forget_all()
{
	extra_.clear(); /* empty between WRs */
	for (Entry &e : entries_)
		e.ref.forget();
}

void QpEngine::drop_local_key(const KeySlot &slot)
{
	std::lock_guard guard(sq_lock_);
	local_refs_.drop(slot);
	/* A loopback target's keys. */
	if (held_.rkey.ref.slot() == &slot)
		held_.rkey.release();
	if (held_.recv_key.ref.slot() == &slot)
		held_.recv_key.release();
}

void QpEngine::drop_target(const shm::QpDesc &t)
{
	std::lock_guard guard(sq_lock_);
	if (held_.inflight == &t)
		release_holds();
}

namespace {

/* KeyTable::unpublish() of one of our keys: engines let go of their holds,
 * so that the deregistration can finish. */
void drop_withdrawn_key(const KeySlot &slot)
{
	for_each_engine([&](QpEngine &e) { e.drop_local_key(slot); });
}

[[maybe_unused]] const bool withdraw_hook_installed = (key_withdrawn_hook = drop_withdrawn_key, true);

} // namespace

void QpEngine::hold_target(shm::QpDesc &t)
{
	release_holds();
	held_.inflight_entry = shm::hold_qp(t, own_pid());
	held_.inflight = &t;
	held_.inflight_qpn = t.qpn;
}

void QpEngine::drop_all_holds()
{
	release_holds();
	local_refs_.clear();
}

void QpEngine::invalidate_window(const PeerSegment &peer, const shm::QpDesc &t, uint32_t rkey)
{
	KeyRef ref = acquire_key(peer, rkey);
	if (ref && ref->kind == KeyKind::Mw && ref->bound_qpn == t.qpn && ref->pdn == t.pdn)
		ref.withdraw(rkey);
}

void QpEngine::release_holds()
{
	held_.rkey.release();
	held_.recv_key.release();
	if (held_.inflight) {
		/* Still the QP we counted in on, unless its destroy_qp gave up
		 * waiting for us (this process stopped for over 2 s) and the
		 * place now holds something else: not ours to count out. */
		shm::QpDesc &t = *held_.inflight;
		if (t.magic == shm::qp_magic && t.qpn == held_.inflight_qpn)
			shm::release_qp(t, held_.inflight_entry);
		held_.inflight = nullptr;
	}
}

[[gnu::always_inline]] inline bool QpEngine::keep_holds()
{
	if (!held_.inflight)
		return false;
	/* Loads of lines this post read already. A target going away
	 * (destroy_qp, a move to ERR whose SRQ flush waits for senders,
	 * dereg_mr of the key) gets its counts back now, not at the sweep. */
	const shm::QpDesc &t = *held_.inflight;
	const uint32_t state = t.state.load(std::memory_order_relaxed);
	if (t.dead.load(std::memory_order_relaxed) ||
	    (state != IBV_QPS_RTR && state != IBV_QPS_RTS && state != IBV_QPS_SQD &&
	     state != IBV_QPS_SQE) ||
	    held_.rkey.withdrawn() || held_.recv_key.withdrawn()) {
		release_holds();
		return false;
	}
	held_.posts.store(held_.posts.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
	return !std::exchange(held_.listed, true);
}

bool QpEngine::sweep_holds()
{
	/* A busy engine is seen without its lock: taking it could stall a
	 * post, for long if this thread lost the CPU meanwhile. */
	const uint64_t posts = held_.posts.load(std::memory_order_relaxed);
	if (posts != held_.posts_swept) {
		held_.posts_swept = posts;
		return true;
	}
	std::unique_lock guard(sq_lock_, std::try_to_lock);
	if (!guard.owns_lock())
		return true; /* a post is running: not idle */
	if (held_.inflight && held_.posts.load(std::memory_order_relaxed) != posts) {
		held_.posts_swept = held_.posts.load(std::memory_order_relaxed);
		return true;
	}
	release_holds();
	held_.listed = false;
	return false;
}

void QpEngine::forget_holds()
{
	local_refs_.forget_all();
	held_.rkey.forget();
	held_.recv_key.forget();
	held_.inflight = nullptr;
	held_.listed = false;
}

void QpEngine::complete_send(uint64_t wr_id, unsigned int send_flags, enum ibv_wr_opcode opcode,
			     enum ibv_wc_status status, uint32_t byte_len)
{
	bool signaled = (send_flags & IBV_SEND_SIGNALED) || core_.sq_sig_all;
	if (status == IBV_WC_SUCCESS && !signaled)
		return;
	if (!send_cq_)
		return;
	/* libmlx5 (handle_good_req): a good completion of a WR with
	 * immediate data says so. */
	const uint32_t wc_flags = status == IBV_WC_SUCCESS && (opcode == IBV_WR_SEND_WITH_IMM ||
								opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
					  ? IBV_WC_WITH_IMM
					  : 0;
	if (deliver_send_completion(*send_cq_, send_target_, wr_id, status, send_wc_opcode(opcode),
				    qpn_, byte_len, {sq_completing_, sq_slot_}, wc_flags) == ENOSPC) [[unlikely]]
		send_cq_overrun();
}

void QpEngine::send_cq_overrun()
{
	/* Our own owner's check (the next post, or the progress thread's
	 * sweep) moves the QP to ERR, outside the send lock held here. */
	if (desc_)
		shm::leave_remote_error(*desc_, shm::remote_error_cq);
}

bool QpEngine::progress()
{
	for (;;) {
		bool fatal = false;
		{
			std::unique_lock guard(sq_lock_, std::try_to_lock);
			if (!guard.owns_lock())
				return true; /* another thread is at it; come back */
			if (sq_.empty())
				return false;
			if (!sq_runs(state_.load())) {
				flush_if_halted();
				return false;
			}
			SendWr &wr = sq_.front();
			/* A WR in its RNR wait may look early (rnr_early_attempt),
			 * every rnr_look_period at most: a try costs the target
			 * a transfer of its RQ's lines. */
			const auto now = Clock::now();
			const bool early = wr.not_before > now;
			if (early && (wr.rnr_left < 0 || wr.peer_dead || now < wr.rnr_look))
				return true;
			if (early)
				wr.rnr_look = now + rnr_look_period;
			struct ibv_wc wc{};
			rnr_early_attempt = early;
			sq_completing_ = wr.seq;
			Outcome o = execute(wr, wc);
			rnr_early_attempt = false;
			release_holds();
			if (o == Outcome::Wait)
				return true;
			complete_send(wr.wr_id, wr.send_flags, wr.opcode, wc.status, wc.byte_len);
			sq_.pop_front();
			fatal = o == Outcome::Fatal;
		}
		if (fatal) {
			/* RC: the QP enters ERR and flushes the rest; UC
			 * and UD enter SQE and flush the rest of the SQ. */
			qp_async_error(core_, send_error_state());
			return false;
		}
	}
}

/* OdpStage (datapath.h). */
void *OdpStage::read_in(uint64_t addr, size_t len)
{
	char *b = buffers_.emplace_back(new char[len]).get();
	if (memshare::copy_checked(b, reinterpret_cast<const void *>(addr), len))
		return nullptr;
	return b;
}

void *OdpStage::write_out(uint64_t addr, size_t len)
{
	/* What is there now: an atomic places 8 bytes of a longer SGE, and the
	 * rest goes back as it was (a hole fails the WR before it runs). */
	void *b = read_in(addr, len);
	if (b)
		out_.push_back({addr, b, len});
	return b;
}

int OdpStage::write_back()
{
	for (const Out &o : out_)
		if (memshare::copy_checked(reinterpret_cast<void *>(o.addr), o.from, o.len))
			return EFAULT;
	return 0;
}

/*
 * Executes one WR (sq_lock_ held): execute_wr(), and then what it staged of
 * ODP memory goes out, if it succeeded (a destination that is not mapped
 * makes it a local protection error, which ends the QP as any is).
 */
[[gnu::flatten]] QpEngine::Outcome QpEngine::execute(SendWr &wr, struct ibv_wc &wc)
{
	Outcome o = execute_wr(wr, wc);
	if (!odp_stage_.empty()) [[unlikely]] {
		if (o == Outcome::Done && wc.status == IBV_WC_SUCCESS && odp_stage_.write_back()) {
			wc.status = IBV_WC_LOC_PROT_ERR;
			o = Outcome::Fatal;
		}
		odp_stage_.clear();
	}
	return o;
}

/*
 * execute()'s WR. Done: wc.status says how it went (the
 * send completion is written by the caller). Fatal: the same, and the QP
 * then moves to ERR. Wait: try again later (wr.not_before).
 */
QpEngine::Outcome QpEngine::execute_wr(SendWr &wr, struct ibv_wc &wc)
{
	const bool reliable = type_ == IBV_QPT_RC || type_ == IBV_QPT_XRC_SEND;
	auto fail = [&](enum ibv_wc_status s) {
		wc.status = s;
		return Outcome::Fatal;
	};
	if (!in_mask(allowed_ops_, wr.opcode)) [[unlikely]]
		return fail(IBV_WC_LOC_QP_OP_ERR); /* posted_ops: not for this QP type */

	/* Memory windows (lib/mw.h): local operations on our key table,
	 * which wait for the holders of the key; this queue lets go of its
	 * own holds first. LOCAL_INV applies to bound type 2 windows only (an
	 * MR of ibv_reg_mr() is not invalidatable: a local operation error,
	 * as rxe reports it, docs/verbs.md). */
	if (wr.opcode == IBV_WR_LOCAL_INV || wr.opcode == IBV_WR_BIND_MW) {
		drop_all_holds();
		wc.byte_len = 0;
		const std::optional<enum ibv_wc_status> s =
			wr.opcode == IBV_WR_BIND_MW
				? bind_mw(wr.bind, pdn_, qpn_)
				: local_invalidate(*qp_.ctx->device, wr.imm_data, pdn_);
		if (!s) { /* not now: at the head of the queue, as for RNR */
			wr.not_before = Clock::now() + std::chrono::microseconds(20);
			return Outcome::Wait;
		}
		wc.status = *s;
		return wc.status == IBV_WC_SUCCESS ? Outcome::Done : Outcome::Fatal;
	}

	/* The local side first: gather (or scatter, for READ/atomics). The
	 * vectors are the engine's (sq_lock_ held, execute never nests), kept
	 * with their capacity: no allocation and no TLS lookup per WR. */
	std::vector<struct iovec> &local = local_iov_;
	LocalKeyCache &local_refs = local_refs_;
	local.clear();
	/* Local keys stay held at least until the WR is done (the cache may
	 * keep them longer); whatever path returns, this WR is done then. */
	struct EndWr {
		LocalKeyCache &refs;
		~EndWr() { refs.end_wr(); }
	} end_wr{local_refs};
	uint64_t length = 0;
	const bool into_local = in_mask(into_local_ops, wr.opcode);
	/* A READ or an atomic built with ibv_wr_set_inline_data: its response
	 * has no SGE to land in (a malformed WQE). */
	if (into_local && !wr.inline_data.empty())
		return fail(IBV_WC_LOC_QP_OP_ERR);
	if (type_ != IBV_QPT_UD) { /* before any piece is looked at */
		uint64_t total = wr.inline_data.size();
		for (const struct ibv_sge &s : wr.sge)
			total += s.length;
		if (total > max_msg_)
			return fail(IBV_WC_LOC_LEN_ERR);
	}
	if (!wr.inline_data.empty()) {
		local.push_back({wr.inline_data.data(), wr.inline_data.size()});
		length = wr.inline_data.size();
	} else if (enum ibv_wc_status s = local_iovecs(
			   local_keys_, pdn_, wr.sge.data(), int(wr.sge.size()),
			   into_local ? IBV_ACCESS_LOCAL_WRITE : 0, local, local_refs, length,
			   &odp_stage_)) {
		return fail(s);
	}
	wc.byte_len = uint32_t(length);
	if (type_ == IBV_QPT_UD)
		return execute_ud({wr.opcode, wr.send_flags, wr.imm_data, wr.ah_attr, wr.remote_qpn,
				   wr.remote_qkey},
				  wc, local.data(), int(local.size()), length);

	/* The target QP: the one resolved last while it is still valid (its
	 * segment not gone, the descriptor still this number's), else through
	 * the broker cache. */
	uint32_t target_qpn = attr_.dest_qp_num;
	int err = 0;
	if (!target_valid(target_qpn)) {
		release_holds(); /* they point into the old target's segment */
		target_ = {};
		PeerObject obj;
		err = resolve_object(device_, broker::ObjectKind::Qp, target_qpn, obj);
		if (!err) {
			auto *d = obj.seg->at<shm::QpDesc>(obj.off);
			if (!d || d->magic != shm::qp_magic || d->qpn != target_qpn) {
				err = ENOENT;
			} else {
				target_.seg = std::move(obj.seg);
				target_.desc = d;
				target_.qpn = target_qpn;
			}
		}
	}
	struct {
		shm::QpDesc *desc;
	} t = {target_.desc};
	auto unreachable = [&]() {
		if (!reliable) {
			wc.status = IBV_WC_SUCCESS; /* unreliable: lost on the wire */
			return Outcome::Done;
		}
		/* No answer: the requester retries until timeout x retry_cnt. */
		if (!wr.peer_dead) {
			wr.peer_dead = true;
			wr.give_up = Clock::now() + dead_peer_wait(attr_);
		}
		if (Clock::now() < wr.give_up) {
			wr.not_before = Clock::now() + std::chrono::milliseconds(1);
			return Outcome::Wait;
		}
		return fail(IBV_WC_RETRY_EXC_ERR);
	};
	if (err || !target_.seg->alive())
		return unreachable();
	/* The target's in-flight count, held while we touch its queues, CQ
	 * or memory: taken once and kept across WRs and posts to one target
	 * (held_), then `dead` checked for each. */
	if (held_.inflight != t.desc)
		hold_target(*t.desc);
	if (t.desc->dead.load(std::memory_order_seq_cst)) {
		release_holds(); /* its destroy waits for the count */
		forget_object(device_, broker::ObjectKind::Qp, target_qpn);
		target_.desc = nullptr; /* resolved afresh next time */
		return unreachable();
	}
	if (!(type_ == IBV_QPT_UD ? responder_ready(*t.desc)
				  : answers_to(*t.desc, qpn_, type_) &&
					  connected_responder_ready(*t.desc))) {
		/* A responder that is not ready drops packets. Its reset waits
		 * for the count (wait_for_senders). */
		release_holds();
		return unreachable();
	}
	if (type_ == IBV_QPT_UD && t.desc->qkey.load() !=
	    ((wr.remote_qkey & 0x80000000u) ? attr_.qkey : wr.remote_qkey)) {
		wc.status = IBV_WC_SUCCESS; /* qkey mismatch: silently dropped */
		return Outcome::Done;
	}
	const PeerSegment &peer = *target_.seg;

	/* Where an incoming message takes its receive WQE and writes its
	 * completion: the QP's RQ and receive CQ; the QP's SRQ (basic) and
	 * the QP's receive CQ; or, for XRC, the SRQ the WR names, which must
	 * be an XRC SRQ of the target XRC_RECV QP's domain, and its CQ. */
	struct RecvSide {
		PeerRq q;
		PeerObject srq_obj;
		const PeerSegment *seg = nullptr;     /* where the WQE's buffers are */
		uint32_t pdn = 0;
		const PeerSegment *cq_seg = nullptr;
		uint64_t cq_off = 0;
		bool cq_has_channel = false;
		broker::ObjectKind channel_kind = broker::ObjectKind::Qp;
		uint32_t channel_id = 0;
	} rs;
	auto open_recv_side = [&]() -> enum ibv_wc_status {
		rs.seg = &peer;
		rs.pdn = t.desc->pdn;
		rs.cq_seg = &peer;
		rs.cq_off = t.desc->recv_cq_off;
		rs.cq_has_channel = t.desc->recv_cq_has_channel;
		rs.channel_id = target_qpn;
		if (type_ == IBV_QPT_XRC_SEND) {
			/* The target is an XRC_RECV QP (answers_to()). */
			if (!peer_srq(device_, wr.xrc_srqn, rs.srq_obj, rs.q) ||
			    rs.q.rq->srq_type != IBV_SRQT_XRC ||
			    rs.q.rq->xrc_domain != t.desc->xrc_domain)
				return IBV_WC_REM_INV_REQ_ERR;
		} else if (t.desc->srqn) {
			if (!peer_srq(device_, t.desc->srqn, rs.srq_obj, rs.q))
				return IBV_WC_REM_OP_ERR;
		} else {
			/* Our cached target's own RQ, validated once. */
			if (!target_.rq) {
				PeerRq q;
				if (!peer_rq(peer, t.desc->rq_off, q))
					return IBV_WC_REM_OP_ERR;
				target_.rq = q.rq;
				target_.rq_entries = q.entries;
				target_.rq_max_sge = q.max_sge;
				target_.rq_stride = q.stride;
				sends_.store(true, std::memory_order_relaxed);
			}
			rs.q = {target_.rq, target_.rq_entries, target_.rq_max_sge, target_.rq_stride};
			return IBV_WC_SUCCESS;
		}
		rs.seg = rs.srq_obj.seg.get();
		rs.pdn = rs.q.rq->pdn;
		if (type_ == IBV_QPT_XRC_SEND) {
			rs.cq_seg = rs.seg;
			rs.cq_off = rs.q.rq->cq_off;
			rs.cq_has_channel = rs.q.rq->cq_has_channel;
			rs.channel_kind = broker::ObjectKind::Srq;
			rs.channel_id = wr.xrc_srqn;
		}
		return IBV_WC_SUCCESS;
	};
	auto produce_recv = [&](const Completion &rc) {
		CqTarget other;
		CqTarget *ring = &other;
		if (rs.cq_seg == &peer && rs.cq_off == t.desc->recv_cq_off) {
			/* The target QP's own receive CQ: validated once. */
			if (!target_.cq)
				target_.cq = peer_cq(peer, rs.cq_off);
			ring = &target_.cq;
		} else {
			other = peer_cq(*rs.cq_seg, rs.cq_off);
		}
		if (*ring) {
			if (recv_cq_seen_.ring != ring->ring)
				recv_cq_seen_ = {ring->ring, 0};
			if (cq_ring_produce(*ring, rc,
					    rs.cq_has_channel
						    ? CqChannel::attached_to(device_, rs.channel_kind,
									     rs.channel_id)
						    : CqChannel::none(),
					    nullptr, &recv_cq_seen_.cons) == ENOSPC) [[unlikely]]
				shm::leave_remote_error(*t.desc, shm::remote_error_cq);
		}
	};

	/* A request naming no receive queue it may use (XRC: an SRQ number
	 * of no XRC SRQ of its domain) is invalid: the responder QP enters
	 * ERR too, with its own event (IBA's Invalid Request Local Work
	 * Queue Error). */
	auto recv_side_failed = [&](enum ibv_wc_status st) {
		if (st == IBV_WC_REM_INV_REQ_ERR)
			shm::leave_remote_error(*t.desc, shm::remote_error_inv_req);
		return fail(st);
	};

	/* Remote access for one-sided operations, checked against the
	 * responder's PD: for XRC (whose XRC_RECV QPs have none) the PD of
	 * the XRC SRQ the WR names, as IBA's XRC annex has it. Its MRs are
	 * the SRQ owner's, which may be another process than the XRC_RECV
	 * QP's: the rkey is looked up, and the memory reached, there. */
	uint32_t access_pdn = t.desc->pdn;
	const PeerSegment *key_seg = &peer;
	if (type_ == IBV_QPT_XRC_SEND && wr.opcode != IBV_WR_SEND &&
	    wr.opcode != IBV_WR_SEND_WITH_IMM && wr.opcode != IBV_WR_SEND_WITH_INV) {
		if (enum ibv_wc_status st = open_recv_side())
			return recv_side_failed(st);
		access_pdn = rs.pdn;
		key_seg = rs.seg;
	}
	/* A key held in another segment than the target's is let go when
	 * this WR is done: only the target's segment is kept mapped for as
	 * long as held_ may name it (rs.srq_obj keeps this one for now). */
	struct KeyOfOtherSegment {
		HeldKey &held;
		const PeerSegment *seg;
		~KeyOfOtherSegment()
		{
			if (held.seg && held.seg == seg)
				held.release();
		}
	} let_go{held_.rkey, key_seg != &peer ? key_seg : nullptr};
	auto responder_error = [&](uint32_t what) {
		t.desc->remote_error.store(what, std::memory_order_release);
	};

	switch (wr.opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		const Outcome o = one_sided({wr.opcode, wr.remote_addr, wr.rkey, wr.compare_add, wr.swap},
					    *t.desc, *key_seg, access_pdn, local, length, wc);
		return o == Outcome::Unreachable ? unreachable() : o;
	}
	case IBV_WR_RDMA_WRITE_WITH_IMM: {
		/* A zero-length one writes nothing: its address and rkey go
		 * unchecked (IBA C9-88), the QP's remote write access not. */
		const KeyRef *rkey = length ? hold_rkey(*key_seg, *t.desc, access_pdn, wr.rkey,
							wr.remote_addr, length, IBV_ACCESS_REMOTE_WRITE)
					    : nullptr;
		if (length ? !rkey
			   : !(t.desc->access_flags.load(std::memory_order_relaxed) &
			       IBV_ACCESS_REMOTE_WRITE)) {
			if (!reliable) {
				wc.status = IBV_WC_SUCCESS; /* UC: dropped */
				return Outcome::Done;
			}
			responder_error(shm::remote_error_access);
			return fail(IBV_WC_REM_ACCESS_ERR);
		}
		/* The immediate needs a receive WQE before anything moves. */
		shm::RecvWqe wqe{};
		std::vector<shm::RecvSge> &rsges = recv_sges_;
		if (enum ibv_wc_status st = open_recv_side())
			return recv_side_failed(st);
		if ((rnr_early_attempt && !rq_refilled(rs.q, sq_.size())) ||
		    !consume_wqe(rs.q, wqe, rsges)) {
			if (!reliable) {
				wc.status = IBV_WC_SUCCESS;
				return Outcome::Done;
			}
			goto rnr;
		}
		if (int e = length ? remote_write(*key_seg, **rkey, rkey->address_of(wr.remote_addr),
						  local.data(), int(local.size()))
				   : 0) {
			const enum ibv_wc_status s = remote_failure(e, *key_seg);
			return s ? fail(s) : unreachable();
		}
		{
			Completion rc = make_completion(wqe.wr_id, IBV_WC_SUCCESS,
							IBV_WC_RECV_RDMA_WITH_IMM, target_qpn);
			rc.wc.byte_len = uint32_t(length);
			rc.wc.imm_data = wr.imm_data;
			rc.wc.wc_flags = IBV_WC_WITH_IMM | recv_grh_;
			rc.wc.src_qp = qpn_;
			rc.wc.slid = lrh_slid_;
			rc.wc.sl = lrh_sl_;
			rc.solicited = wr.send_flags & IBV_SEND_SOLICITED;
			produce_recv(rc);
		}
		wc.status = IBV_WC_SUCCESS;
		return Outcome::Done;
	}
	default:
		break;
	}

	/* SEND / SEND_WITH_IMM: a receive WQE of the target's RQ or SRQ. */
	{
		if (enum ibv_wc_status st = open_recv_side())
			return recv_side_failed(st);
		const PeerSegment *rq_seg = rs.seg;
		shm::RecvWqe wqe{};
		std::vector<shm::RecvSge> &rsges = recv_sges_;
		if ((rnr_early_attempt && !rq_refilled(rs.q, sq_.size())) ||
		    !consume_wqe(rs.q, wqe, rsges)) {
			if (!reliable) {
				wc.status = IBV_WC_SUCCESS; /* UC/UD: dropped silently */
				return Outcome::Done;
			}
			goto rnr;
		}
		/* UD: the first 40 bytes of the buffer are the GRH's. */
		uint64_t skip = type_ == IBV_QPT_UD ? 40 : 0;
		uint64_t room = 0;
		for (const shm::RecvSge &s : rsges)
			room += s.length;
		Completion rc = make_completion(wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, target_qpn);
		rc.wc.src_qp = qpn_;
		rc.wc.slid = lrh_slid_;
		rc.wc.sl = lrh_sl_;
		rc.solicited = wr.send_flags & IBV_SEND_SOLICITED;
		if (wr.opcode == IBV_WR_SEND_WITH_IMM) {
			rc.wc.imm_data = wr.imm_data;
			rc.wc.wc_flags = IBV_WC_WITH_IMM;
		} else if (wr.opcode == IBV_WR_SEND_WITH_INV) {
			/* invalidated_rkey shares imm_data's place (host
			 * order). A bound type 2 window of the responder QP
			 * is invalidated below; any other key is reported,
			 * not revoked (docs/verbs.md). */
			rc.wc.imm_data = wr.imm_data;
			rc.wc.wc_flags = IBV_WC_WITH_INV;
		}
		rc.wc.wc_flags |= recv_grh_;
		rc.wc.byte_len = uint32_t(length + skip);
		enum ibv_wc_status sender = IBV_WC_SUCCESS;
		if (length + skip > room) {
			rc.wc.status = IBV_WC_LOC_LEN_ERR;
			sender = IBV_WC_REM_INV_REQ_ERR;
		} else {
			/* Scatter: one contiguous source (gathered first when
			 * the WR has several pieces), placed piece by piece
			 * into the receive SGEs. */
			std::vector<char> &gathered = gathered_;
			const char *data = local.empty() ? nullptr
							 : static_cast<const char *>(local[0].iov_base);
			if (local.size() > 1) {
				gathered.resize(length);
				size_t at = 0;
				for (const struct iovec &v : local) {
					std::memcpy(gathered.data() + at, v.iov_base, v.iov_len);
					at += v.iov_len;
				}
				data = gathered.data();
			}
			uint64_t pos = 0;  /* position in the message incl. GRH */
			for (const shm::RecvSge &s : rsges) {
				if (pos >= length + skip)
					break;
				uint64_t n = std::min<uint64_t>(s.length, length + skip - pos);
				if (s.lkey == null_mr_key) { /* its bytes are dropped */
					pos += n;
					continue;
				}
				/* The buffer's key, held while we write (its
				 * dereg_mr waits); kept between WRs and posts when
				 * in the target's own segment, which target_
				 * keeps mapped (an SRQ's owner may be another). */
				KeyRef own;
				const KeyRef &ref = rq_seg == &peer ? held_.recv_key.get(peer, s.lkey)
								    : (own = acquire_key(*rq_seg, s.lkey));
				if (!ref || ref->pdn != rs.pdn ||
				    !ref.permits(s.addr, n, IBV_ACCESS_LOCAL_WRITE)) {
					rc.wc.status = IBV_WC_LOC_PROT_ERR;
					sender = IBV_WC_REM_OP_ERR;
					break;
				}
				/* The GRH part is left as is (no global route). */
				uint64_t from = pos < skip ? 0 : pos - skip;
				uint64_t grh = pos < skip ? std::min(n, skip - pos) : 0;
				if (n > grh) {
					struct iovec v = {const_cast<char *>(data) + from, size_t(n - grh)};
					if (remote_write(*rq_seg, *ref, ref.address_of(s.addr + grh), &v, 1)) {
						rc.wc.status = IBV_WC_LOC_PROT_ERR;
						sender = IBV_WC_REM_OP_ERR;
						break;
					}
				}
				pos += n;
			}
		}
		if (wr.opcode == IBV_WR_SEND_WITH_INV && rc.wc.status == IBV_WC_SUCCESS)
			invalidate_window(peer, *t.desc, wr.imm_data);
		produce_recv(rc);
		if (rc.wc.status != IBV_WC_SUCCESS) {
			responder_error(shm::remote_error_fatal);
			if (reliable)
				return fail(sender);
		}
		wc.status = IBV_WC_SUCCESS;
		return Outcome::Done;
	}

rnr:
	/* Receiver not ready: retry after the responder's RNR timer, rnr_retry
	 * times (7: forever). */
	if (rnr_early_attempt) {
		rnr_early_misses++;
		return Outcome::Wait; /* the timer and the count stand */
	}
	if (wr.rnr_left < 0)
		wr.rnr_left = attr_.rnr_retry;
	if (attr_.rnr_retry != 7) {
		if (wr.rnr_left == 0)
			return fail(IBV_WC_RNR_RETRY_EXC_ERR);
		wr.rnr_left--;
	}
	wr.not_before = Clock::now() +
		scaled_us(rnr_timer_us[t.desc->min_rnr_timer.load() & 31]);
	return Outcome::Wait;
}

/*
 * A one-sided operation needs both the responder QP's permission
 * (qp_access_flags; for XRC the XRC_RECV QP's, which `t` is) and the MR's,
 * checked against the responder's PD `pdn`; either missing is the same
 * remote access error (nullptr). The key stays held (held_) for the next
 * WRs and posts naming it too: while it is held its entry stays the key's.
 */
const KeyRef *QpEngine::hold_rkey(const PeerSegment &peer, const shm::QpDesc &t, uint32_t pdn,
				  uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access)
{
	if (!(t.access_flags.load(std::memory_order_relaxed) & access))
		return nullptr;
	/* A hold kept from an earlier post is good while the key is still
	 * published: the owner's dereg_mr withdraws it, then waits for us. */
	const HeldKey &h = held_.rkey;
	const KeyRef &ref = held_.rkey.get(peer, rkey);
	if (ref && !h.null_mr && h.pdn == pdn && (!h.bound_qpn || h.bound_qpn == t.qpn) &&
	    h.permits(addr, len, access))
		return &ref;
	return nullptr;
}

/*
 * RDMA WRITE (without immediate), RDMA READ and the atomics at a target QP
 * `t` that is held (in-flight count) and ready, with the local side
 * gathered: the responder's checks and the data movement. Sets wc.status
 * (and byte_len for atomics); Fatal when the QP must enter ERR.
 */
QpEngine::Outcome QpEngine::one_sided(const OneSided &op, shm::QpDesc &t, const PeerSegment &peer,
				      uint32_t pdn, std::span<const struct iovec> local,
				      uint64_t length, struct ibv_wc &wc)
{
	wc.status = IBV_WC_SUCCESS;
	auto access_error = [&]() {
		if (type_ == IBV_QPT_UC)
			return Outcome::Done; /* UC: the responder drops it */
		t.remote_error.store(shm::remote_error_access, std::memory_order_release);
		wc.status = IBV_WC_REM_ACCESS_ERR;
		return Outcome::Fatal;
	};
	auto fail = [&](enum ibv_wc_status s) {
		wc.status = s;
		return Outcome::Fatal;
	};
	switch (op.opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_READ: {
		const bool write = op.opcode == IBV_WR_RDMA_WRITE;
		const uint32_t need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
		/* Zero length: nothing moves, and the responder checks neither
		 * address nor rkey (IBA C9-88), only the QP's access. */
		if (!length)
			return t.access_flags.load(std::memory_order_relaxed) & need ? Outcome::Done
										: access_error();
		const KeyRef *rkey = hold_rkey(peer, t, pdn, op.rkey, op.remote_addr, length, need);
		if (!rkey)
			return access_error();
		const int n = int(local.size());
		if (char *p = held_.rkey.local(op.remote_addr); p && n == 1) {
			/* The common case: one piece, memory reached directly. */
			if (write)
				copy_payload(p, local[0].iov_base, local[0].iov_len);
			else
				copy_payload(local[0].iov_base, p, local[0].iov_len);
			return Outcome::Done;
		}
		const uint64_t at = rkey->address_of(op.remote_addr);
		if (int e = write ? remote_write(peer, **rkey, at, local.data(), n)
				  : remote_read(peer, **rkey, at, local.data(), n)) {
			const enum ibv_wc_status s = remote_failure(e, peer);
			return s ? fail(s) : Outcome::Unreachable;
		}
		return Outcome::Done;
	}
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		break;
	default:
		return fail(IBV_WC_LOC_QP_OP_ERR); /* not one-sided: a caller's bug */
	}
	/* Less room than the 8-byte response: the requester's own error,
	 * found before the request leaves (the target is not touched). */
	if (length < 8)
		return fail(IBV_WC_LOC_LEN_ERR);
	if (op.remote_addr & 7) {
		/* Misaligned: an invalid request, which puts the responder
		 * in ERR too (IBA's Invalid Request Local Work Queue Error). */
		shm::leave_remote_error(t, shm::remote_error_inv_req);
		return fail(IBV_WC_REM_INV_REQ_ERR);
	}
	const KeyRef *rkey = hold_rkey(peer, t, pdn, op.rkey, op.remote_addr, 8,
				       IBV_ACCESS_REMOTE_ATOMIC);
	if (!rkey)
		return access_error();
	uint64_t old = 0;
	const AtomicOp aop = op.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? AtomicOp::CmpSwp
								     : AtomicOp::FetchAdd;
	const uint64_t at = rkey->address_of(op.remote_addr);
	if (char *p = cached_window(peer, **rkey, at, 8)) {
		/* The target's physical page: a CPU atomic. */
		std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t *>(p));
		if (aop == AtomicOp::FetchAdd) {
			old = word.fetch_add(op.compare_add);
		} else {
			old = op.compare_add;
			word.compare_exchange_strong(old, op.swap);
		}
	} else if (int e = remote_memory_for(peer, **rkey).atomic(peer, **rkey, at, aop,
								  op.compare_add, op.swap, &old)) {
		const enum ibv_wc_status s = remote_failure(e, peer);
		return s ? fail(s) : Outcome::Unreachable;
	}
	/* The original value lands in the first 8 bytes of the local SGEs. */
	const char *from = reinterpret_cast<const char *>(&old);
	size_t left = 8;
	for (const struct iovec &v : local) {
		size_t n = std::min(left, v.iov_len);
		std::memcpy(v.iov_base, from, n);
		from += n;
		left -= n;
		if (!left)
			break;
	}
	wc.byte_len = 8;
	return Outcome::Done;
}

/*
 * The direct path: a plain RDMA WRITE, READ or atomic of an RC or UC QP
 * whose target is the one cached, alive and ready, executed from a view of
 * the application's WR (ibv_post_send: its ibv_send_wr, nothing copied into
 * scratch_, inline data read where it lies, at post time as IBV_SEND_INLINE
 * asks; ibv_wr_complete: the SendWr the builders made). Whatever is out of
 * the ordinary (a target to resolve, not ready or dead, inline data over the
 * limit, a local key to refuse) is left to the general path before anything
 * happened but the in-flight hold (held_, which that path takes over): both
 * give the same result. (sq_lock_ held, queue empty.)
 */
/* Both entry points are flattened (every call inlined into them): the
 * direct path is a dozen small functions (the key checks, the window
 * lookup, the copy, the completion), and their calls were a fifth of what a
 * WR cost. callgrind, signaled inline WRITE + poll: 723 -> 610 instructions
 * per WR, for ~20 KB of text. execute() likewise, for the SENDs. */
[[gnu::flatten]] QpEngine::Direct QpEngine::try_direct(const struct ibv_send_wr &wr)
{
	if (type_ == IBV_QPT_UD) {
		/* fill()'s checks (an AH of this context; post_send checked
		 * the opcode), failing ones left to it for the EINVAL. */
		struct ibv_ah *ah = wr.wr.ud.ah;
		if (!ah || ah->context != qp_.ctx->abi())
			return Direct::NotTaken;
		const bool inlined = wr.send_flags & IBV_SEND_INLINE;
		const std::span<const struct ibv_sge> sge(wr.sg_list, size_t(wr.num_sge));
		if (inlined) {
			uint64_t length = 0;
			for (const struct ibv_sge &s : sge)
				length += s.length;
			if (length > core_.caps.created.max_inline_data)
				return Direct::NotTaken;
		}
		return run_direct_ud(wr.wr_id,
				     {wr.opcode, wr.send_flags, wr.imm_data, Ah::from(ah)->attr,
				      wr.wr.ud.remote_qpn, wr.wr.ud.remote_qkey},
				     sge, inlined);
	}
	if (!in_mask(direct_ops_, wr.opcode))
		return Direct::NotTaken;
	const bool inlined = wr.send_flags & IBV_SEND_INLINE;
	/* fill() checks the size of what a READ or an atomic marks inline
	 * and then ignores the mark. */
	if (inlined && in_mask(into_local_ops, wr.opcode))
		return Direct::NotTaken;
	DirectWr d{wr.wr_id, wr.send_flags, {wr.opcode, wr.wr.rdma.remote_addr, wr.wr.rdma.rkey, 0, 0},
		   std::span(wr.sg_list, size_t(wr.num_sge)), inlined, wr.imm_data};
	struct ibv_sge one;
	if (in_mask(atomic_ops, wr.opcode)) {
		d.op = {wr.opcode, wr.wr.atomic.remote_addr, wr.wr.atomic.rkey,
			wr.wr.atomic.compare_add, wr.wr.atomic.swap};
		if (!rxe_) /* rxe scatters the 8 bytes over the SGEs as given */
			d.sge = atomic_scatter(wr, one);
	}
	return run_direct(d); /* which leaves inline data over the limit to fill() */
}

[[gnu::flatten]] QpEngine::Direct QpEngine::try_direct(const SendWr &w)
{
	const bool ud = type_ == IBV_QPT_UD;
	if (!ud && !in_mask(direct_ops_, w.opcode))
		return Direct::NotTaken;
	/* The builders copied inline data already (and checked its size). */
	const struct ibv_sge data = {uint64_t(uintptr_t(w.inline_data.data())),
				     uint32_t(w.inline_data.size()), 0};
	const bool inlined = !w.inline_data.empty();
	if (ud)
		return run_direct_ud(
			w.wr_id,
			{w.opcode, w.send_flags, w.imm_data, w.ah_attr, w.remote_qpn, w.remote_qkey},
			inlined ? std::span(&data, 1) : std::span(w.sge.data(), w.sge.size()), inlined);
	return run_direct({w.wr_id, w.send_flags,
			   {w.opcode, w.remote_addr, w.rkey, w.compare_add, w.swap},
			   inlined ? std::span(&data, 1) : std::span(w.sge.data(), w.sge.size()),
			   inlined, w.imm_data});
}

/*
 * Most WRs of a stream are RDMA WRITEs of one piece from one buffer to one
 * remote buffer. Once a WR like it went the direct way, the target's
 * in-flight count and the remote key are held (held_) and the local key is
 * the one looked at first: such a WR needs run_direct()'s, one_sided()'s
 * and hold_rkey()'s checks, in that order, and none of their dispatch on
 * the opcode, the number of pieces and the memory path, nor the DirectWr
 * they share. This is that WR on its own: ~150 instructions where
 * try_direct() took ~250 (callgrind, queue-bench, RC WRITE from an SGE
 * signaled every 16th: 412 -> 328 per post + poll). Anything else (another
 * opcode, key or target, a hold to take, a check failing) returns false
 * having done nothing but touch the local key's entry, and try_direct()
 * gives the answer, the error completion included.
 */
[[gnu::flatten]] bool QpEngine::direct_write(uint64_t wr_id, unsigned int send_flags,
					     const struct ibv_sge &s, bool inlined, uint32_t rkey,
					     uint64_t remote)
{
	/* Held: the target's in-flight count (run_direct() takes it) and a
	 * remote key, taken at the target's segment (held_ is let go before
	 * target_ changes) and reached directly; names() below says whether
	 * it is this WR's and still published. */
	shm::QpDesc *t = target_.desc;
	const HeldKey &held = held_.rkey;
	if (!t || held_.inflight != t || !held.direct || !held_target_ready(*t))
		return false;
	/* hold_rkey()'s checks of the remote key (the null MR is never
	 * direct), then direct_local()'s of the local piece. */
	if (!(t->access_flags.load(std::memory_order_relaxed) & IBV_ACCESS_REMOTE_WRITE) ||
	    !held.ref.names(rkey) || held.pdn != t->pdn ||
	    (held.bound_qpn && held.bound_qpn != t->qpn) ||
	    !held.permits(remote, s.length, IBV_ACCESS_REMOTE_WRITE))
		return false;
	const void *from;
	if (!one_piece(s, inlined, from))
		return false;
	if (s.length)
		copy_payload(held.local(remote), from, s.length);
	local_refs_.end_wr();
	if ((send_flags & IBV_SEND_SIGNALED) || core_.sq_sig_all)
		complete_send(wr_id, send_flags, IBV_WR_RDMA_WRITE, IBV_WC_SUCCESS, s.length);
	return true;
}

/*
 * The SEND of the same shape: to a target whose in-flight count is held
 * (its RQ and receive CQ are resolved by send_direct() itself), from one
 * piece, with run_direct()'s checks before send_direct()'s. Anything
 * send_direct() leaves to the general path (RNR, an SRQ, a receive that
 * does not fit or whose key refuses) goes to try_direct() as from
 * run_direct(), nothing done (callgrind, ib_send_bw 8 B, the client
 * process: 1124 -> 1045 instructions per message).
 */
[[gnu::flatten]] bool QpEngine::direct_send(uint64_t wr_id, unsigned int send_flags,
					    enum ibv_wr_opcode opcode, uint32_t imm_data,
					    const struct ibv_sge &s, bool inlined)
{
	shm::QpDesc *t = target_.desc;
	if (!t || held_.inflight != t || !held_target_ready(*t))
		return false;
	const void *from;
	if (!one_piece(s, inlined, from))
		return false;
	const struct iovec piece = {const_cast<void *>(from), s.length};
	const bool sent = send_direct(opcode, send_flags, imm_data, *t, *target_.seg,
				      std::span(&piece, s.length ? 1 : 0), s.length);
	local_refs_.end_wr();
	if (!sent)
		return false;
	if ((send_flags & IBV_SEND_SIGNALED) || core_.sq_sig_all)
		complete_send(wr_id, send_flags, opcode, IBV_WC_SUCCESS, s.length);
	return true;
}

/* run_direct()'s checks of a target whose in-flight count is held. */
[[gnu::always_inline]] inline bool QpEngine::held_target_ready(shm::QpDesc &t)
{
	if (!target_valid(attr_.dest_qp_num) || !target_.seg->alive() ||
	    t.dead.load(std::memory_order_seq_cst))
		return false;
	/* answers_to(): checked when the hold was taken. */
	return connected_responder_ready(t);
}

QpEngine::Direct QpEngine::run_direct(const DirectWr &wr)
{
	/* try_direct() let only direct_ops through. READ and the atomics
	 * write into the local SGEs, which inline data has none of. */
	const bool into_local = in_mask(into_local_ops, wr.op.opcode);
	if (into_local && wr.inlined)
		return Direct::NotTaken;
	const uint32_t local_access = into_local ? IBV_ACCESS_LOCAL_WRITE : 0;
	const bool send = in_mask(send_ops, wr.op.opcode);
	const uint32_t target_qpn = attr_.dest_qp_num;
	if (!target_valid(target_qpn) || !target_.seg->alive())
		return Direct::NotTaken;
	shm::QpDesc &t = *target_.desc;
	if (held_.inflight != &t)
		hold_target(t);
	if (t.dead.load(std::memory_order_seq_cst))
		return Direct::NotTaken;
	if (!answers_to(t, qpn_, type_)) {
		release_holds(); /* held_target_ready() relies on the check */
		return Direct::NotTaken;
	}
	if (!connected_responder_ready(t))
		return Direct::NotTaken;

	struct iovec few[4];
	std::span<const struct iovec> local;
	uint64_t length = 0;
	for (const struct ibv_sge &s : wr.sge)
		length += s.length;
	if (length > max_msg_)
		return Direct::NotTaken; /* execute()'s LOC_LEN_ERR */
	if (!direct_local(wr.sge, wr.inlined, local_access, few, local, length))
		return Direct::NotTaken;
	/* ibv_post_send's inline data over the limit: fill()'s EINVAL (the
	 * builders checked theirs). direct_local() took no key for it. */
	if (wr.inlined && length > core_.caps.created.max_inline_data)
		return Direct::NotTaken;
	struct ibv_wc wc;
	wc.byte_len = uint32_t(length);
	Outcome o = Outcome::Done;
	if (!send) {
		o = one_sided(wr.op, t, *target_.seg, t.pdn, local, length, wc);
	} else if (send_direct(wr.op.opcode, wr.send_flags, wr.imm_data, t, *target_.seg, local,
			       length)) {
		wc.status = IBV_WC_SUCCESS;
	} else {
		local_refs_.end_wr();
		return Direct::NotTaken;
	}
	local_refs_.end_wr();
	/* A responder that gave no answer: the general path retries (what
	 * moved meanwhile went to a process that is gone or stuck). */
	if (o == Outcome::Unreachable)
		return Direct::NotTaken;
	complete_send(wr.wr_id, wr.send_flags, wr.op.opcode, wc.status, wc.byte_len);
	return o == Outcome::Fatal ? Direct::Fatal : Direct::Done;
}

/* The local pieces: on the stack for the common WR of up to 4 SGEs or
 * inline pieces, else in the engine's vector. Empty pieces are left out,
 * as local_iovecs() leaves them: no copy ever gets a length of 0 (and a
 * pointer that may be null). The stack case checks each lkey as
 * local_iovecs() does; a null MR (a sink to write into) takes the vector
 * path, which has the sink. */
bool QpEngine::direct_local(std::span<const struct ibv_sge> sge, bool inlined, uint32_t access,
			    struct iovec (&few)[4], std::span<const struct iovec> &local,
			    uint64_t &length)
{
	/* One non-empty piece: 1 placed in `out`; -1 refused (local key);
	 * 0 a null MR's, for the vector path. */
	auto place = [&](const struct ibv_sge &s, struct iovec &out) {
		uint64_t at = s.addr;
		if (!inlined) {
			const KeyRef *ref = local_refs_.get(local_keys_, s.lkey);
			if (ref && (*ref)->kind == KeyKind::NullMr)
				return 0;
			/* ODP memory: execute() stages it. */
			if (!ref || (*ref)->pdn != pdn_ || !ref->permits(s.addr, s.length, access) ||
			    is_odp((*ref)->access))
				return -1;
			at = ref->address_of(s.addr);
		}
		out = {reinterpret_cast<void *>(at), s.length};
		return 1;
	};
	int placed = 1;
	if (sge.size() == 1) { /* the common WR, without the loop */
		length = sge[0].length;
		if (length)
			placed = place(sge[0], few[0]);
		local = std::span(few, length ? 1 : 0);
	} else if (sge.size() <= std::size(few)) {
		length = 0;
		size_t n = 0;
		for (const struct ibv_sge &s : sge) {
			length += s.length;
			if (s.length && (placed = place(s, few[n++])) <= 0)
				break;
		}
		local = std::span(few, n);
	} else {
		placed = 0;
	}
	if (placed > 0)
		return true;
	if (placed < 0) {
		local_refs_.end_wr();
		return false;
	}
	length = 0; /* the vector path */
	local_iov_.clear();
	if (inlined) {
		for (const struct ibv_sge &s : sge) {
			if (s.length)
				local_iov_.push_back({reinterpret_cast<void *>(s.addr), s.length});
			length += s.length;
		}
	} else if (local_iovecs(local_keys_, pdn_, sge.data(), int(sge.size()), access, local_iov_,
				local_refs_, length, nullptr)) {
		local_refs_.end_wr();
		return false;
	}
	local = local_iov_;
	return true;
}

QpEngine::Direct QpEngine::run_direct_ud(uint64_t wr_id, const UdSend &wr,
					 std::span<const struct ibv_sge> sge, bool inlined)
{
	struct iovec few[4];
	std::span<const struct iovec> local;
	uint64_t length = 0;
	if (!direct_local(sge, inlined, 0, few, local, length))
		return Direct::NotTaken;
	struct ibv_wc wc;
	wc.byte_len = uint32_t(length);
	const Outcome o = execute_ud(wr, wc, local.data(), int(local.size()), length);
	local_refs_.end_wr();
	complete_send(wr_id, wr.send_flags, wr.opcode, wc.status, wc.byte_len);
	return o == Outcome::Fatal ? Direct::Fatal : Direct::Done;
}

/*
 * A SEND into the target's own RQ when nothing about it is out of the
 * ordinary: a receive WQE is posted whose first SGE takes the whole message,
 * in memory reached directly (ours, or a Shared MR through a window), and
 * the target has its receive CQ. All of it is checked before the WQE is
 * taken (its copy is intact if the head moves by our CAS, as in
 * consume_wqe()); from there on nothing can fail. false: nothing happened
 * but the holds, and the general path decides (RNR, a UC drop, an SRQ, a
 * length or protection error, a scatter over several SGEs, another memory
 * path). (sq_lock_ held, target held and ready.)
 */
bool QpEngine::send_direct(enum ibv_wr_opcode opcode, unsigned int send_flags, uint32_t imm_data,
			   shm::QpDesc &t, const PeerSegment &peer, std::span<const struct iovec> local,
			   uint64_t length)
{
	if (t.srqn)
		return false;
	if (!target_.rq) {
		PeerRq q;
		if (!peer_rq(peer, t.rq_off, q))
			return false;
		target_.rq = q.rq;
		target_.rq_entries = q.entries;
		target_.rq_max_sge = q.max_sge;
		target_.rq_stride = q.stride;
		sends_.store(true, std::memory_order_relaxed);
	}
	if (!target_.cq && !(target_.cq = peer_cq(peer, t.recv_cq_off)))
		return false;
	shm::RecvQueue &rq = *target_.rq;
	uint64_t head = rq.head.load(std::memory_order_acquire);
	char *slot = reinterpret_cast<char *>(&rq) + shm::rq_slots_offset +
		(head & (target_.rq_entries - 1)) * target_.rq_stride;
	/* Pairs with the producer's release store of seq (post_recv). */
	if (rq_slot_seq(slot).load(std::memory_order_acquire) != uint32_t(head + 1))
		return false;
	shm::RecvWqe wqe;
	std::memcpy(&wqe, slot, offsetof(shm::RecvWqe, seq));
	char *to = nullptr;
	if (length) {
		if (!wqe.num_sge || !target_.rq_max_sge)
			return false;
		shm::RecvSge s;
		std::memcpy(&s, slot + sizeof(wqe), sizeof(s));
		if (s.length < length || s.lkey == null_mr_key)
			return false;
		/* Held as execute() holds it: kept for the next WRs. */
		const HeldKey &h = held_.recv_key;
		if (!held_.recv_key.get(peer, s.lkey) || h.null_mr || h.pdn != t.pdn ||
		    !h.permits(s.addr, length, IBV_ACCESS_LOCAL_WRITE))
			return false;
		if (!(to = h.local(s.addr)))
			return false;
	}
	if (!rq.head.compare_exchange_strong(head, head + 1, std::memory_order_acq_rel))
		return false;
	for (const struct iovec &v : local) {
		copy_payload(to, v.iov_base, v.iov_len);
		to += v.iov_len;
	}
	const bool imm = opcode == IBV_WR_SEND_WITH_IMM;
	const PlainCompletion rc{wqe.wr_id,
				 IBV_WC_SUCCESS,
				 IBV_WC_RECV,
				 uint32_t(length),
				 imm ? imm_data : 0,
				 t.qpn,
				 qpn_,
				 (imm ? uint32_t(IBV_WC_WITH_IMM) : 0) | recv_grh_,
				 bool(send_flags & IBV_SEND_SOLICITED),
				 lrh_slid_,
				 lrh_sl_};
	if (recv_cq_seen_.ring != target_.cq.ring)
		recv_cq_seen_ = {target_.cq.ring, 0};
	if (cq_ring_produce(target_.cq, rc,
			    t.recv_cq_has_channel
				    ? CqChannel::attached_to(device_, broker::ObjectKind::Qp, t.qpn)
				    : CqChannel::none(),
			    &recv_cq_seen_.cons) == ENOSPC) [[unlikely]]
		shm::leave_remote_error(t, shm::remote_error_cq);
	return true;
}

/* ---- Target memory ---- */

/* A local pointer to [addr, addr + len) of a peer's Shared MR through the
 * windows kept in the engine (sq_lock_ held); nullptr when the MR takes
 * another path or no window can be had (the generic path then answers). */
char *QpEngine::cached_window(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			      uint64_t len)
{
	if (peer.local || mr.path != MemPath::Shared)
		return nullptr;
	if (windows_[0].covers(peer, addr, len))
		return windows_[0].at(addr);
	if (windows_[1].covers(peer, addr, len)) {
		std::swap(windows_[0], windows_[1]);
		return windows_[0].at(addr);
	}
	SharedWindow w;
	if (shared_window(peer, mr, w) || !w.covers(peer, addr, len))
		return nullptr;
	windows_[1] = std::move(windows_[0]);
	windows_[0] = std::move(w);
	return windows_[0].at(addr);
}

int QpEngine::remote_write(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			   const struct iovec *local, int count)
{
	if (count == 1) { /* the common case, without the loops */
		char *to = direct_at(peer, mr, addr, local->iov_len);
		if (!to)
			return remote_memory_for(peer, mr).write(peer, mr, addr, local, 1);
		copy_payload(to, local->iov_base, local->iov_len);
		return 0;
	}
	char *to = direct_at(peer, mr, addr, iov_bytes(local, count));
	if (!to)
		return remote_memory_for(peer, mr).write(peer, mr, addr, local, count);
	gather(to, local, count);
	return 0;
}

int QpEngine::remote_read(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			  const struct iovec *local, int count)
{
	if (count == 1) { /* the common case, without the loops */
		const char *from = direct_at(peer, mr, addr, local->iov_len);
		if (!from)
			return remote_memory_for(peer, mr).read(peer, mr, addr, local, 1);
		copy_payload(local->iov_base, from, local->iov_len);
		return 0;
	}
	const char *from = direct_at(peer, mr, addr, iov_bytes(local, count));
	if (!from)
		return remote_memory_for(peer, mr).read(peer, mr, addr, local, count);
	scatter(local, count, from);
	return 0;
}

/* ---- Entry points ---- */

void attach_data_path(Qp &qp)
{
	auto engine = std::make_unique<QpEngine>(qp);
	if (int err = engine->publish())
		log_debug("QP %u not published (%d): reachable by no peer", qp.core->qp_num, err);
	set_qp_data_path(qp, std::move(engine));
}

int post_send(Qp &qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	auto *e = static_cast<QpEngine *>(qp.core->data_path.get());
	if (!e) {
		*bad_wr = wr;
		return EINVAL;
	}
	return e->post_send(wr, bad_wr);
}

int renumber_send_queue(Qp &qp, uint32_t next)
{
	auto *e = static_cast<QpEngine *>(qp.core->data_path.get());
	if (!e)
		return EINVAL;
	e->renumber_sq(next);
	return 0;
}

int post_recv(Qp &qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	auto *e = static_cast<QpEngine *>(qp.core->data_path.get());
	if (!e) {
		*bad_wr = wr;
		return EINVAL;
	}
	return e->post_recv(wr, bad_wr);
}

} // namespace shmverbs
