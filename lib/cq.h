/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels.
 */
#pragma once

#include "broker_protocol.h"
#include "context.h"
#include "pd.h"
#include "shm_layout.h"

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace shmverbs {

struct Cq;

/*
 * A completion channel: the fd an application sleeps on in ibv_get_cq_event().
 * The fd is a semaphore eventfd (like Context's async_fd) so that it works
 * with poll()/epoll and O_NONBLOCK exactly like a uverbs completion channel.
 * Its descriptor is attached to the broker objects whose completions land in
 * its CQs, so that a producer in another process can write the token.
 *
 * Tokens equal events. A producer (any process) that disarms a CQ bumps the
 * CQ's shared `fired` word and then writes one token. get_cq_event() takes a
 * token only under `lock`, and only when poll() says one is there, and then
 * hands out the event of a CQ whose fired count exceeds the events it took:
 * there is one, since every token was preceded by its `fired` increment.
 */
struct CompChannel {
	struct ibv_comp_channel ibv; /* first: ibv_comp_channel* <-> CompChannel* */
	std::mutex lock;
	std::vector<Cq *> cqs; /* CQs using this channel, under lock */

	struct ibv_comp_channel *abi() { return &ibv; }
	static CompChannel *from(struct ibv_comp_channel *ch)
	{
		return reinterpret_cast<CompChannel *>(ch);
	}
};

/*
 * One work completion as the data path delivers it: the ibv_wc that
 * ibv_poll_cq() returns, plus what the ibv_cq_ex read_* helpers can report.
 */
struct Completion {
	struct ibv_wc wc;
	/* The request carried IBV_SEND_SOLICITED: wakes a CQ armed with
	 * solicited_only (so does any unsuccessful completion). */
	bool solicited;
	uint64_t timestamp_ns;  /* IBV_WC_EX_WITH_COMPLETION_TIMESTAMP (1 GHz clock) */
	uint64_t wallclock_ns;  /* IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK */
	uint16_t cvlan;
	uint32_t flow_tag;
	struct ibv_wc_tm_info tm_info;
};

/* A completion with these fields and every other one zero (not solicited;
 * timestamp_ns 0: the CQ ring stamps it when written, if its CQ reports
 * timestamps). */
inline Completion make_completion(uint64_t wr_id, enum ibv_wc_status status,
				  enum ibv_wc_opcode opcode, uint32_t qp_num)
{
	Completion c{};
	c.wc.wr_id = wr_id;
	c.wc.status = status;
	c.wc.opcode = opcode;
	c.wc.qp_num = qp_num;
	return c;
}

/* The completions the data path produces: these fields, every other one
 * zero (pkey_index, dlid_path_bits; no timestamp given). Written field by
 * field into the ring, without building a Completion. */
struct PlainCompletion {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint32_t imm_data; /* network order */
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	bool solicited;
	uint16_t slid = 0; /* UD */
	uint8_t sl = 0;
	uint16_t pkey_index = 0; /* a send completion's: SqSeq::slot's high half */
};

/*
 * What a send completion carries for the send queue's occupancy, in fields
 * ibv_wc leaves undefined for a send completion (the polls zero them for
 * the application): the WR's sequence number in its QP (src_qp; 1, 2, ...;
 * retiring it and every WR before it) and the slot of the QP's SqRetired
 * in the CQ (index + 1, 0: none; low half in pkey_index, high in slid).
 */
struct SqSeq {
	uint32_t seq = 0;
	uint32_t slot = 0;
};

/* How many of QP `qp_num`'s send WRs have retired: those up to the last
 * send completion ibv_poll_cq() (or a poll batch) handed out, as libmlx5
 * moves its send queue's tail when it polls a CQE (an unsignaled WR retires
 * with the next signaled one). Shared by the send CQ and the QP's engine,
 * whose posts see room only below max_send_wr outstanding. */
struct SqRetired {
	SqRetired(uint32_t qpn, uint32_t start) : qp_num(qpn), tail(start) {}
	const uint32_t qp_num;
	/* A sequence number, moved forward only, by the CQ's polls (under
	 * its lock: one writer). */
	std::atomic<uint32_t> tail{0};
};

/* How many WQEs of a receive queue (a QP's RQ, or a basic SRQ) gave their
 * place back: those whose receive completions a poll handed out or a CQ
 * clean dropped, as libmlx5 moves a receive queue's tail when it polls a
 * CQE (mlx5_post_recv and mlx5_post_srq_recv count room from it), plus
 * where the count started (an RQ's tail when it was reset). Every counted
 * completion is of a WQE a sender took, so the count never passes the
 * queue's head: the owner's posts may reuse the places below it. Shared by
 * the CQs that take the queue's completions and its owner; an RQ's only
 * writers hold its one CQ's lock, an SRQ's QPs may complete into several
 * CQs (`shared`: counted with an atomic add). */
struct RqRoom {
	RqRoom(uint64_t start, bool shared_by_cqs) : freed(start), shared(shared_by_cqs) {}
	std::atomic<uint64_t> freed;
	const bool shared;

	void give_back()
	{
		if (shared)
			freed.fetch_add(1, std::memory_order_release);
		else
			freed.store(freed.load(std::memory_order_relaxed) + 1, std::memory_order_release);
	}
};

enum class CqArm : uint8_t { None, Solicited, Next };

/* This thread's identity for PollLock (its address; initial-exec: one
 * %fs-relative lea, no __tls_get_addr). */
extern thread_local __attribute__((tls_model("initial-exec"))) char poll_lock_thread_tag;

/*
 * A CQ's consumer lock: serialises the threads that poll one CQ (ibv_poll_cq,
 * a start_poll..end_poll batch, cq_clean, resize_cq), recursive for the
 * thread that holds it. Uncontended, lock and unlock cost one locked
 * instruction in all (the CAS that takes it; unlock is a plain store),
 * against two for std::recursive_mutex.
 * A waiter spins briefly and then sleeps on the word (futex), announcing
 * itself by setting it to `contended`; the unlock that finds `contended`
 * wakes one. An unlock that read `held` just before a waiter's announcement
 * wakes nobody: that waiter's sleep is bounded (20 us, doubling up to 1 ms)
 * and it looks again, so a lost wake-up costs a short delay, never a hang,
 * and never a busy CPU.
 */
class PollLock {
public:
	void lock()
	{
		const void *me = &poll_lock_thread_tag;
		if (owner_.load(std::memory_order_relaxed) == me) {
			depth_++;
			return;
		}
		uint32_t expected = free_;
		if (!word_.compare_exchange_strong(expected, held_, std::memory_order_acquire,
						   std::memory_order_relaxed)) [[unlikely]]
			lock_contended();
		owner_.store(me, std::memory_order_relaxed);
	}
	void unlock()
	{
		if (depth_) {
			depth_--;
			return;
		}
		owner_.store(nullptr, std::memory_order_relaxed);
		/* Only a waiter changes the word while we hold it (held ->
		 * contended): a plain store releases it when none has announced
		 * itself. One that does so between this load and the store
		 * sleeps out its bounded sleep. */
		if (word_.load(std::memory_order_relaxed) == held_) [[likely]]
			word_.store(free_, std::memory_order_release);
		else
			unlock_contended();
	}

private:
	static constexpr uint32_t free_ = 0, held_ = 1, contended_ = 2;
	void lock_contended();
	void unlock_contended();

	std::atomic<uint32_t> word_{free_};
	/* The holder's thread (a per-thread address), for recursion: only the
	 * holder ever stores its own identity here, so reading it back means
	 * the reader holds the lock. */
	std::atomic<const void *> owner_{nullptr};
	uint32_t depth_ = 0; /* nested lock() calls of the holder */
};

/*
 * The completion channel a producer writes a token to when its completion
 * disarms the CQ: the eventfd itself where the producer holds it (a CQ of
 * its own process), or, for a peer's CQ, the broker object the owner
 * attached it to (lib/segment.h fetch_channel_fd()), looked up only when a
 * token is due: a SEND into a peer's CQ that has a channel but is not
 * armed (most of an event-driven receiver's, ibv_rc_pingpong -e) pays the
 * arm's loads, not the lookup of the descriptor (a mutex, a map and a
 * shared_ptr's two counts).
 */
struct CqChannel {
	int fd = -1;
	uint32_t device = 0;
	uint32_t id = 0;
	broker::ObjectKind kind = broker::ObjectKind::Qp;
	bool attached = false; /* fetch (device, kind, id) when a token is due */

	static CqChannel none() { return {}; }
	static CqChannel of(int fd) { return {fd, 0, 0, broker::ObjectKind::Qp, false}; }
	static CqChannel attached_to(uint32_t device, broker::ObjectKind kind, uint32_t id)
	{
		return {-1, device, id, kind, true};
	}
	bool any() const { return fd >= 0 || attached; }
};
/* Passed by value, in two registers: a producer without a channel pays a
 * compare, not a struct in memory. */
static_assert(sizeof(CqChannel) <= 16 && std::is_trivially_copyable_v<CqChannel>);

/*
 * The claimed slot a consumer found at its ring's cons last (a producer
 * still writing it) and since when: the consumer asks whether that
 * producer died only once the claim has outlived the time any live
 * producer needs to fill a slot (lib/cq.cpp claim_abandoned()).
 */
struct ClaimWatch {
	const void *ring = nullptr;
	uint64_t index = 0;
	uint32_t pid = 0;
	uint64_t since_ns = 0;   /* first seen */
	uint64_t checked_ns = 0; /* last asked the kernel */
};

struct Cq {
	/* ibv_cq_ex begins with the fields of ibv_cq, so one object serves
	 * both ibv_create_cq() and ibv_create_cq_ex() (ibv_cq_ex_to_cq casts). */
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cq_ex;
	} ibv;
	UseCount uses;                /* QPs and SRQs that name this CQ */
	AsyncEventCounter async_events; /* IBV_EVENT_CQ_ERR */
	/* --- family-private state below (lib/cq.cpp) --- */

	Context *ctx;
	CompChannel *channel;         /* nullptr when events are not wanted */
	ParentDomain *parent_domain;  /* IBV_CQ_INIT_ATTR_MASK_PD: holds a use */
	HugeChunks::Lease huge;       /* MLX_CQ_ALLOC_TYPE's (lib/huge_pages.h) */
	uint64_t wc_flags;            /* IBV_WC_EX_WITH_* the CQ was created with */
	uint32_t create_flags;        /* IBV_CREATE_CQ_ATTR_* */
	bool extended;                /* made by ibv_create_cq_ex() */
	uint32_t cqn;

	/* The completion ring, in this process's shared segment (layout and
	 * protocol: shm_layout.h CqRing). Producers in any process append;
	 * this process is the only consumer, under `lock`, which is held from
	 * start_poll() to end_poll() as libmlx5 holds its CQ spinlock, and is
	 * recursive: the application may poll, clean (modify a QP to RESET)
	 * or resize the CQ from inside its own batch (what it delivers into
	 * the CQ from there is deferred to end_poll(), deliver_completion(),
	 * and takes no lock). */
	PollLock lock;
	shm::CqRing *ring = nullptr;
	uint64_t ring_off = 0;         /* in Segment::of(device) */
	uint64_t ring_bytes = 0;
	/* Slot arrays resize_cq() moved the ring to (offset, bytes in the
	 * segment), the current one last; freed with the CQ, since a
	 * producer may still load a slot of an old one (under `lock`). */
	std::vector<std::pair<uint64_t, uint64_t>> arrays;
	/* IBV_EVENT_CQ_ERR was raised. Not under `lock`: a producer reports
	 * the overrun it caused while it may hold its QP's send lock, and a
	 * poller holding `lock` may wait for that (ibv_dereg_mr() from inside
	 * a poll batch drops every engine's holds). */
	std::atomic<bool> overrun_reported{false};
	ClaimWatch claim_watch;        /* the consumer's, under lock */
	Completion current{};          /* the entry ibv_cq_ex read_* report */
	/* Completions the thread inside a start_poll() batch produced into this
	 * CQ, published at end_poll() (deliver_completion()), and those other
	 * threads of this process produced while any were waiting (`deferring`):
	 * they queue behind, so a send queue's completions stay in its WRs'
	 * order. Under deferred_lock, which end_poll() holds until it has
	 * published them all. */
	std::mutex deferred_lock;
	std::vector<Completion> deferred;
	std::atomic<bool> deferring{false};

	/* Arming lives in the ring (ring->arm) so that producers in other
	 * processes can fire; arm_lock only orders local moderation updates. */
	std::mutex arm_lock;
	/* Completion events taken by ibv_get_cq_event(), under channel->lock;
	 * compared with ring->fired (also by the consumer, without that lock,
	 * to hold back an entry whose event is unread: held_back()). */
	std::atomic<uint64_t> events_taken{0};

	/* Completion events handed out by ibv_get_cq_event(); acknowledged
	 * ones are counted in ibv.cq.comp_events_completed. Both under
	 * ibv.cq.mutex; destroy waits until they match. */
	uint32_t comp_events_reported = 0;
	/* Set by destroy (under channel->lock): no further events are queued. */
	bool detached = false;

	/* The receive queues of the QPs whose receive completions this CQ
	 * takes, by QP number (cq_track_rq()), and the last one found: a
	 * stream of one QP's completions looks nothing up. Under `lock`. */
	std::unordered_map<uint32_t, std::shared_ptr<RqRoom>> rq_rooms;
	RqRoom *rq_room_last = nullptr;
	uint32_t rq_room_last_qpn = 0;
	/* The QPs whose send completions this CQ takes (cq_watch_sq()), by
	 * the slot their completions name; under `lock`. */
	std::vector<std::shared_ptr<SqRetired>> sq_owners;

	/* ibv_modify_cq() moderation, recorded (see modify_cq()). */
	uint16_t moderation_count = 0;
	uint16_t moderation_period = 0;

	struct ibv_cq *abi() { return &ibv.cq; }
	static Cq *from(struct ibv_cq *cq) { return reinterpret_cast<Cq *>(cq); }
	static Cq *from(struct ibv_cq_ex *cq) { return reinterpret_cast<Cq *>(cq); }
};

