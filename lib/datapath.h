/* SPDX-License-Identifier: MIT */
/*
 * The send/receive engine of a QP (the QpDataPath of lib/qp.h).
 *
 * The initiator does all the work (passive target): ibv_post_send appends the
 * WRs to this QP's software send queue (private memory) and executes them at
 * once, in order, in the calling thread: a SEND consumes a receive WQE from
 * the target's RQ ring in the target's segment, places the payload in the
 * target's buffer (lib/remote_memory.h), appends the receive completion to
 * the target's CQ ring and kicks its channel; then the send completion is
 * written. A WR that cannot proceed (RNR, dead peer waiting for its
 * timeout) stays at the head of the queue; the per-process progress thread
 * retries it on its timer. Everything behind it waits: RC is in order.
 *
 * The QP's own receive queue is a ring in this process's segment (owner
 * produces in post_recv, senders consume); its descriptor (shm::QpDesc) is
 * published with the broker under the QP number.
 *
 * Locking: `sq_lock_` guards the send queue and the attribute snapshot.
 * The control path calls the QpDataPath hooks with the QP's core lock held
 * and they take sq_lock_: the order is core lock -> sq_lock_. The engine
 * never calls into the control path (qp_async_error, events) with sq_lock_
 * held.
 */
#pragma once

#include "copy.h"
#include "cq.h"
#include "locks.h"
#include "mw.h"
#include "qp.h"
#include "remote_memory.h"
#include "segment.h"
#include "shm_layout.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <type_traits>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <sys/uio.h>
#include <vector>

namespace shmverbs {

/*
 * Whether a target QP takes messages: in RTR or later (RESET, INIT and ERR
 * drop them), and no error a sender found on it waits for its owner
 * (remote_error: the QP is in ERR from that error on, as on a device,
 * though its owner moves it there later). The state is loaded seq_cst,
 * the Dekker pair of a sender's in-flight count with reset and destroy.
 */
[[gnu::always_inline]] inline bool responder_ready(const shm::QpDesc &d)
{
	const uint32_t st = d.state.load(std::memory_order_seq_cst);
	return (st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
		st == IBV_QPS_SQE) &&
	       d.remote_error.load(std::memory_order_relaxed) == shm::remote_error_none;
}

/* Whether connected responder `d` (RC, UC, XRC_RECV) answers QP `sender`
 * of type `sender_type`: only the QP it is connected to, and only over its
 * own transport (RC to RC, UC to UC, XRC_SEND to XRC_RECV: a packet whose
 * opcode is of another transport is dropped). A device's responder sends
 * its ACKs and NAKs to its own peer, so another requester never hears back
 * and, on RC, runs out of retries (on UC its packets meet a PSN of another
 * stream). Checked when a sender takes its hold on the responder: the
 * destination changes only through RESET, whose wait for senders takes the
 * hold back, and the type never. */
[[gnu::always_inline]] inline bool answers_to(const shm::QpDesc &d, uint32_t sender,
					      enum ibv_qp_type sender_type)
{
	const uint32_t transport =
		sender_type == IBV_QPT_XRC_SEND ? uint32_t(IBV_QPT_XRC_RECV) : uint32_t(sender_type);
	return d.type == transport && d.dest_qpn.load(std::memory_order_relaxed) == sender;
}

/* responder_ready() of a connected responder (RC, UC, XRC_RECV), which
 * notes the first message it takes in RTR: the device raises
 * IBV_EVENT_COMM_EST for it (IBA 11.6.3), here the owner
 * (check_remote_errors). */
[[gnu::always_inline]] inline bool connected_responder_ready(shm::QpDesc &d)
{
	if (!responder_ready(d))
		return false;
	if (d.state.load(std::memory_order_relaxed) == IBV_QPS_RTR &&
	    d.comm_est.load(std::memory_order_relaxed) == 0) [[unlikely]]
		d.comm_est.store(1, std::memory_order_release);
	return true;
}

/*
 * A vector of trivially copyable T that keeps up to N elements in place and
 * moves to the heap only beyond that: the common WR (a few SGEs, a small
 * inline payload) costs no allocation. Capacity, once grown, is kept.
 */
template <typename T, size_t N>
class SmallVec {
	static_assert(std::is_trivially_copyable_v<T>);

public:
	size_t size() const { return size_; }
	bool empty() const { return size_ == 0; }
	T *data() { return heap_.empty() ? local_ : heap_.data(); }
	const T *data() const { return heap_.empty() ? local_ : heap_.data(); }
	T *begin() { return data(); }
	T *end() { return data() + size_; }
	const T *begin() const { return data(); }
	const T *end() const { return data() + size_; }
	void clear() { size_ = 0; }
	void push_back(const T &v)
	{
		if (size_ < N && heap_.empty()) [[likely]] {
			local_[size_++] = v; /* the common case, inline */
			return;
		}
		append_slow(&v, 1);
	}
	/* A new last element for the caller to fill in place. Filling a
	 * temporary and push_back()ing it costs a store-forwarding stall:
	 * the copy reads the temporary in one wide load before its narrower
	 * stores have left the store buffer. */
	T &emplace_back()
	{
		if (size_ < N && heap_.empty()) [[likely]]
			return local_[size_++];
		const T blank{};
		append_slow(&blank, 1);
		return data()[size_ - 1];
	}
	void assign(const T *first, const T *last)
	{
		size_ = 0;
		append(first, size_t(last - first));
	}
	[[gnu::always_inline]] void append(const T *p, size_t n)
	{
		if (size_ + n > N && size_ + n > heap_.size()) [[unlikely]] {
			std::vector<T> grown(std::max(size_ + n, 2 * heap_.size()));
			if (size_)
				std::memcpy(grown.data(), data(), size_ * sizeof(T));
			heap_.swap(grown);
		}
		copy_payload(data() + size_, p, n * sizeof(T));
		size_ += n;
	}

private:
	[[gnu::noinline]] void append_slow(const T *p, size_t n) { append(p, n); }