/* --- Completion channels --- */

Result<CompChannel> create_comp_channel(Context &ctx);
/* EBUSY while a CQ uses the channel (ibv_comp_channel::refcnt). */
int destroy_comp_channel(CompChannel &ch);
/* Takes the next completion event: 0, or EAGAIN when the fd is O_NONBLOCK and
 * none is pending. Blocks otherwise. */
int get_cq_event(CompChannel &ch, Cq *&cq);
void ack_cq_events(Cq &cq, unsigned int nevents);

/* --- Completion queues --- */

/* ibv_create_cq() (extended == false) and ibv_create_cq_ex(): validation,
 * errno and rounding as libmlx5 + mlx5_ib (or the device profile). */
Result<Cq> create_cq(Context &ctx, const struct ibv_cq_init_attr_ex &attr, bool extended);
int resize_cq(Cq &cq, int cqe);
/* EBUSY while QPs or SRQs use the CQ; otherwise drops its undelivered
 * completion events, waits until every delivered one and every async event
 * was acknowledged, and frees it. */
int destroy_cq(Cq &cq);
/* ibv_poll_cq(): the number of completions returned, or a negative errno. */
int poll_cq(Cq &cq, int num_entries, struct ibv_wc *wc);
int req_notify_cq(Cq &cq, int solicited_only);
/* Drops the unpolled completions of one QP (a QP moved to RESET), as
 * libmlx5's mlx5_cq_clean(); the others keep their order. Returns how many
 * were dropped. */