	size_t size_ = 0;
	T local_[N];
	std::vector<T> heap_; /* in use once non-empty */
};

/*
 * The local keys (lkeys) a send engine keeps held between operations, so
 * that an lkey used again costs a load (its slot still publishes it) instead
 * of two locked instructions. A hold keeps the owner's dereg_mr waiting; it
 * ends when KeyTable::unpublish() withdraws the key (key_withdrawn_hook ->
 * every engine's drop_local_key()), when an entry is evicted, and with the
 * engine. Holds beyond the cached ones last one WR (`extra`). Under the
 * engine's sq_lock_.
 */
class LocalKeyCache {
public:
	LocalKeyCache() = default;
	LocalKeyCache(const LocalKeyCache &) = delete;
	LocalKeyCache &operator=(const LocalKeyCache &) = delete;
	~LocalKeyCache() { clear(); }

	/* A held entry for `lkey` of `keys`, or nullptr when it is not
	 * published. Holds stay valid until end_wr() at least. The entry
	 * used last is looked at first, inline: a stream of WRs from one
	 * buffer costs a compare and a load of the key's slot. */
	const KeyRef *get(const KeyTable &keys, uint32_t lkey)
	{
		Entry &e = entries_[last_];
		if (e.lkey == lkey && e.ref.names(lkey)) [[likely]] {
			e.stamp = stamp_;
			return &e.ref;
		}
		return get_slow(keys, lkey);
	}
	/* The current WR is done: its extra holds end. */
	void end_wr()
	{
		if (!extra_.empty()) /* clear() is a call, even of nothing */
			extra_.clear();
		stamp_++;
	}
	/* Lets go of every hold on `slot`. */
	void drop(const KeySlot &slot);
	void clear();
	/* A forked child: the holds count in the parent's name; forgotten
	 * uncounted. */
	void forget_all();

private:
	static constexpr int ways = 4;
	struct Entry {
		uint32_t lkey = 0;
		uint64_t stamp = 0; /* the WR that used it last */
		KeyRef ref;
	};
	const KeyRef *get_slow(const KeyTable &keys, uint32_t lkey);

	Entry entries_[ways];
	std::vector<KeyRef> extra_;
	uint64_t stamp_ = 1;
	unsigned last_ = 0; /* the entry get() returned last */
};

/*
 * The local pieces of a WR that lie in ODP MRs (lib/mr.h), whose pages may
 * be absent: the engine never touches them directly. A piece the WR reads
 * (a SEND's or WRITE's source) is copied by the kernel into a buffer here
 * before the WR runs; a piece it writes (a READ's or an atomic's
 * destination) is read in as well and copied out once the WR has succeeded
 * (write_back()). A hole is a local protection error, as mlx5 reports an
 * ODP fault it cannot resolve. Under the engine's sq_lock_;
 * emptied after each WR.
 */
class OdpStage {
public:
	bool empty() const { return buffers_.empty(); }
	/* A buffer holding [addr, addr + len) now; nullptr: not mapped. */
	void *read_in(uint64_t addr, size_t len);
	/* A buffer holding [addr, addr + len) now, whose contents go back
	 * there at write_back(); nullptr: not mapped. */
	void *write_out(uint64_t addr, size_t len);
	/* 0, or EFAULT where a destination is not mapped (or not writable). */
	int write_back();
	void clear()
	{
		buffers_.clear();
		out_.clear();
	}

private:
	struct Out {
		uint64_t addr;
		const void *from;
		size_t len;
	};
	std::deque<std::unique_ptr<char[]>> buffers_; /* not zeroed: each is written first */
	std::vector<Out> out_;
};

/* A key of a peer's key table held between WRs and posts (QpEngine's
 * held_): the slot's entry stays the key's while held, and a hold still
 * good costs loads only. */
struct HeldKey {
	KeyRef ref;
	uint32_t key = 0;
	const PeerSegment *seg = nullptr; /* whose table; kept alive by the holder */
	/* Copied from the entry when taken, which stays the key's while it
	 * is held: what the checks of each use read, in the holder's line. */
	uint64_t iova = 0, length = 0;
	uint32_t access = 0, pdn = 0;
	/* A type 2 window's QP (KeyEntry::bound_qpn): requests to any other
	 * responder QP may not use the key. */
	uint32_t bound_qpn = 0;
	bool null_mr = false;
	/* Where the memory is reached directly, when it is (ours, or a
	 * Shared MR through `window`, which keeps that mapped): the local
	 * address of an iova is iova + delta. */
	bool direct = false;
	uint64_t delta = 0;
	std::shared_ptr<const void> window;

	/* The hold on `k` of `peer`'s table: the one kept while the slot still
	 * names it, else taken afresh (an empty ref: `k` is not published). */
	const KeyRef &get(const PeerSegment &peer, uint32_t k)
	{
		if (ref && key == k && seg == &peer && ref.names(k)) [[likely]]
			return ref;
		return take(peer, k);
	}
	const KeyRef &take(const PeerSegment &peer, uint32_t k);
	/* KeyRef::permits() of the held key (not the null MR's: callers
	 * refuse it first), from the copies. */
	bool permits(uint64_t at, uint64_t len, uint32_t need) const
	{
		const uint64_t offset = at - iova;
		return (access & need) == need && at >= iova && offset <= length &&
		       len <= length - offset;
	}
	/* The local address of `at` where the memory is reached directly
	 * and permits() held; nullptr where it takes another path. */
	char *local(uint64_t at) const
	{
		return direct ? reinterpret_cast<char *>(at + delta) : nullptr;
	}
	/* The key was withdrawn since it was taken (its owner waits for us). */
	[[gnu::always_inline]] bool withdrawn() const { return ref && !ref.names(key); }
	void release()
	{
		ref.release();
		seg = nullptr;
		direct = false;
		window.reset();
	}
	/* A forked child: the hold counts in the parent's name. */
	void forget()
	{
		ref.forget();
		seg = nullptr;
		direct = false;
		window.reset();
	}
};

struct SendWr {
	/* Provided, so that SendWr{} and emplace_back() do not zero the
	 * in-place SGE and inline buffers (~330 bytes) first: whoever makes a
	 * SendWr sets the four fields without an initializer (fill(), the
	 * ibv_wr_* builders). */
	SendWr() {}