int cq_clean(Cq &cq, uint32_t qp_num);
/* Makes the polls (and cleans) of `cq` give QP `qp_num`'s receive WQEs
 * back to `room` as they hand out (or drop) its receive completions;
 * nullptr stops it. Completions of an earlier QP of that number still in
 * the CQ are dropped first: they are another queue's. */
void cq_track_rq(Cq &cq, uint32_t qp_num, std::shared_ptr<RqRoom> room);
/* Makes the polls of `cq` retire QP `qp_num`'s send WRs as they hand out
 * its send completions: the record and the slot its completions name
 * (SqSeq). A slot whose QP is gone (only the CQ holds it) is reused. */
struct SqWatch {
	std::shared_ptr<SqRetired> retired;
	uint32_t slot = 0;
};
SqWatch cq_watch_sq(Cq &cq, uint32_t qp_num, uint32_t tail = 0);
int modify_cq(Cq &cq, const struct ibv_modify_cq_attr &attr);

/*
 * The data path's entry point: appends one completion to the CQ and, when
 * the CQ is armed for it, disarms it and queues a completion event on its
 * channel (waking ibv_get_cq_event()). A full CQ overruns: the completion is
 * dropped and IBV_EVENT_CQ_ERR is raised once (never with
 * IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN). Returns 0, or ENOSPC when dropped.
 * Thread-safe; may be called from inside a poll batch of the same thread.
 */
int deliver_completion(Cq &cq, const Completion &c);
/* deliver_send_completion(): deliver_completion() of a send completion
 * (the given fields, every other one zero: not solicited, no timestamp
 * given) without building a Completion, through the caller's CqTarget of
 * the CQ's ring (own_cq_target(), kept between completions); inline in
 * lib/cq_produce.h. */

/*
 * A producer's hold on a CQ ring: its header, which never moves, and the
 * slot array it last found named there (CqRing::array) and checked. A
 * resize names a new array; the producer notices at its next completion
 * (one compare) and checks the new one against the owner's mapping around
 * the header, [header - before, header + after), before touching it: a
 * peer's word never makes us touch memory outside its segment.
 */
struct CqTarget {
	shm::CqRing *ring = nullptr;
	uint64_t array = 0; /* the word last checked */
	int64_t before = 0, after = 0;
	/* The array that word names. */
	shm::CqEntry *slots = nullptr;
	unsigned lg = 0;   /* log2 of its capacity */
	uint64_t mask = 0; /* its capacity - 1 */
	/* The owner's owner-alive word (PeerSegment::owner_alive_word());
	 * nullptr for a ring of this process. */
	const int *owner_alive = nullptr;
	explicit operator bool() const { return ring != nullptr; }
};
/* A ring of this process: any array its owner (we) names is good. */
inline CqTarget own_cq_target(shm::CqRing &ring)
{
	return {&ring, 0, INT64_MAX / 4, INT64_MAX / 4};
}