	enum ibv_wr_opcode opcode;
	uint64_t wr_id;
	unsigned int send_flags;
	uint32_t imm_data; /* network order */
	SmallVec<struct ibv_sge, 4> sge;
	SmallVec<char, 256> inline_data;
	uint64_t remote_addr = 0;
	uint32_t rkey = 0;
	uint64_t compare_add = 0;
	uint64_t swap = 0;
	uint32_t remote_qpn = 0; /* UD */
	uint32_t remote_qkey = 0;
	uint32_t xrc_srqn = 0;
	struct ibv_ah_attr ah_attr{}; /* UD: the AH's address, copied at post */
	MwBind bind; /* BIND_MW, set by every maker of one */
	/* Retry state of the WR at the head of the queue. */
	int rnr_left = -1;  /* -1: not started */
	std::chrono::steady_clock::time_point not_before{};
	/* In an RNR wait: no early try before this (lib/datapath.cpp). */
	std::chrono::steady_clock::time_point rnr_look{};
	std::chrono::steady_clock::time_point give_up{}; /* dead peer: RETRY_EXC_ERR then */
	bool peer_dead = false;
	uint32_t seq = 0; /* its number in the send queue (sq_posted_) */

	/* Everything but the four fields above that every maker sets, as a
	 * SendWr made anew has it: for one reused (scratch_, an ibv_qp_ex
	 * batch's). */
	void reset_rest()
	{
		reset_operands();
		reset_address();
		reset_retry();
	}
	/* The parts reset_rest() resets, for makers that know which they
	 * need: the local data and the operands every opcode may read; the
	 * UD and XRC addressing; the retry state, which only a WR that waits
	 * or enters the queue uses (QpEngine::submit). */
	void reset_operands()
	{
		sge.clear();
		inline_data.clear();
		remote_addr = 0;
		rkey = 0;
		compare_add = 0;
		swap = 0;
	}
	void reset_address()
	{
		remote_qpn = 0;
		remote_qkey = 0;
		xrc_srqn = 0;
		ah_attr = {};
	}
	void reset_retry()
	{
		rnr_left = -1;
		not_before = {};
		rnr_look = {};
		give_up = {};
		peer_dead = false;
	}
};

/* The ibv_qp_ex batch of a QP (lib/qp_ex.cpp): the WRs built between
 * ibv_wr_start() and ibv_wr_complete(), the first `count` of `wrs` (the
 * others are kept made, to be reused: a message of ib_write_bw builds one,
 * and making and destroying a SendWr for each cost ~40 instructions);
 * `lock` is held from start to complete/abort, as libmlx5 holds its SQ
 * lock. `err` latches the first builder error, returned by wr_complete
 * (which then posts nothing). */
struct QpExBatch {
	SpinLock lock;
	/* The thread whose batch is open (the address of its
	 * poll_lock_thread_tag), written by that thread only: what it reads
	 * back says whether it is inside its own batch. */
	std::atomic<const void *> owner{nullptr};
	std::vector<SendWr> wrs;
	size_t count = 0;
	int err = 0;

	static const void *me() { return &poll_lock_thread_tag; }
	bool mine() const { return owner.load(std::memory_order_relaxed) == me(); }
};

class QpEngine final : public QpDataPath {
public:
	explicit QpEngine(Qp &qp);
	~QpEngine() override;

	/* QpDataPath (called with the core lock held). */
	void flush() override;
	void reset() override;
	void state_changed(enum ibv_qp_state from, enum ibv_qp_state to) override;
	/* Without the core lock. */
	void wait_for_senders() override;
	/* Starts the send queue's count afresh, in a new slot of the send
	 * CQ, so that the next WR posted is number `next`, nothing
	 * outstanding (after a reset: 1). No lock held. */
	void renumber_sq(uint32_t next);

	/* ibv_post_send(). A batch of ibv_wr_start() open in another thread
	 * holds it off until that batch is done, as libmlx5's SQ lock does
	 * (ibv_wr_post(3): the batch is a critical section of the QP); one
	 * open in the calling thread makes it EINVAL (libmlx5 would deadlock
	 * on its own lock). */
	int post_send(struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
	{
		if (wr_batch.lock.held()) [[unlikely]]
			return post_send_beside_batch(wr, bad_wr);
		return post_send_now(wr, bad_wr);
	}
	int post_recv(struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
	/* Appends a whole batch of built WRs (ibv_qp_ex) or nothing: EINVAL in
	 * a state that does not allow posting, ENOMEM when the send queue
	 * cannot take all of them. WRs that wait are moved into the queue:
	 * the batch's SendWrs are left to be reused (SendWr::reset_rest()). */
	int submit(std::span<SendWr> batch);
	/* Send WRs posted and not yet retired (SqRetired). */
	uint32_t sq_outstanding() const
	{
		const int32_t n = int32_t(sq_posted_.load(std::memory_order_relaxed) -
					  sq_tail_.load(std::memory_order_acquire)
						  ->load(std::memory_order_acquire));
		return n > 0 ? uint32_t(n) : 0;
	}
	/* Whether the QP's state lets it post sends: RTS, SQD, SQE, and ERR
	 * when entered after RTS (libmlx5 opens the send queue at RTS and
	 * closes it at RESET only: set_qp_operational_state). */
	bool takes_sends() const
	{
		const int st = state_.load();
		return st != IBV_QPS_RESET && st != IBV_QPS_INIT && st != IBV_QPS_RTR &&
		       type_ != IBV_QPT_XRC_RECV &&
		       (st != IBV_QPS_ERR || sq_opened_.load(std::memory_order_relaxed));
	}

	QpExBatch wr_batch;

private:
	int post_send_now(struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	int rxe_refuses(const struct ibv_send_wr &wr) const;
	int post_send_beside_batch(struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);

public:

	/* Executes what can be executed. Returns true when WRs remain queued
	 * (the progress thread comes back). Any thread. */
	bool progress();
	/* The owner's side of errors senders recorded in our descriptor: the
	 * progress thread's sweep, ibv_query_qp and ibv_modify_qp, and the
	 * posts (remote_error_first). */
	void check_remote_errors() override;

	/* Lets go of this engine's holds on a key being withdrawn. Any thread
	 * but one inside this engine. */
	void drop_local_key(const KeySlot &slot);
	/* Lets go of this engine's in-flight hold on QP descriptor `t` (a QP
	 * of this process being destroyed). Any thread but one inside this
	 * engine. */
	void drop_target(const shm::QpDesc &t);
	/* The progress thread's look at an engine that keeps holds between
	 * posts (progress_hold): lets go of them when no post came since its
	 * last look. False when it holds nothing any more. */
	bool sweep_holds();
	/* A forked child (fork_child::progress): the holds, held_ and the
	 * local keys, count in the parent's name; forgotten uncounted. */
	void forget_holds();

	/* Publishes the descriptor; 0 or the broker's errno. */
	int publish();
	/* Marks the descriptor dead and waits (bounded) until no sender is
	 * inside an operation on this QP. */
	void quiesce();

private:
	/* Waits, `bound` at most (for a sender that died holding it, or is
	 * stopped), until no sender holds this QP's in-flight count.
	 * `own_engines`: ours let go first (each after its post in progress;
	 * not with our send lock held). The QP's state or `dead` was stored
	 * first (seq_cst), so that a sender counted in later sees it. */
	void drain_senders(std::chrono::milliseconds bound, bool own_engines);
	/* Whether a sender still counts in on our descriptor: anonymously, or
	 * in an entry of a process not known to be gone (`ask_if_gone`: asks
	 * the system about each, and clears the entries of those gone). */
	bool held_by_others(bool ask_if_gone);
	/* Unreachable (one_sided() only): the responder gave no answer, gone
	 * or stuck; the caller retries until timeout x retry_cnt. */
	enum class Outcome { Done, Wait, Fatal, Unreachable };
	Outcome execute(SendWr &wr, struct ibv_wc &wc);
	Outcome execute_wr(SendWr &wr, struct ibv_wc &wc);
	/* Executes one WR at once (sq_lock_ held, queue empty): false when it
	 * must wait and the caller queues it; *fatal when the QP must enter ERR. */
	bool run_now(SendWr &wr, bool &fatal);
	/* Fills `w` from an ibv_send_wr: 0 or EINVAL. */
	int fill(SendWr &w, const struct ibv_send_wr *wr);
	/* Copies local iovecs to / from a target address of `peer` whose key
	 * `mr` the caller holds; Shared memory through cached windows. */
	int remote_write(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			 const struct iovec *local, int count);
	int remote_read(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			const struct iovec *local, int count);
	char *cached_window(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, uint64_t len);
	/* Where [addr, addr + len) of a target's MR `mr` is reached by a plain
	 * pointer: our own memory (a loopback target) but ODP memory (lib/mr.h),
	 * or a peer's Shared MR through the cached windows; nullptr: its path
	 * (remote_memory_for) answers. */
	char *direct_at(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, uint64_t len)
	{
		if (peer.local)
			return is_odp(mr.access) ? nullptr : reinterpret_cast<char *>(addr);
		return cached_window(peer, mr, addr, len);
	}
	/* lib/ud.cpp. What a UD send reads of its WR: a SendWr's fields, or
	 * the application's ibv_send_wr and AH on the direct path. */
	struct UdSend {
		enum ibv_wr_opcode opcode;
		unsigned int send_flags;
		uint32_t imm_data; /* network order */
		const struct ibv_ah_attr &ah;
		uint32_t remote_qpn;
		uint32_t remote_qkey;
	};
	Outcome execute_ud(const UdSend &wr, struct ibv_wc &wc, const struct iovec *local, int count,
			   uint64_t length);
	/* Writes the send completion, if one is due (signaled, or an error). */
	/* A send completion found the send CQ overrun: the QP is to enter
	 * ERR with IBV_EVENT_QP_FATAL (shm::remote_error_cq). */
	[[gnu::noinline, gnu::cold]] void send_cq_overrun();
	void complete_send(uint64_t wr_id, unsigned int send_flags, enum ibv_wr_opcode opcode,
			   enum ibv_wc_status status, uint32_t byte_len);
	/* Whether target_ is still QP `qpn` (sq_lock_ held). */
	bool target_valid(uint32_t qpn) const
	{
		return target_.desc && target_.qpn == qpn &&
		       !target_.seg->gone.load(std::memory_order_acquire) &&
		       target_.desc->magic == shm::qp_magic && target_.desc->qpn == qpn;
	}
	const KeyRef *hold_rkey(const PeerSegment &peer, const shm::QpDesc &t, uint32_t pdn,
				uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access);
	/* What a one-sided WR names at the responder. */
	struct OneSided {
		enum ibv_wr_opcode opcode;
		uint64_t remote_addr;
		uint32_t rkey;
		uint64_t compare_add, swap;
	};
	Outcome one_sided(const OneSided &op, shm::QpDesc &t, const PeerSegment &peer, uint32_t pdn,
			  std::span<const struct iovec> local, uint64_t length, struct ibv_wc &wc);
	/* post_send's and submit's direct path (lib/datapath.cpp). */
	enum class Direct { NotTaken, Done, Fatal };
	struct DirectWr {
		uint64_t wr_id;
		unsigned int send_flags;
		OneSided op;
		std::span<const struct ibv_sge> sge;
		bool inlined; /* sge is the data itself: no lkey to check */
		uint32_t imm_data; /* SEND_WITH_IMM */
	};
	Direct try_direct(const struct ibv_send_wr &wr);
	Direct try_direct(const SendWr &w);
	/* The most common direct WRs on paths of their own: an RDMA WRITE
	 * (direct_write) or a SEND / SEND_WITH_IMM into the target's own RQ
	 * (direct_send) of one piece (inline or by lkey), to the target (and
	 * for a WRITE the remote key, reached directly) held from the WRs
	 * before. false: nothing happened; try_direct() decides. For the
	 * WRs they never take, one test of the opcode (lane_ops_; post_send()
	 * tests it and the SGE count of an ibv_send_wr itself). */
	bool direct_one(const struct ibv_send_wr &wr)
	{
		if (type_ == IBV_QPT_UD)
			return direct_ud(wr);
		const bool inlined = wr.send_flags & IBV_SEND_INLINE;
		if (wr.opcode == IBV_WR_RDMA_WRITE)
			return direct_write(wr.wr_id, wr.send_flags, wr.sg_list[0], inlined,
					    wr.wr.rdma.rkey, wr.wr.rdma.remote_addr);
		return direct_send(wr.wr_id, wr.send_flags, wr.opcode, wr.imm_data, wr.sg_list[0],
				   inlined);
	}
	bool direct_one(const SendWr &w)
	{
		/* UD through the builders: try_direct() (direct_ud() reads
		 * the AH of an ibv_send_wr). */
		if (!((lane_ops_ >> w.opcode) & 1) || type_ == IBV_QPT_UD)
			return false;
		/* The builders copied inline data (and checked its size). */
		const bool inlined = !w.inline_data.empty();
		if (!inlined && w.sge.size() != 1)
			return false;
		const struct ibv_sge data = {uint64_t(uintptr_t(w.inline_data.data())),
					     uint32_t(w.inline_data.size()), 0};
		const struct ibv_sge &s = inlined ? data : *w.sge.data();
		if (w.opcode == IBV_WR_RDMA_WRITE)
			return direct_write(w.wr_id, w.send_flags, s, inlined, w.rkey, w.remote_addr);
		return direct_send(w.wr_id, w.send_flags, w.opcode, w.imm_data, s, inlined);
	}
	bool direct_write(uint64_t wr_id, unsigned int send_flags, const struct ibv_sge &s,
			  bool inlined, uint32_t rkey, uint64_t remote);
	bool direct_send(uint64_t wr_id, unsigned int send_flags, enum ibv_wr_opcode opcode,
			 uint32_t imm_data, const struct ibv_sge &s, bool inlined);
	/* Their shared checks: the held target still ready (run_direct()'s),
	 * and the local piece (direct_local()'s). */
	bool held_target_ready(shm::QpDesc &t);
	/* direct_local()'s checks of one piece the direct path reads: inline
	 * data within the QP's limit, or an lkey of our PD whose MR holds the
	 * range (the null MR's entry, one per device, is of no PD: refused,
	 * left to direct_local()'s sink). `from`: where it is. false:
	 * refused, nothing held for this WR. */
	[[gnu::always_inline]] bool one_piece(const struct ibv_sge &s, bool inlined,
					      const void *&from)
	{
		from = reinterpret_cast<const void *>(s.addr);
		if (s.length > max_msg_)
			return false; /* execute()'s LOC_LEN_ERR */
		if (inlined)
			return s.length <= core_.caps.created.max_inline_data;
		if (!s.length)
			return true;
		const KeyRef *ref = local_refs_.get(local_keys_, s.lkey);
		/* ODP memory is never touched directly: execute() stages it. */
		if (!ref || (*ref)->pdn != pdn_ || !ref->permits(s.addr, s.length, 0) ||
		    is_odp((*ref)->access)) {
			local_refs_.end_wr();
			return false;
		}
		from = reinterpret_cast<const void *>(ref->address_of(s.addr));
		return true;
	}
	/* The UD send of the same shape (lib/ud.cpp): unicast, to the target
	 * and by the route (no GRH) of the messages before. */
	bool direct_ud(const struct ibv_send_wr &wr);
	Direct run_direct(const DirectWr &wr);
	/* The UD send of the direct path: execute_ud() without the SendWr
	 * (`sge`, `inlined` as in DirectWr). */
	Direct run_direct_ud(uint64_t wr_id, const UdSend &wr, std::span<const struct ibv_sge> sge,
			     bool inlined);
	/* The local pieces of a direct WR: inline data in `few` (up to 4
	 * pieces), else local_iov_ after the key checks. false: refused (a
	 * local key), nothing held; the general path reports it. */
	bool direct_local(std::span<const struct ibv_sge> sge, bool inlined, uint32_t access,
			  struct iovec (&few)[4], std::span<const struct iovec> &local,
			  uint64_t &length);
	/* run_direct()'s SEND into the target's own RQ; false: nothing
	 * happened, the general path decides. */
	bool send_direct(enum ibv_wr_opcode opcode, unsigned int send_flags, uint32_t imm_data,
			 shm::QpDesc &t, const PeerSegment &peer, std::span<const struct iovec> local,
			 uint64_t length);
	struct UdTarget;
	struct UdMessage;
	/* The unicast UD target `qpn` of `device` (ud_target_), revalidated
	 * with loads, its in-flight count held (held_.inflight); nullptr when
	 * the message is to be dropped (no such QP, dead, not UD). */
	UdTarget *ud_target(uint32_t device, uint32_t qpn);
	/* The receive side (RQ or SRQ ring, receive CQ ring) of ud_target_
	 * as its descriptor names it now; false: drop. */
	bool ud_recv_side(UdTarget &t);
	/* Delivers one message into target `t` (in-flight count held by the
	 * caller); `hold_key`: keep the receive buffer's key in held_ for
	 * the next WRs of the post (only for a target whose segments the
	 * engine keeps, ud_target_). */
	void ud_deliver(UdTarget &t, const UdMessage &m, bool hold_key);
	void produce_recv(UdTarget &t, const PlainCompletion &rc);
	/* Complete every queued send WR with IBV_WC_WR_FLUSH_ERR (SQE), and
	 * flush_locked() the posted receives too (ERR). sq_lock_ held. */
	void flush_sq_locked();
	void flush_locked();
	/* After posting (sq_lock_ held): ERR flushes both queues, SQE the SQ. */
	void flush_if_halted()
	{
		const int st = state_.load();
		if (sq_runs(st)) [[likely]]
			return;
		if (st == IBV_QPS_ERR)
			flush_locked();
		else
			flush_sq_locked();
	}
	/* Whether the SQ executes WRs in state `st`: not in ERR, nor in SQE
	 * (an unreliable QP's send error; the RQ still receives). */
	static bool sq_runs(int st)
	{
		static_assert(IBV_QPS_SQE + 1 == IBV_QPS_ERR && IBV_QPS_ERR + 1 == IBV_QPS_UNKNOWN);
		return st < IBV_QPS_SQE; /* one compare: SQE, ERR (UNKNOWN is never stored) */
	}
	/* Where a fatal send error takes this QP: ERR for RC and XRC, SQE
	 * for UC and UD (IBA 10.3.1; mlx5 moves an unreliable QP to SQE). */
	enum ibv_qp_state send_error_state() const
	{
		return type_ == IBV_QPT_UC || type_ == IBV_QPT_UD ? IBV_QPS_SQE : IBV_QPS_ERR;
	}
	void snapshot_attr();
	/* Takes target QP `t`'s in-flight count into held_ (sq_lock_ held),
	 * letting go of what held_ had. */
	void hold_target(shm::QpDesc &t);
	/* Lets go of held_ (sq_lock_ held). */
	void release_holds();
	/* Every key and target this queue holds let go: before it binds or
	 * invalidates a window, which waits for the key's holders. */
	void drop_all_holds();
	/* SEND_WITH_INV at the responder QP `t` of `peer`. */
	void invalidate_window(const PeerSegment &peer, const shm::QpDesc &t, uint32_t rkey);
	/* The end of a post (sq_lock_ held): held_ stays for the next post
	 * while its target is ready and its key published, else goes. True
	 * when the caller must list the engine with progress_hold() once
	 * sq_lock_ is released. */
	bool keep_holds();
	/* A post starts from the state a device would have: an error a sender
	 * left in our descriptor has moved the QP to ERR there already (one
	 * load when there is none; no lock held). */
	void remote_error_first()
	{
		if (desc_ && desc_->remote_error.load(std::memory_order_relaxed) !=
				     shm::remote_error_none) [[unlikely]]
			check_remote_errors();
	}
	/* Prefetches what a SEND to target_ reads and claims first (sq_lock_
	 * held; nothing before the target is resolved): the receive WQE at
	 * its RQ's head, which the peer wrote, and its receive CQ's next
	 * slot, for writing, which the peer is polling. Each is a transfer
	 * between cores that then overlaps the work before its use. */
	void prefetch_send_lines();

	/* The handle that created the QP: for a shared XRC target one of
	 * several, which may be destroyed before the others. The engine uses
	 * it only on the send side (its context, for AHs and windows), which
	 * an XRC target has not; everything else goes through the core, which
	 * lives as long as the engine. */
	Qp &qp_;
	QpCore &core_;
	Segment &seg_;
	uint32_t device_;
	uint32_t qpn_;
	enum ibv_qp_type type_;
	/* Bit `op` set for each ibv_wr_opcode below 32 that this QP type
	 * executes (ibv_post_send() takes every opcode verbs defines; the
	 * others fail at execution, IBV_WC_LOC_QP_OP_ERR), and for those the
	 * direct path runs (RC and UC only): one test per WR instead of a
	 * switch. */
	uint32_t allowed_ops_;
	uint32_t direct_ops_;
	uint32_t lane_ops_; /* those of them direct_one() takes */
	/* The rxe profile: librxe's checks of a WR at post (rxe_refuses()). */
	bool rxe_;
	/* The port's max_msg_sz: a longer message of a connected QP is the
	 * requester's IBV_WC_LOC_LEN_ERR, as the device's (log_max_msg). */
	uint64_t max_msg_;
	/* What this QP's messages carry in their LRH on InfiniBand (0 on
	 * Ethernet), which the responder's receive completions report as
	 * slid and sl for every QP type, as mlx5's CQE does
	 * (snapshot_attr()). */
	uint16_t lrh_slid_ = 0;
	uint8_t lrh_sl_ = 0;
	/* IBV_WC_GRH when this QP's messages carry a GRH (its path is global,
	 * which RoCE requires), for the responder's receive completions, as
	 * mlx5's CQE reports it for every QP type; else 0. */
	uint32_t recv_grh_ = 0;
	uint32_t pdn_;
	Cq *send_cq_;
	Cq *recv_cq_;
	/* The send CQ's ring as this engine's completions last found it
	 * named (its slot array checked once, not at every completion),
	 * under sq_lock_. */
	CqTarget send_target_;
	const KeyTable &local_keys_; /* our device's key table (lkeys) */

	uint64_t desc_off_ = 0;
	shm::QpDesc *desc_ = nullptr;
	uint64_t rq_off_ = 0, rq_bytes_ = 0;
	shm::RecvQueue *rq_ = nullptr;
	uint32_t rq_entries_ = 0, rq_max_sge_ = 0, rq_stride_ = 0;
	bool published_ = false;

	SpinLock sq_lock_;
	/* Set once a SEND of ours resolved its target's RQ: post_recv() then
	 * prefetches the lines of the reply (prefetch_send_lines), which
	 * costs it the sq_lock_ try of a QP that never sends otherwise. */
	std::atomic<bool> sends_{false};
	/* WRs waiting (RNR, unreachable peer) and those behind them. A WR
	 * posted to an empty queue runs at once from `scratch_` and is queued
	 * only if it must wait: the common post allocates nothing. */
	std::deque<SendWr> sq_;
	SendWr scratch_{};
	/* The RC/UC/XRC target resolved last (under sq_lock_): the peer's
	 * segment (held), the descriptor and its number. Checked on each use
	 * (segment gone, magic, number, dead flag); re-resolved when stale. */
	struct {
		std::shared_ptr<PeerSegment> seg;
		shm::QpDesc *desc = nullptr;
		uint32_t qpn = 0;
		/* Its own RQ (a QP without SRQ) and receive CQ ring, geometry
		 * validated at first use: a QP's rq_off and recv_cq_off never
		 * change in its life, and this is reset with the target. */
		shm::RecvQueue *rq = nullptr;
		uint32_t rq_entries = 0, rq_max_sge = 0, rq_stride = 0;
		CqTarget cq;
	} target_;
	/* Windows onto peers' memory files used last (under sq_lock_), most
	 * recent first: a window stays valid for its peer's life for every
	 * address it covers (lib/remote_memory.h SharedWindow). */
	SharedWindow windows_[2];
	/* The receive CQ ring this engine produced into last and its consumer
	 * index as last read (cq_ring_produce's cons_seen), under sq_lock_. */
	struct {
		shm::CqRing *ring = nullptr;
		uint64_t cons = 0;
	} recv_cq_seen_;
	/* What the data path holds of its target between WRs and between
	 * posts, under sq_lock_, so that a stream of posts to one target pays
	 * for them once: the target QP's in-flight count, the remote key used
	 * last (one-sided WRs) and the key of the receive buffer written last
	 * (SEND, in the target's own segment). Each use checks with loads that
	 * they are still good (the
	 * QP not dead, the key still published); keep_holds() lets them go at
	 * the end of a post when not, and the progress thread when the engine
	 * stayed idle for a period (sweep_holds): the target's destroy_qp and
	 * dereg_mr wait for these counts. Released before target_ changes
	 * (both point into its segment). */
	struct {
		shm::QpDesc *inflight = nullptr;
		uint32_t inflight_qpn = 0; /* the QP number counted in on */
		int inflight_entry = holder_anonymous; /* shm::hold_qp()'s answer */
		HeldKey rkey;
		HeldKey recv_key;
		/* Posts that ended holding: written under sq_lock_, read by
		 * the sweep without it, so that a busy engine's lock is left
		 * alone. */
		std::atomic<uint64_t> posts{0};
		uint64_t posts_swept = 0; /* `posts` at the sweep's last look (its own) */
		bool listed = false;      /* on the progress thread's list */
	} held_;
	/* UD (lib/ud.cpp), under sq_lock_. The port a unicast AH named last:
	 * devices and their LIDs and GIDs are fixed for the process's life,
	 * so the answer for one (link layer, DLID or DGID) never changes. */
	struct {
		bool valid = false;
		bool eth = false;
		bool found = false;
		uint16_t dlid = 0;
		union ibv_gid dgid{};
		uint32_t device = 0;
		uint8_t port = 0;
	} ud_route_;
	/* The UD QP sent to last and the receive side its descriptor named:
	 * the peer segment (held), descriptor, ring and CQ pointers with the
	 * geometry validated when taken. Checked per WR with loads (segment
	 * gone or owner dead, magic, number, type, dead flag; the
	 * descriptor's RQ/SRQ/CQ words against the copies; an SRQ ring's
	 * magic, number and geometry) and resolved afresh when stale. held_
	 * (the in-flight count, the receive key) points into these segments:
	 * released before they change. */
	struct UdTarget {
		std::shared_ptr<PeerSegment> seg;
		shm::QpDesc *desc = nullptr;
		uint32_t device = 0, qpn = 0;
		/* The descriptor's words the receive side below was built from. */
		uint32_t srqn = 0;
		uint64_t rq_off = 0, cq_off = 0;
		bool recv_ok = false;
		/* The receive side was checked since held_.inflight was taken
		 * on this descriptor: while that count is held the QP cannot
		 * be freed (nor, so, its RQ, CQ or SRQ), and those words never
		 * change in a QP's life; checked afresh once it was let go. */
		bool recv_checked = false;
		std::shared_ptr<PeerSegment> srq_seg; /* an SRQ's owner (may differ) */
		shm::RecvQueue *rq = nullptr;
		uint32_t rq_entries = 0, rq_max_sge = 0, rq_stride = 0;
		const PeerSegment *rq_seg = nullptr; /* where receive buffers' keys are */
		uint32_t rq_pdn = 0;
		CqTarget cq;
		uint64_t cq_cons = 0; /* cq_ring_produce's cons_seen */
	} ud_target_;
	/* The GRH built last (a global AH) and what it was built from. */
	struct {
		bool valid = false;
		bool eth = false;
		bool with_imm = false;
		const Port *port = nullptr;
		uint64_t length = 0;
		uint8_t sgid_index = 0, hop_limit = 0, traffic_class = 0;
		uint32_t flow_label = 0;
		union ibv_gid dgid{};
		char bytes[40];
	} ud_grh_;
	/* Our port (attr_.port_num) as last looked up: ports are fixed. */
	const Port *ud_port_ = nullptr;
	uint32_t ud_port_num_ = 0;
	/* The UD QP number found dead last, not resolved again before
	 * `until` (ud_target()). */
	struct {
		bool valid = false;
		uint32_t device = 0, qpn = 0;
		std::chrono::steady_clock::time_point until{};
	} ud_dead_;
	/* execute()'s local iovecs and held local keys, the receive WQE's
	 * SGEs and a gathered payload (under sq_lock_; kept with their
	 * capacity: no allocation, no TLS lookup per WR). */
	std::vector<struct iovec> local_iov_;
	OdpStage odp_stage_; /* execute()'s local pieces in ODP MRs */
	std::vector<shm::RecvSge> recv_sges_;
	std::vector<char> gathered_;
	LocalKeyCache local_refs_;
	std::atomic<int> state_{IBV_QPS_RESET};
	/* The QP reached RTS since its creation or last reset (takes_sends). */
	std::atomic<bool> sq_opened_{false};
	struct ibv_qp_attr attr_{}; /* snapshot, under sq_lock_ */
	SpinLock rq_lock_;          /* posting to our RQ */
	/* The RQ's places given back as last known, under rq_lock_: WQEs
	 * whose completions the receive CQ's polls handed out (rq_room_), as
	 * libmlx5 counts a receive queue's room, or without a ring to count
	 * them in, those senders took (rq_->head). */
	uint64_t rq_freed_seen_ = 0;
	std::shared_ptr<RqRoom> rq_room_; /* replaced under rq_lock_ at a reset */
	bool rq_counted_ = false; /* rq_room_ is set: fixed at creation */

	/* The send queue's occupancy as libmlx5 counts it: WRs accepted
	 * (sq_posted_, each numbered by it; written under sq_lock_, read by
	 * the builders too) against those retired, which the send CQ's polls
	 * move as they hand out completions (SqRetired). A post beyond
	 * max_send_wr outstanding is ENOMEM. */
	std::atomic<uint32_t> sq_posted_{0};
	std::shared_ptr<SqRetired> sq_retired_; /* nullptr: no send CQ */
	/* The one before the last reset, which a builder may still read. */
	std::shared_ptr<SqRetired> sq_retired_before_;
	/* Its tail; without a send CQ (XRC_RECV) one that stays 0, and so
	 * does sq_posted_. A reset replaces it (wait_for_senders). */
	std::atomic<uint32_t> no_tail_{0};
	std::atomic<const std::atomic<uint32_t> *> sq_tail_{&no_tail_};
	uint32_t sq_slot_ = 0;	     /* its slot in the send CQ (SqSeq) */
	uint32_t sq_completing_ = 0; /* the number of the WR running (sq_lock_) */
};

/* Installs the engine on a freshly created QP (from create_qp). */
void attach_data_path(Qp &qp);

/* The entry points behind ibv_post_send/ibv_post_recv. */
int post_send(Qp &qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int post_recv(Qp &qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
/* QpEngine::renumber_sq() of the QP (the test hook shmverbs_test_renumber_sq,
 * which reaches the wrap of the WR numbers without 2^32 posts). */
int renumber_send_queue(Qp &qp, uint32_t next);

/* Progress thread (lib/progress.cpp): keeps the engines moving. */
void progress_register(QpEngine *e);
void progress_unregister(QpEngine *e);
/* Lists engine `e`, whose post left WRs queued, for the retries: the
 * thread's at once and every millisecond, and the application's empty
 * polls' (below). */
void progress_wait(QpEngine *e);
/* An application thread found its CQ empty (poll_cq): runs progress() of
 * the engines that wait, at once, instead of leaving them to the thread's
 * next pass (1 ms). A load of one word when nothing waits; never blocks. */
extern std::atomic<size_t> progress_waiting_engines;
/* Early RNR retries of this thread that found the target's queue still
 * short of receives (lib/datapath.cpp). */
extern thread_local unsigned rnr_early_misses;
void progress_poll_waiting_slow();
inline void progress_poll_waiting()
{
	if (progress_waiting_engines.load(std::memory_order_relaxed))
		progress_poll_waiting_slow();
}
/* Lists an engine that keeps holds between posts: the thread looks at it
 * every sweep period (hold_sweep_period, longer while the listed engines
 * stay busy, lib/progress.cpp) and lets go of its holds once it stayed idle
 * for one (QpEngine::sweep_holds). Not under any engine's sq_lock_. */
void progress_hold(QpEngine *e);
constexpr std::chrono::milliseconds hold_sweep_period{1};
constexpr std::chrono::milliseconds hold_sweep_period_max{8};
/* Calls fn for every engine of the process (none is destroyed meanwhile);
 * fn must not take the progress lock. */
void for_each_engine(const std::function<void(QpEngine &)> &fn);
/* Other periodic work of the progress thread (SRQ limits): fn(arg) runs on
 * it under its lock until unregistered. */
void progress_register_poller(void *arg, void (*fn)(void *));
void progress_unregister_poller(void *arg);

} // namespace shmverbs