/*
 * The producer side for any process: appends to a CQ ring (mapped from the
 * owner's segment, `target` checked by the caller) and, when the ring is
 * armed for this completion, disarms it and writes a token to `channel`'s
 * eventfd (CqChannel::none(): no channel). Returns 0, or ENOSPC when the
 * ring was full (the ring's overrun word is then set; the owner raises
 * IBV_EVENT_CQ_ERR).
 * *overrun_now is set when this call overflowed the CQ first. `cons_seen`
 * (optional, the caller's per-ring memory, 0 at first): the consumer index
 * as last read; cons is re-read only when that copy says the ring is full,
 * which saves a cache-line transfer per completion to a busy consumer.
 */
int cq_ring_produce(CqTarget &target, const Completion &c, CqChannel channel,
		    bool *overrun_now = nullptr, uint64_t *cons_seen = nullptr);
/* The same for a PlainCompletion (the data path's): inline in
 * lib/cq_produce.h. */
/* The consumer side (the owner, under its CQ lock): takes the oldest
 * published completion; skips slots whose producer died holding them
 * (`watch`: the consumer's, kept from call to call). false when there is
 * none ready. */
bool cq_ring_consume(shm::CqRing &ring, Completion &out, ClaimWatch &watch);
/* Bytes of a ring (header and first array) holding `capacity` slots, and
 * sets up its header: the array right after it, every slot free. */
uint64_t cq_ring_bytes(uint32_t capacity);
void cq_ring_init(shm::CqRing &ring, uint32_t capacity);
/* The number of slots of the ring's current array. */
uint32_t cq_ring_capacity(const shm::CqRing &ring);

} // namespace shmverbs
