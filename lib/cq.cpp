/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels: creation and rounding, the
 * completion ring, arming and completion events, ibv_cq_ex polling.
 *
 * The data path (a later issue) feeds completions in through
 * deliver_completion(); everything an application observes from there on
 * (ibv_poll_cq, the extended poll API, channel events, overrun) is here.
 */
#include "cq.h"
#include "cq_produce.h"
#include "datapath.h"
#include "device.h"
#include "fork.h"
#include "locks.h"
#include "process.h"
#include "segment.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Cq> && offsetof(Cq, ibv) == 0,
	      "ibv_cq* and ibv_cq_ex* are converted to Cq*");
static_assert(std::is_standard_layout_v<CompChannel> && offsetof(CompChannel, ibv) == 0,
	      "ibv_comp_channel* is converted to CompChannel*");

namespace cq_detail {

uint64_t monotonic_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/* The CQ whose ibv_start_poll() batch this thread is inside (its lock held),
 * if any: completions this thread produces into it meanwhile are deferred
 * to end_poll() (see deliver_completion()). Read for every delivered
 * completion: initial-exec, one %fs load instead of a __tls_get_addr call
 * (as memshare's per-thread cache). */
thread_local __attribute__((tls_model("initial-exec"))) Cq *polling_batch = nullptr;

} // namespace cq_detail

namespace {

/* What libmlx5 accepts in ibv_create_cq_ex() (and libibverbs before it). */
constexpr uint64_t supported_wc_flags = uint64_t(IBV_WC_STANDARD_FLAGS) |
	IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG |
	IBV_WC_EX_WITH_TM_INFO | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
constexpr uint32_t supported_comp_mask =
	uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS) | IBV_CQ_INIT_ATTR_MASK_PD;
constexpr uint32_t supported_create_flags =
	uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED) | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;

/* mlx5_ib's limit on the moderation period (MLX5_MAX_CQ_PERIOD), which is
 * also what query_device_ex reports as cq_mod_caps.max_cq_period. */
constexpr uint16_t max_cq_period = 0xfff;

std::atomic<uint32_t> next_cqn{1};

/* libmlx5 reads MLX5_CQE_SIZE for every CQ and refuses anything but 64 or
 * 128 bytes; the rxe profile has no such variable. */
bool cqe_size_env_valid(const Context &ctx)
{
	if (ctx.device->profile->is(ProfileKind::Rxe))
		return true;
	const char *env = std::getenv("MLX5_CQE_SIZE");
	if (!env)
		return true;
	int size = std::atoi(env);
	return size == 64 || size == 128;
}

bool counts_as_solicited(const Completion &c)
{
	return c.solicited || c.wc.status != IBV_WC_SUCCESS;
}

/* The lap of ring index `index`, as a slot's tag holds it (30 bits). */
uint32_t lap_of(uint64_t index, unsigned capacity_log2)
{
	return uint32_t(shm::cq_slot_tag(index, capacity_log2) >> 32);
}

/* How a slot's state relates to ring index `index` (the index whose slot
 * it is in this lap): free for it, taken for it (claimed or ready), or of
 * a later lap (index was taken and consumed), or of an earlier one (the
 * index `capacity` before it was not consumed yet). Laps compare modulo
 * 2^30, as the tag holds them. */
enum class SlotFor { Free, Taken, Later, Earlier };

SlotFor slot_for(uint64_t state, uint64_t index, unsigned capacity_log2)
{
	constexpr uint32_t lap_mask = uint32_t(shm::cq_slot_tag_mask >> 32);
	const uint32_t ahead =
		(uint32_t(state >> 32) - lap_of(index, capacity_log2)) & lap_mask;
	if (ahead == 0)
		return (state & shm::cq_slot_kind_mask) == shm::cq_slot_free ? SlotFor::Free
									 : SlotFor::Taken;
	return ahead <= lap_mask / 2 ? SlotFor::Later : SlotFor::Earlier;
}

using cq_detail::current_array;
using cq_detail::RingArray;

/* The entry holds an ibv_wc image (shm_layout.h CqEntry): the same
 * fields at the same places, 8 bytes into the slot. */
#define SHMV_WC_AT(field)                                                               \
	static_assert(offsetof(shm::CqEntry, field) ==                                 \
			      shm::cq_entry_wc_offset + offsetof(struct ibv_wc, field) &&   \
		      sizeof(shm::CqEntry::field) == sizeof(ibv_wc::field))
SHMV_WC_AT(wr_id);
SHMV_WC_AT(status);
SHMV_WC_AT(opcode);
SHMV_WC_AT(vendor_err);
SHMV_WC_AT(byte_len);
SHMV_WC_AT(imm_data);
SHMV_WC_AT(qp_num);
SHMV_WC_AT(src_qp);
SHMV_WC_AT(wc_flags);
SHMV_WC_AT(pkey_index);
SHMV_WC_AT(slid);
SHMV_WC_AT(sl);
SHMV_WC_AT(dlid_path_bits);
#undef SHMV_WC_AT
static_assert(sizeof(struct ibv_wc) == shm::cq_entry_wc_bytes &&
	      offsetof(shm::CqEntry, solicited) >=
		      shm::cq_entry_wc_offset + offsetof(struct ibv_wc, dlid_path_bits) + 1);

void *wc_image(shm::CqEntry &e) { return reinterpret_cast<char *>(&e) + shm::cq_entry_wc_offset; }
const void *wc_image(const shm::CqEntry &e)
{
	return reinterpret_cast<const char *>(&e) + shm::cq_entry_wc_offset;
}

void fill_entry(shm::CqEntry &e, const Completion &c)
{
	std::memcpy(wc_image(e), &c.wc, sizeof(c.wc));
	/* Over ibv_wc's padding. */
	e.solicited = c.solicited;
	e.raised_event = 0;
	e.timestamp_ns = c.timestamp_ns;
}

/* The ring stores CLOCK_MONOTONIC ns (the device's raw clock); the wall
 * clock time of that instant is the realtime clock shifted by the same
 * distance from now. */
uint64_t monotonic_to_wallclock(uint64_t mono_ns)
{
	struct timespec m, r;
	clock_gettime(CLOCK_MONOTONIC, &m);
	clock_gettime(CLOCK_REALTIME, &r);
	int64_t now_mono = int64_t(m.tv_sec) * 1000000000ll + m.tv_nsec;
	int64_t now_real = int64_t(r.tv_sec) * 1000000000ll + r.tv_nsec;
	return uint64_t(now_real - (now_mono - int64_t(mono_ns)));
}

/* Every ibv_wc field is written (ibv_poll_cq() decodes straight into the
 * caller's array): one copy, then the check of what a peer may have got
 * wrong. Only values the enum knows leave the ring. */
void read_wc(const shm::CqEntry &e, struct ibv_wc &wc)
{
	std::memcpy(&wc, wc_image(e), sizeof(wc));
	if (e.status > IBV_WC_TM_RNDV_INCOMPLETE) [[unlikely]]
		wc.status = IBV_WC_GENERAL_ERR;
}

/* A send completion handed out (`wc` its copy; SqSeq's slot 0: none): its
 * WR and those before it retire from its
 * QP's send queue (SqRetired), never backwards (a peer's corrupt entry
 * moves nothing but its QP's count), and the application sees zeros in
 * SqSeq's fields. Under the CQ lock, which makes us the tail's one
 * writer: a load and a store. */
[[gnu::always_inline]] inline void retire_send(Cq &cq, const shm::CqEntry &e, struct ibv_wc &wc)
{
	wc.src_qp = 0;
	wc.slid = 0;
	wc.pkey_index = 0;
	const uint32_t slot = uint32_t(e.pkey_index) | uint32_t(e.slid) << 16; /* adjacent */
	if (slot - 1 >= cq.sq_owners.size()) [[unlikely]] /* 0 wraps: none */
		return;
	SqRetired *r = cq.sq_owners[slot - 1].get();
	if (!r || r->qp_num != e.qp_num) [[unlikely]]
		return;
	if (int32_t(e.src_qp - r->tail.load(std::memory_order_relaxed)) > 0)
		r->tail.store(e.src_qp, std::memory_order_release);
}

/* A receive completion handed out or dropped: its WQE's place goes back
 * to QP `qp_num`'s receive queue (RqRoom), if this CQ tracks it. Under
 * the CQ lock. */
[[gnu::always_inline]] inline void give_back_wqe(Cq &cq, uint32_t qp_num)
{
	RqRoom *r = cq.rq_room_last;
	if (!r || cq.rq_room_last_qpn != qp_num) [[unlikely]] {
		auto it = cq.rq_rooms.find(qp_num);
		if (it == cq.rq_rooms.end())
			return;
		r = it->second.get();
		cq.rq_room_last = r;
		cq.rq_room_last_qpn = qp_num;
	}
	r->give_back();
}

void read_entry(const shm::CqEntry &e, Completion &c)
{
	c = Completion{};
	read_wc(e, c.wc);
	c.timestamp_ns = e.timestamp_ns;
	c.solicited = e.solicited;
}

unsigned log2_of(uint32_t capacity) { return unsigned(__builtin_ctz(capacity)); }

using cq_detail::monotonic_ns;

/* How long a claim may stay unpublished before the consumer asks whether
 * its producer died, and how often it asks again: a live producer fills
 * its slot within nanoseconds of its claim, unless it lost its CPU in
 * between. A consumer polling the slot a producer is writing sees the
 * claim often (ib_send_bw's receiver, at every few messages); asking the
 * kernel each time cost it a system call (~1 us here) per sighting. */
constexpr uint64_t claim_grace_ns = 50000;

/* Whether the producer `pid` that claimed slot `index` of `ring` and has not
 * filled it will never do so. Asked only of a claim `watch` has seen
 * outstanding for claim_grace_ns, and then once per claim_grace_ns at
 * most. Gone (kill: ESRCH): at once. A zombie (killed, not yet reaped by
 * its parent, who may be the very process polling): only for a claim seen
 * outstanding for over a millisecond, since telling a zombie reads /proc. */
bool claim_abandoned(const shm::CqRing &ring, uint64_t index, uint32_t pid, ClaimWatch &watch)
{
	if (!pid)
		return false;
	const uint64_t now = monotonic_ns();
	if (watch.ring != &ring || watch.index != index || watch.pid != pid) {
		watch = {&ring, index, pid, now, now};
		return false;
	}
	if (now - watch.checked_ns < claim_grace_ns)
		return false;
	watch.checked_ns = now;
	if (::kill(pid_t(pid), 0) != 0)
		return errno == ESRCH;
	return now - watch.since_ns >= 1000000 && process_gone(pid_t(pid));
}

/* Nothing to poll and no overrun to report: three loads (cons, the slot
 * at cons, the overrun word), no lock, no look at the producers' line. A
 * snapshot, as any poll is: a completion published meanwhile is found by
 * the next poll. seq_cst: after req_notify_cq's store of the arm, a
 * producer either sees the arm or its entry is seen here (shm_layout.h
 * CqRing; a plain load on x86). */
[[gnu::always_inline]] inline bool surely_empty(const Cq &cq)
{
	const shm::CqRing &r = *cq.ring;
	const RingArray a = current_array(r);
	const uint64_t c = r.cons.load(std::memory_order_relaxed);
	return a.at(c)->state.load(std::memory_order_seq_cst) ==
		       (shm::cq_slot_free | shm::cq_slot_tag(c, a.lg)) &&
	       !r.overrun.load(std::memory_order_relaxed);
}

using cq_detail::polling_batch;

/*
 * Empty polls in a row by this thread, of any CQ. A poller that found
 * nothing this many times in a row (some 20-50 us of spinning) gives up
 * its CPU for a moment, and again after as many more: on a host with more
 * busy pollers than cores, the peer it waits for may be waiting for this
 * very CPU, and a device's completion needs no CPU of ours, but a peer
 * process's does. Where nothing else wants the CPU, sched_yield() returns
 * at once (under a microsecond, once per ~25 us of waiting); a round trip
 * of a latency test is tens of empty polls, never this many.
 */
constexpr unsigned yield_after_empty_polls = 1024;
thread_local __attribute__((tls_model("initial-exec"))) unsigned empty_polls = 0;

void polled_empty()
{
	/* A send waiting for RNR retries as soon as its target posted a
	 * receive (lib/datapath.cpp, rnr:). Outside cq.lock, which the
	 * retries do not need, so that they hold up no other poller. */
	progress_poll_waiting();
	if (++empty_polls == yield_after_empty_polls) [[unlikely]] {
		empty_polls = 0;
		sched_yield();
	}
}

} // namespace

namespace {

/* Whether the slot of ring index `index`, claimed (state `st`), was
 * claimed for it by a producer that died (the consumer skips it). Out of
 * the consumer's loop: the rare case. */
[[gnu::noinline, gnu::cold]] bool abandoned(const shm::CqRing &ring, uint64_t index, uint64_t st,
					    uint64_t tag, ClaimWatch &watch)
{
	return (st & shm::cq_slot_tag_mask) == tag &&
	       claim_abandoned(ring, index, uint32_t(st & shm::cq_slot_pid_mask), watch);
}

/* Whether the consumer stops before the entry `e`, whose completion event
 * the application has not taken yet (`events_taken`: the CQ's count, or
 * nullptr for a CQ without a channel). Only a stop, never a refusal: the
 * entry is the first of the next poll call, so an application that arms
 * and busy-polls without reading its events loses nothing, and the event
 * it reads next still finds its completion (shm_layout.h CqRing). */
[[gnu::always_inline]] inline bool held_back(const shm::CqRing &ring, const shm::CqEntry &e,
					     const std::atomic<uint64_t> *events_taken)
{
	return e.raised_event && events_taken &&
	       ring.fired.load(std::memory_order_relaxed) >
		       events_taken->load(std::memory_order_relaxed);
}

/* The consumer's loop (the owner, under its CQ lock): copies out up to
 * `max` published completions, oldest first, with `decode(entry, i)`, and
 * returns how many. The slot at cons says it all: ready for cons (take
 * it), free for cons (empty), claimed for cons (being written; skipped
 * when its producer died). Each slot is freed for the next lap as it is
 * copied; cons moves once, at the end (as libmlx5 rings the consumer
 * index once per poll): producers that read it meanwhile see less room,
 * never more. `continuing`: the call goes on with a batch that returned
 * completions already (ibv_next_poll()), so even its first entry may be
 * held back (held_back()). */
template <typename Decode>
int consume(shm::CqRing &ring, int max, const std::atomic<uint64_t> *events_taken,
	    bool continuing, ClaimWatch &watch, Decode &&decode)
{
	/* Only the consumer moves the array (resize_cq(), under the same
	 * lock). */
	const RingArray a = current_array(ring);
	const unsigned lg = a.lg;
	const uint64_t first = ring.cons.load(std::memory_order_relaxed);
	uint64_t c = first;
	int n = 0;
	while (n < max) {
		shm::CqEntry *e = a.at(c);
		const uint64_t tag = shm::cq_slot_tag(c, lg);
		/* Pairs with the producer's release (or seq_cst) store of
		 * `ready`; seq_cst as in surely_empty(). */
		const uint64_t st = e->state.load(std::memory_order_seq_cst);
		if (st == (shm::cq_slot_ready | tag)) {
			if ((n || continuing) && held_back(ring, *e, events_taken)) [[unlikely]]
				break;
			decode(*e, n);
			n++;
		} else if ((st & shm::cq_slot_kind_mask) != shm::cq_slot_claimed ||
			   !abandoned(ring, c, st, tag, watch)) {
			break; /* empty, or being filled */
		}
		/* Free for the next lap (a dead producer's slot: skipped).
		 * Release: our copy is done before a producer's claim (acquire
		 * CAS) can see the slot free. */
		e->state.store(shm::cq_slot_free | shm::cq_slot_next_lap(tag),
			       std::memory_order_release);
		c++;
	}
	/* Pairs with the producers' acquire load of cons: every slot below
	 * it is free for its next lap. */
	if (c != first)
		ring.cons.store(c, std::memory_order_release);
	return n;
}

/* The CQ's count of events taken, for held_back(); nullptr without a
 * channel (no event to wait for). */
const std::atomic<uint64_t> *events_of(const Cq &cq)
{
	return cq.channel ? &cq.events_taken : nullptr;
}

/* Completions the ring holds (published or being written, from cons on).
 * Caller holds the CQ lock. */
uint64_t occupied(const shm::CqRing &ring)
{
	const RingArray a = current_array(ring);
	const uint64_t cons = ring.cons.load(std::memory_order_relaxed);
	uint64_t i = cons;
	while (i - cons < a.capacity() &&
	       slot_for(a.at(i)->state.load(std::memory_order_acquire), i, a.lg) == SlotFor::Taken)
		i++;
	return i - cons;
}

} // namespace

bool cq_ring_consume(shm::CqRing &ring, Completion &out, ClaimWatch &watch)
{
	return consume(ring, 1, nullptr, false, watch,
		       [&](const shm::CqEntry &e, int) { read_entry(e, out); }) == 1;
}

namespace cq_detail {

[[gnu::noinline]] void report_overrun(Cq &cq)
{
	if (cq.overrun_reported.load(std::memory_order_relaxed) ||
	    !cq.ring->overrun.load(std::memory_order_acquire) ||
	    cq.overrun_reported.exchange(true))
		return;
	struct ibv_async_event ev{};
	ev.element.cq = cq.abi();
	ev.event_type = IBV_EVENT_CQ_ERR;
	Context::post_async_event_if_open(cq.ctx, ev);
}

} // namespace cq_detail

using cq_detail::report_overrun;

namespace {

void write_token(int fd)
{
	if (fd < 0)
		return;
	uint64_t one = 1;
	/* Cannot block: a semaphore eventfd holds far more tokens than we
	 * can ever produce. */
	[[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
}

/* Disarms the CQ if the ring is armed for a completion of this kind, and
 * then counts the event: true for the one producer that won the CAS to
 * "none", which writes the token. */
bool disarm(shm::CqRing &ring, bool solicited)
{
	uint32_t arm = ring.arm.load(std::memory_order_seq_cst);
	if (arm == shm::cq_arm_none || (arm == shm::cq_arm_solicited && !solicited))
		return false;
	if (!ring.arm.compare_exchange_strong(arm, shm::cq_arm_none, std::memory_order_seq_cst))
		return false;
	const uint64_t k = ring.fired.load(std::memory_order_relaxed);
	ring.fired_ns[k % 4].store(cq_detail::monotonic_ns(), std::memory_order_relaxed);
	ring.fired.fetch_add(1, std::memory_order_seq_cst); /* after the time */
	return true;
}

/*
 * Before ibv_get_cq_event() hands out an event: waits while the oldest
 * completion's slot is claimed by a producer that has not published it.
 * Slots are polled in the order they were claimed, so the completion that
 * raised the event may sit behind one whose producer (another process,
 * maybe preempted between its claim and its publication) is still
 * writing it; the poll that follows the event would then find nothing,
 * where a device has written its CQEs in order before its event. The
 * wait is one for a write already under way: it ends when the slot is
 * published, when a poll moved past it, when its producer is found dead,
 * or after a second at most (a producer stopped by a debugger).
 */
void wait_head_published(const Cq &cq)
{
	const shm::CqRing &ring = *cq.ring;
	const RingArray a = current_array(ring);
	const uint64_t c = ring.cons.load(std::memory_order_acquire);
	const shm::CqEntry *e = a.at(c);
	const uint64_t tag = shm::cq_slot_tag(c, a.lg);
	const uint64_t deadline = monotonic_ns() + 1000000000ull;
	ClaimWatch watch; /* this wait's own: the poller may hold the CQ's */
	for (unsigned round = 0;; round++) {
		const uint64_t st = e->state.load(std::memory_order_acquire);
		if ((st & shm::cq_slot_kind_mask) != shm::cq_slot_claimed ||
		    (st & shm::cq_slot_tag_mask) != tag || ring.cons.load(std::memory_order_relaxed) != c)
			return;
		if (round < 64) {
			cpu_relax();
			continue;
		}
		if (claim_abandoned(ring, c, uint32_t(st & shm::cq_slot_pid_mask), watch) ||
		    monotonic_ns() > deadline)
			return;
		/* The producer is off its CPU: give it ours. */
		struct timespec ts = {0, 20000};
		nanosleep(&ts, nullptr);
	}
}

bool readable(int fd)
{
	struct pollfd p = {fd, POLLIN, 0};
	return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/*
 * The extended polling API (ibv_start_poll() & co.), as libmlx5 provides it:
 * the CQ lock is taken by a successful start_poll() and released by
 * end_poll(); an empty CQ fails start_poll() with ENOENT and releases it.
 */
bool load_current(Cq &cq, bool continuing)
{
	/* What the read_* helpers report: the ibv_wc and the timestamp (the
	 * other fields of `current` are never anything but zero). */
	Completion &c = cq.current;
	if (consume(*cq.ring, 1, events_of(cq), continuing, cq.claim_watch,
		    [&](const shm::CqEntry &e, int) {
		    read_wc(e, c.wc);
		    c.timestamp_ns = e.timestamp_ns;
		    if (e.opcode < IBV_WC_RECV)
			    retire_send(cq, e, c.wc);
		    else
			    give_back_wqe(cq, e.qp_num);
	    }) != 1)
		return false;
	cq.ibv.cq_ex.status = c.wc.status;
	cq.ibv.cq_ex.wr_id = c.wc.wr_id;
	return true;
}

int ex_start_poll(struct ibv_cq_ex *ibcq, struct ibv_poll_cq_attr *attr)
{
	if (attr && attr->comp_mask)
		return EINVAL;
	Cq &cq = *Cq::from(ibcq);
	/* A CQ of the parent, polled in a forked child (lib/fork.h). */
	if (cq.ctx->inherited.load(std::memory_order_relaxed))
		return EIO;
	if (surely_empty(cq)) {
		polled_empty();
		return ENOENT;
	}
	empty_polls = 0;
	cq.lock.lock();
	report_overrun(cq);
	if (!load_current(cq, false)) {
		cq.lock.unlock();
		return ENOENT;
	}
	polling_batch = &cq;
	return 0;
}

int ex_next_poll(struct ibv_cq_ex *ibcq)
{
	Cq &cq = *Cq::from(ibcq);
	return load_current(cq, true) ? 0 : ENOENT;
}

/* deliver_completion() without the look at a poll batch. */
int produce_now(Cq &cq, const Completion &c);

void ex_end_poll(struct ibv_cq_ex *ibcq)
{
	Cq &cq = *Cq::from(ibcq);
	polling_batch = nullptr;
	if (!cq.deferring.load(std::memory_order_relaxed)) { /* only we set it */
		cq.lock.unlock();
		return;
	}
	/* Other threads' completions queue behind ours until all are out. */
	std::lock_guard guard(cq.deferred_lock);
	std::vector<Completion> now;
	now.swap(cq.deferred);
	cq.lock.unlock();
	for (const Completion &c : now)
		produce_now(cq, c);
	cq.deferring.store(false, std::memory_order_release);
}

const Completion &cur(struct ibv_cq_ex *ibcq) { return Cq::from(ibcq)->current; }

enum ibv_wc_opcode ex_read_opcode(struct ibv_cq_ex *c) { return cur(c).wc.opcode; }
uint32_t ex_read_vendor_err(struct ibv_cq_ex *c) { return cur(c).wc.vendor_err; }
uint32_t ex_read_byte_len(struct ibv_cq_ex *c) { return cur(c).wc.byte_len; }
__be32 ex_read_imm_data(struct ibv_cq_ex *c) { return cur(c).wc.imm_data; }
uint32_t ex_read_qp_num(struct ibv_cq_ex *c) { return cur(c).wc.qp_num; }
uint32_t ex_read_src_qp(struct ibv_cq_ex *c) { return cur(c).wc.src_qp; }
/* libmlx5's read_wc_flags looks at responder CQEs only: a send completion
 * with immediate data says IBV_WC_WITH_IMM to ibv_poll_cq() alone. */
unsigned int ex_read_wc_flags(struct ibv_cq_ex *c)
{
	const struct ibv_wc &wc = cur(c).wc;
	return wc.opcode < IBV_WC_RECV ? wc.wc_flags & ~unsigned(IBV_WC_WITH_IMM) : wc.wc_flags;
}
uint32_t ex_read_slid(struct ibv_cq_ex *c) { return cur(c).wc.slid; }
uint8_t ex_read_sl(struct ibv_cq_ex *c) { return cur(c).wc.sl; }
uint8_t ex_read_dlid_path_bits(struct ibv_cq_ex *c) { return cur(c).wc.dlid_path_bits; }
uint64_t ex_read_completion_ts(struct ibv_cq_ex *c) { return cur(c).timestamp_ns; }
uint64_t ex_read_wallclock_ns(struct ibv_cq_ex *c)
{
	return monotonic_to_wallclock(cur(c).timestamp_ns);
}
uint16_t ex_read_cvlan(struct ibv_cq_ex *c) { return cur(c).cvlan; }
uint32_t ex_read_flow_tag(struct ibv_cq_ex *c) { return cur(c).flow_tag; }
void ex_read_tm_info(struct ibv_cq_ex *c, struct ibv_wc_tm_info *tm) { *tm = cur(c).tm_info; }

/* Like libmlx5: the poll functions, opcode, vendor_err and wc_flags always;
 * every other reader only when its IBV_WC_EX_WITH_* flag was requested. */
void install_poll_ops(struct ibv_cq_ex &ex, uint64_t wc_flags)
{
	ex.start_poll = ex_start_poll;
	ex.next_poll = ex_next_poll;
	ex.end_poll = ex_end_poll;
	ex.read_opcode = ex_read_opcode;
	ex.read_vendor_err = ex_read_vendor_err;
	ex.read_wc_flags = ex_read_wc_flags;
	if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		ex.read_byte_len = ex_read_byte_len;
	if (wc_flags & IBV_WC_EX_WITH_IMM)
		ex.read_imm_data = ex_read_imm_data;
	if (wc_flags & IBV_WC_EX_WITH_QP_NUM)
		ex.read_qp_num = ex_read_qp_num;
	if (wc_flags & IBV_WC_EX_WITH_SRC_QP)
		ex.read_src_qp = ex_read_src_qp;
	if (wc_flags & IBV_WC_EX_WITH_SLID)
		ex.read_slid = ex_read_slid;
	if (wc_flags & IBV_WC_EX_WITH_SL)
		ex.read_sl = ex_read_sl;
	if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		ex.read_dlid_path_bits = ex_read_dlid_path_bits;
	if (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
		ex.read_completion_ts = ex_read_completion_ts;
	if (wc_flags & IBV_WC_EX_WITH_CVLAN)
		ex.read_cvlan = ex_read_cvlan;
	if (wc_flags & IBV_WC_EX_WITH_FLOW_TAG)
		ex.read_flow_tag = ex_read_flow_tag;
	if (wc_flags & IBV_WC_EX_WITH_TM_INFO)
		ex.read_tm_info = ex_read_tm_info;
	if (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
		ex.read_completion_wallclock_ns = ex_read_wallclock_ns;
}

} // namespace

/* --- The consumer lock --- */

thread_local __attribute__((tls_model("initial-exec"))) char poll_lock_thread_tag;

void PollLock::lock_contended()
{
	/* A poll holds the lock for tens of nanoseconds: spin a little first
	 * (a batch or a resize may hold it much longer). */
	for (int i = 0; i < 200; i++) {
		cpu_relax();
		uint32_t expected = free_;
		if (word_.load(std::memory_order_relaxed) == free_ &&
		    word_.compare_exchange_strong(expected, held_, std::memory_order_acquire,
						  std::memory_order_relaxed))
			return;
	}
	/* Then sleep, announced. Taking the lock from here leaves it
	 * `contended`, so its unlock wakes the next waiter, if any. */
	long sleep_ns = 20000;
	while (word_.exchange(contended_, std::memory_order_acquire) != free_) {
		struct timespec ts = {0, sleep_ns};
		syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word_), FUTEX_WAIT_PRIVATE,
			contended_, &ts, nullptr, 0);
		sleep_ns = std::min(sleep_ns * 2, 1000000L);
	}
}

void PollLock::unlock_contended()
{
	word_.store(free_, std::memory_order_release);
	syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word_), FUTEX_WAKE_PRIVATE, 1, nullptr,
		nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
		      std::atomic<uint32_t>::is_always_lock_free,
	      "PollLock sleeps on its word with futex()");

/* --- Completion channels --- */

Result<CompChannel> create_comp_channel(Context &ctx)
{
	auto *ch = new (std::nothrow) CompChannel{};
	if (!ch)
		return Err{ENOMEM};
	ch->ibv.context = ctx.abi();
	ch->ibv.refcnt = 0;
	ch->ibv.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ibv.fd < 0) {
		int err = errno;
		delete ch;
		return Err{err};
	}
	return ch;
}

int destroy_comp_channel(CompChannel &ch)
{
	/* rdma-core counts the CQs of a channel in refcnt under the context
	 * mutex; ibv_create_cq/ibv_destroy_cq update it the same way. */
	pthread_mutex_t *mutex = &ch.ibv.context->mutex;
	pthread_mutex_lock(mutex);
	if (ch.ibv.refcnt) {
		pthread_mutex_unlock(mutex);
		return EBUSY;
	}
	::close(ch.ibv.fd);
	delete &ch;
	pthread_mutex_unlock(mutex);
	return 0;
}

int get_cq_event(CompChannel &ch, Cq *&out)
{
	for (;;) {
		Cq *taken = nullptr;
		{
			std::lock_guard guard(ch.lock);
			/* Only token readers consume tokens, all under this
			 * lock: a token seen here is still there for read(). */
			if (readable(ch.ibv.fd)) {
				/* The oldest event first, whichever CQ it is of
				 * (uverbs queues a channel's events in one list):
				 * each CQ's next one by the time it fired. Over 4
				 * waiting on one CQ, its next one's time is gone:
				 * it counts as the oldest. */
				uint64_t oldest = UINT64_MAX;
				for (Cq *cq : ch.cqs) {
					const uint64_t fired = cq->ring->fired.load(std::memory_order_acquire);
					const uint64_t next = cq->events_taken.load(std::memory_order_relaxed);
					if (fired <= next)
						continue;
					const uint64_t at = fired - next > 4 ? 0
						: cq->ring->fired_ns[next % 4].load(std::memory_order_relaxed);
					if (!taken || at < oldest) {
						taken = cq;
						oldest = at;
					}
				}
				if (taken) {
					uint64_t token;
					[[maybe_unused]] ssize_t n =
						::read(ch.ibv.fd, &token, sizeof(token));
					taken->events_taken.fetch_add(1, std::memory_order_relaxed);
					pthread_mutex_lock(&taken->ibv.cq.mutex);
					taken->comp_events_reported++;
					pthread_mutex_unlock(&taken->ibv.cq.mutex);
				}
			}
			/* Under the lock: a resize moves the ring under it. */
			if (taken)
				wait_head_published(*taken);
		}
		if (taken) {
			out = taken;
			return 0;
		}
		/* Nothing to take: behave as read() on the uverbs channel fd
		 * does, according to the O_NONBLOCK flag the application may
		 * have set. */
		int fl = fcntl(ch.ibv.fd, F_GETFL);
		if (fl < 0)
			return errno;
		if (fl & O_NONBLOCK)
			return EAGAIN;
		if (readable(ch.ibv.fd)) {
			/* A token whose `fired` increment we cannot see yet is
			 * a moment away: look again after a short sleep. */
			struct pollfd p = {ch.ibv.fd, POLLIN, 0};
			::poll(&p, 1, 1);
			continue;
		}
		/* Sleep in read(), as on the uverbs channel fd, not in poll():
		 * a signal then interrupts the wait as it interrupts that read
		 * (EINTR, unless its handler has SA_RESTART: the kernel
		 * restarts the read), where poll() always fails. The token it
		 * takes goes straight back for the locked look above (a
		 * reader blocked there meanwhile gets it then). */
		uint64_t token;
		if (::read(ch.ibv.fd, &token, sizeof(token)) < 0)
			return errno;
		[[maybe_unused]] ssize_t n = ::write(ch.ibv.fd, &token, sizeof(token));
	}
}

void ack_cq_events(Cq &cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq.ibv.cq.mutex);
	cq.ibv.cq.comp_events_completed += nevents;
	pthread_cond_broadcast(&cq.ibv.cq.cond);
	pthread_mutex_unlock(&cq.ibv.cq.mutex);
}

/* --- Completion queues --- */

Result<Cq> create_cq(Context &ctx, const struct ibv_cq_init_attr_ex &attr, bool extended)
{
	/* libibverbs' ibv_create_cq_ex() wrapper. */
	if (extended && (attr.wc_flags & ~uint64_t(IBV_CREATE_CQ_SUP_WC_FLAGS)))
		return Err{EOPNOTSUPP};
	/* libmlx5, in its order. */
	if (attr.cqe == 0)
		return Err{EINVAL};
	if (attr.comp_mask & ~supported_comp_mask)
		return Err{EINVAL};
	if ((attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	    (attr.flags & ~supported_create_flags))
		return Err{EINVAL};
	if (attr.wc_flags & ~supported_wc_flags)
		return Err{EOPNOTSUPP};
	/* IBV_CQ_INIT_ATTR_MASK_PD names a parent domain (libmlx5 takes its
	 * allocators for the CQ's buffers, which live in shared memory here);
	 * anything else, a plain PD included, is EINVAL. */
	ParentDomain *parent = nullptr;
	if (attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		struct ibv_pd *pd = attr.parent_domain;
		if (!pd || !to_context(pd->context) || !(parent = ParentDomain::from(pd)))
			return Err{EINVAL};
	}
	if (!cqe_size_env_valid(ctx))
		return Err{EINVAL};
	/* The kernel (ib_uverbs + the driver). */
	if (attr.comp_vector >= uint32_t(ctx.abi()->num_comp_vectors))
		return Err{EINVAL};
	/* A channel is an fd of this very uverbs file; anything else is EBADF. */
	if (attr.channel && to_context(attr.channel->context) != &ctx)
		return Err{EBADF};
	uint32_t cqe;
	if (int err = ctx.device->profile->size_cq(attr.cqe, cqe))
		return Err{err};
	/* libmlx5's CQ buffer: its entries (cqe + 1 of MLX5_CQE_SIZE bytes),
	 * in whole pages, on huge pages when asked to be. */
	const char *cqe_size = std::getenv("MLX5_CQE_SIZE");
	const size_t buffer = (size_t{cqe} + 1) * (cqe_size && std::atoi(cqe_size) == 128 ? 128 : 64);
	HugeChunks::Lease huge;
	if (int err = take_queue_huge_pages(ctx, parent, "MLX_CQ", "HUGE_CQ",
					    (buffer + 4095) / 4096 * 4096, huge))
		return Err{err};

	auto *cq = new (std::nothrow) Cq{};
	if (!cq) {
		ctx.huge_chunks.give_back(huge);
		return Err{ENOMEM};
	}
	cq->huge = huge;
	/* The ring: a power of two of slots above the granted cqe. Shrinking
	 * keeps the ring; growing beyond it makes a new one (resize_cq). */
	uint32_t capacity = 1;
	while (capacity < cqe + 1)
		capacity <<= 1;
	Segment &seg = Segment::of(ctx.device->index);
	cq->ring_bytes = cq_ring_bytes(capacity);
	cq->ring_off = seg.alloc(cq->ring_bytes);
	if (!cq->ring_off) {
		ctx.huge_chunks.give_back(cq->huge);
		delete cq;
		return Err{ENOMEM};
	}
	cq->ring = seg.at<shm::CqRing>(cq->ring_off);
	cq_ring_init(*cq->ring, capacity);
	cq->ring->limit.store(cqe);
	cq->ring->timestamps = (attr.wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
						 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
				       ? 1 : 0;
	cq->ctx = &ctx;
	cq->channel = attr.channel ? CompChannel::from(attr.channel) : nullptr;
	/* libmlx5 pins the parent domain until the CQ is destroyed. */
	cq->parent_domain = parent;
	if (parent)
		parent->pd.uses.get();
	cq->wc_flags = attr.wc_flags;
	cq->extended = extended;
	cq->create_flags = (attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr.flags : 0;
	cq->ring->ignore_overrun.store((cq->create_flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) ? 1 : 0);
	cq->cqn = next_cqn.fetch_add(1, std::memory_order_relaxed);

	struct ibv_cq_ex &ex = cq->ibv.cq_ex;
	ex.context = ctx.abi();
	ex.channel = attr.channel;
	ex.cq_context = attr.cq_context;
	ex.handle = cq->cqn;
	ex.cqe = static_cast<int>(cqe);
	pthread_mutex_init(&ex.mutex, nullptr);
	pthread_cond_init(&ex.cond, nullptr);
	ex.comp_events_completed = 0;
	ex.async_events_completed = 0;
	/* libmlx5 fills these only for ibv_create_cq_ex(); having them on
	 * every CQ costs nothing and keeps a misused ibv_cq from crashing. */
	install_poll_ops(ex, extended ? attr.wc_flags : uint64_t(IBV_WC_STANDARD_FLAGS));

	if (cq->channel) {
		pthread_mutex_lock(&ctx.abi()->mutex);
		cq->channel->ibv.refcnt++;
		pthread_mutex_unlock(&ctx.abi()->mutex);
		std::lock_guard guard(cq->channel->lock);
		cq->channel->cqs.push_back(cq);
	}
	ctx.add_event_source(cq, &cq->async_events);
	process_fork_ranges().queue_created();
	return cq;
}

namespace {

/*
 * Closes array `a` of the ring for claims (shm_layout.h CqRing, resizing):
 * every slot free for its index in [cons, cons + capacity) becomes moved;
 * then waits until every claim that won before is published or its
 * producer is dead. false: a live producer kept its claim unpublished for
 * a second (stopped, say, by a debugger); the slots are free again and
 * nothing changed. Caller holds cq.lock, so cons stands still.
 */
bool close_array(Cq &cq, const RingArray &a)
{
	shm::CqRing &ring = *cq.ring;
	const uint64_t cons = ring.cons.load(std::memory_order_relaxed);
	const uint64_t end = cons + a.capacity();
	for (uint64_t i = cons; i < end; i++) {
		uint64_t st = shm::cq_slot_free | shm::cq_slot_tag(i, a.lg);
		/* Fails only for a slot claimed (for i) meanwhile, or
		 * already taken. */
		a.at(i)->state.compare_exchange_strong(st, shm::cq_slot_moved,
						       std::memory_order_acq_rel);
	}
	const uint64_t deadline = monotonic_ns() + 1000000000ull;
	ClaimWatch watch;
	for (uint64_t i = cons; i < end; i++) {
		const uint64_t tag = shm::cq_slot_tag(i, a.lg);
		for (unsigned round = 0;; round++) {
			const uint64_t st = a.at(i)->state.load(std::memory_order_acquire);
			if ((st & shm::cq_slot_kind_mask) != shm::cq_slot_claimed ||
			    (st & shm::cq_slot_tag_mask) != tag ||
			    claim_abandoned(ring, i, uint32_t(st & shm::cq_slot_pid_mask), watch))
				break;
			if (round < 64) {
				cpu_relax();
				continue;
			}
			if (monotonic_ns() > deadline) {
				for (uint64_t j = cons; j < end; j++) {
					uint64_t moved = shm::cq_slot_moved;
					a.at(j)->state.compare_exchange_strong(
						moved, shm::cq_slot_free | shm::cq_slot_tag(j, a.lg),
						std::memory_order_acq_rel);
				}
				ring.moves_abandoned.fetch_add(1, std::memory_order_release);
				return false;
			}
			struct timespec ts = {0, 20000};
			nanosleep(&ts, nullptr);
		}
	}
	return true;
}

/* Moves the ring to a new array of `capacity` slots (a power of two):
 * closes the current one, copies what it holds from cons on, in order (a
 * dead producer's claim left out), sets the rest free and names the new
 * one. ENOMEM without segment space, EAGAIN when the current array could
 * not be closed. Caller holds cq.lock. */
int move_ring(Cq &cq, uint32_t capacity)
{
	shm::CqRing &ring = *cq.ring;
	Segment &seg = Segment::of(cq.ctx->device->index);
	const uint64_t bytes = uint64_t(capacity) * sizeof(shm::CqEntry);
	const uint64_t off = seg.alloc(bytes);
	if (!off)
		return ENOMEM;
	const RingArray from = current_array(ring);
	if (!close_array(cq, from)) {
		seg.free(off, bytes);
		return EAGAIN;
	}
	const unsigned lg = log2_of(capacity);
	const int64_t delta = int64_t(off) - int64_t(cq.ring_off);
	const RingArray to = cq_detail::ring_array(ring, shm::cq_array_word(delta, lg));
	const uint64_t cons = ring.cons.load(std::memory_order_relaxed);
	uint64_t n = cons;
	for (uint64_t i = cons; i < cons + from.capacity(); i++) {
		const shm::CqEntry &e = *from.at(i);
		if (e.state.load(std::memory_order_acquire) !=
		    (shm::cq_slot_ready | shm::cq_slot_tag(i, from.lg)))
			continue; /* moved, or a dead producer's claim */
		shm::CqEntry &d = *to.at(n);
		std::memcpy(reinterpret_cast<char *>(&d) + sizeof(d.state),
			    reinterpret_cast<const char *>(&e) + sizeof(e.state),
			    sizeof(e) - sizeof(e.state));
		d.state.store(shm::cq_slot_ready | shm::cq_slot_tag(n, lg), std::memory_order_relaxed);
		n++;
	}
	for (uint64_t i = n; i < cons + capacity; i++)
		to.at(i)->state.store(shm::cq_slot_free | shm::cq_slot_tag(i, lg),
				      std::memory_order_relaxed);
	/* Every slot of the old array moved, the copied ones and a dead
	 * producer's claim too: a producer still holding the old word fails
	 * there and looks at the word again, whatever index it tries (a
	 * copied slot would read as taken in an earlier lap: "full"). */
	for (uint64_t i = cons; i < cons + from.capacity(); i++)
		from.at(i)->state.store(shm::cq_slot_moved, std::memory_order_relaxed);
	ring.prod.store(n, std::memory_order_relaxed);
	/* Producers waiting on the moved slots, and those to come, claim
	 * from here on. Release: the slots above are set first. */
	ring.array.store(shm::cq_array_word(delta, lg), std::memory_order_release);
	cq.arrays.emplace_back(off, bytes);
	return 0;
}

} // namespace

int resize_cq(Cq &cq, int cqe)
{
	/* libmlx5's own checks, then the kernel's through the profile. */
	if (cqe < 0)
		return EINVAL;
	if (int64_t(cqe) * 64 > INT32_MAX)
		return EINVAL;
	uint32_t granted;
	if (int err = cq.ctx->device->profile->size_cq(uint32_t(cqe), granted))
		return err;

	std::lock_guard guard(cq.lock);
	if (granted == uint32_t(cq.ibv.cq.cqe))
		return 0;
	shm::CqRing &ring = *cq.ring;
	/* The device refuses to shrink below the completions it holds;
	 * those it holds move to the resized CQ in order. */
	if (occupied(ring) > granted)
		return EINVAL;
	/* Within the array only the limit moves; beyond it the slots move
	 * to a bigger one, while producers in any process go on. */
	uint32_t capacity = cq_ring_capacity(ring);
	if (granted + 1 > capacity) {
		while (capacity < granted + 1)
			capacity <<= 1;
		if (int err = move_ring(cq, capacity))
			return err;
	}
	ring.limit.store(granted);
	cq.ibv.cq.cqe = static_cast<int>(granted);
	return 0;
}

int destroy_cq(Cq &cq)
{
	if (cq.uses.busy())
		return EBUSY;

	/* From here on the CQ is gone for the device: undelivered events
	 * are withdrawn from the channel with their tokens, as uverbs drops
	 * unread events of a CQ. */
	if (CompChannel *ch = cq.channel) {
		std::lock_guard guard(ch->lock);
		cq.detached = true;
		std::erase(ch->cqs, &cq);
		uint64_t undelivered = cq.ring->fired.load() - cq.events_taken.load();
		for (uint64_t i = 0; i < undelivered; i++) {
			/* The token follows its `fired` increment at once;
			 * bounded in case its producer died in between. */
			struct pollfd p = {ch->ibv.fd, POLLIN, 0};
			if (::poll(&p, 1, 100) != 1)
				break;
			uint64_t token;
			[[maybe_unused]] ssize_t n = ::read(ch->ibv.fd, &token, sizeof(token));
		}
	}

	/* Events already handed to the application must be acknowledged
	 * first (ibv_get_cq_event(3)), and so must its async events; an
	 * async event it has not read (IBV_EVENT_CQ_ERR) dies with the CQ, as
	 * uverbs drops it, rather than name a freed CQ later. No QP names
	 * the CQ any more, so no producer raises another. */
	pthread_mutex_lock(&cq.ibv.cq.mutex);
	while (cq.ibv.cq.comp_events_completed < cq.comp_events_reported)
		pthread_cond_wait(&cq.ibv.cq.cond, &cq.ibv.cq.mutex);
	pthread_mutex_unlock(&cq.ibv.cq.mutex);
	cq.ctx->drop_queued_events(&cq);
	cq.async_events.wait_all_acked();
	cq.ctx->remove_event_source(&cq);

	if (CompChannel *ch = cq.channel) {
		pthread_mutex_lock(&cq.ctx->abi()->mutex);
		ch->ibv.refcnt--;
		pthread_mutex_unlock(&cq.ctx->abi()->mutex);
	}
	if (cq.parent_domain)
		cq.parent_domain->pd.uses.put();
	pthread_cond_destroy(&cq.ibv.cq.cond);
	pthread_mutex_destroy(&cq.ibv.cq.mutex);
	/* No QP names the CQ any more, and a QP's destroy waited until no
	 * remote producer was inside it: the ring can be reused. */
	Segment &seg = Segment::of(cq.ctx->device->index);
	for (const auto &[off, bytes] : cq.arrays)
		seg.free(off, bytes);
	seg.free(cq.ring_off, cq.ring_bytes);
	cq.ctx->huge_chunks.give_back(cq.huge);
	delete &cq;
	return 0;
}

int poll_cq(Cq &cq, int num_entries, struct ibv_wc *wc)
{
	if (num_entries <= 0)
		return 0;
	if (!wc)
		return -EINVAL;
	if (surely_empty(cq)) {
		polled_empty();
		return 0;
	}
	empty_polls = 0;
	std::lock_guard guard(cq.lock);
	if (cq.ring->overrun.load(std::memory_order_relaxed)) [[unlikely]]
		report_overrun(cq);
	return consume(*cq.ring, num_entries, events_of(cq), false, cq.claim_watch,
		       [&](const shm::CqEntry &e, int i) {
			       read_wc(e, wc[i]);
			       if (e.opcode < IBV_WC_RECV)
				       retire_send(cq, e, wc[i]);
			       else
				       give_back_wqe(cq, e.qp_num);
		       });
}

void cq_track_rq(Cq &cq, uint32_t qp_num, std::shared_ptr<RqRoom> room)
{
	std::lock_guard guard(cq.lock);
	if (room)
		cq_clean(cq, qp_num); /* an earlier QP's of this number (recursive lock) */
	cq.rq_room_last = nullptr;
	if (room)
		cq.rq_rooms[qp_num] = std::move(room);
	else
		cq.rq_rooms.erase(qp_num);
}

SqWatch cq_watch_sq(Cq &cq, uint32_t qp_num, uint32_t tail)
{
	std::lock_guard guard(cq.lock);
	auto free = std::find_if(cq.sq_owners.begin(), cq.sq_owners.end(),
				 [](const auto &w) { return !w || w.use_count() == 1; });
	if (free == cq.sq_owners.end()) {
		if (cq.sq_owners.size() >= UINT32_MAX - 1)
			return {};
		free = cq.sq_owners.emplace(cq.sq_owners.end());
	}
	*free = std::make_shared<SqRetired>(qp_num, tail);
	return {*free, uint32_t(free - cq.sq_owners.begin()) + 1};
}

int cq_clean(Cq &cq, uint32_t qp_num)
{
	std::lock_guard guard(cq.lock);
	if (!cq.ring)
		return 0;
	/* Those held back for the end of a poll batch (this thread's, when
	 * the QP is reset or destroyed from inside it) go too. */
	int dropped = 0;
	if (cq.deferring.load(std::memory_order_acquire)) {
		std::lock_guard deferred_guard(cq.deferred_lock);
		dropped = int(std::erase_if(cq.deferred, [&](const Completion &c) {
			if (c.wc.qp_num != qp_num)
				return false;
			if (c.wc.opcode >= IBV_WC_RECV)
				give_back_wqe(cq, qp_num);
			return true;
		}));
	}
	shm::CqRing &ring = *cq.ring;
	const RingArray a = current_array(ring);
	const uint32_t cap = a.capacity();
	const unsigned lg = a.lg;
	/* The published prefix [cons, end): slots in it are the consumer's
	 * (producers only claim free slots), so they can be rewritten in
	 * place. Completions still being written are left alone. */
	const uint64_t cons = ring.cons.load(std::memory_order_relaxed);
	std::vector<Completion> kept;
	uint64_t end = cons;
	int removed = 0;
	for (; end - cons < cap; end++) {
		shm::CqEntry *e = a.at(end);
		if (e->state.load(std::memory_order_acquire) !=
		    (shm::cq_slot_ready | shm::cq_slot_tag(end, lg)))
			break;
		Completion c;
		read_entry(*e, c);
		if (c.wc.qp_num != qp_num) {
			kept.push_back(c);
			continue;
		}
		/* As mlx5_cq_clean, which frees the SRQ WQEs of those it drops
		 * (a reset gives a QP's own RQ its whole room anyway). */
		if (c.wc.opcode >= IBV_WC_RECV)
			give_back_wqe(cq, qp_num);
		removed++;
	}
	if (!removed)
		return dropped;
	/* The kept ones move to the end of the prefix, in order; the slots
	 * before them are consumed. */
	const uint64_t first = end - kept.size();
	for (size_t i = 0; i < kept.size(); i++)
		fill_entry(*a.at(first + i), kept[i]);
	for (uint64_t i = cons; i < first; i++)
		a.at(i)->state.store(shm::cq_slot_free | shm::cq_slot_tag(i + cap, lg),
				     std::memory_order_release);
	for (size_t i = 0; i < kept.size(); i++)
		a.at(first + i)->state.store(
			shm::cq_slot_ready | shm::cq_slot_tag(first + i, lg), std::memory_order_relaxed);
	/* Pairs with the producers' acquire load of cons. */
	ring.cons.store(first, std::memory_order_release);
	return removed + dropped;
}

int req_notify_cq(Cq &cq, int solicited_only)
{
	shm::CqRing &ring = *cq.ring;
	/* The arm covers the next completion (ibv_req_notify_cq(3), and the IB
	 * spec's Request Completion Notification): completions already queued
	 * raise nothing, so an application that arms, then polls until empty,
	 * then waits, sees each event exactly once and none spuriously (rdma-core's
	 * rc_pingpong -e -t depends on it). Producers publish and then load the
	 * arm (seq_cst): one that publishes after this store fires. */
	ring.arm.store(solicited_only ? shm::cq_arm_solicited : shm::cq_arm_next,
		       std::memory_order_seq_cst);
	return 0;
}

int modify_cq(Cq &cq, const struct ibv_modify_cq_attr &attr)
{
	/* librxe has no modify_cq: libibverbs' default answers. */
	if (cq.ctx->device->profile->is(ProfileKind::Rxe))
		return EOPNOTSUPP;
	/* libibverbs, then ib_uverbs, then mlx5_ib. */
	if (attr.attr_mask >= IBV_CQ_ATTR_RESERVED)
		return EINVAL;
	if (attr.attr_mask == 0)
		return EINVAL;
	if (attr.moderate.cq_period > max_cq_period)
		return EINVAL;
	/* Recorded only: events are raised per completion, which a moderated
	 * CQ may do too (moderation bounds the delay, it adds none here). */
	std::lock_guard guard(cq.arm_lock);
	cq.moderation_count = attr.moderate.cq_count;
	cq.moderation_period = attr.moderate.cq_period;
	return 0;
}

uint64_t cq_ring_bytes(uint32_t capacity)
{
	return shm::cq_slots_offset + uint64_t(capacity) * sizeof(shm::CqEntry);
}

void cq_ring_init(shm::CqRing &ring, uint32_t capacity)
{
	/* The slots read as zero: free for the indices of the first lap. */
	ring.magic = shm::cq_magic;
	ring.array.store(shm::cq_array_word(shm::cq_slots_offset, log2_of(capacity)),
			 std::memory_order_relaxed);
}

uint32_t cq_ring_capacity(const shm::CqRing &ring)
{
	return current_array(ring).capacity();
}

namespace cq_detail {

/* produce()'s claim beyond the hinted index (shm_layout.h CqRing): from
 * max(prod, cons) on, the first index whose slot is free for it, cons
 * re-read when the ring looks full or the hint is behind it. */
shm::CqEntry *claim_slow(shm::CqRing &ring, uint64_t word, uint64_t pid, uint64_t cons,
			 uint64_t &p, uint64_t &tag, bool *overrun_now, uint64_t *cons_seen,
			 int &err)
{
	const RingArray a = ring_array(ring, word);
	const unsigned lg = a.lg;
	const uint32_t limit = std::min(ring.limit.load(std::memory_order_relaxed), a.capacity() - 1);
	for (;;) {
		if (p < cons || p - cons >= limit) {
			/* Full by this copy of cons, or the hint is behind it:
			 * decide on a fresh one. A copy ahead of the ring's
			 * indices is another ring's (a CQ made anew at that
			 * place). */
			const uint64_t fresh = ring.cons.load(std::memory_order_acquire);
			if (cons_seen)
				*cons_seen = fresh;
			if (fresh != cons) {
				cons = fresh;
				continue;
			}
			if (p < cons) {
				p = cons; /* every index below cons was claimed */
				continue;
			}
			/* Full by an array the ring has left since: not full. */
			if (ring.array.load(std::memory_order_acquire) != word) {
				err = EAGAIN;
				return nullptr;
			}
			err = mark_overrun(ring, overrun_now);
			return nullptr;
		}
		shm::CqEntry *e = a.at(p);
		tag = shm::cq_slot_tag(p, lg);
		uint64_t st = shm::cq_slot_free | tag;
		if (e->state.compare_exchange_strong(st, shm::cq_slot_claimed | tag | pid,
						     std::memory_order_acquire,
						     std::memory_order_relaxed))
			return e;
		if ((st & shm::cq_slot_kind_mask) == shm::cq_slot_moved) {
			err = EAGAIN; /* being resized: wait_moved() */
			return nullptr;
		}
		/* Index p is taken (maybe consumed already): the next one. A
		 * slot still of the lap before p's cannot be, with p - cons
		 * below the capacity (the consumer frees a slot before cons
		 * passes it): only a corrupt ring has one, and it is full. */
		if (slot_for(st, p, lg) == SlotFor::Earlier) {
			/* As above: an array the ring has left is not full. */
			err = ring.array.load(std::memory_order_acquire) != word ? EAGAIN : ENOSPC;
			return nullptr;
		}
		p++;
	}
}

bool wait_moved(const shm::CqRing &ring, uint64_t word, uint64_t p, const int *owner_alive)
{
	/* The owner holds the slots moved only while it waits for claims
	 * that won before it and copies what is published: microseconds,
	 * unless it loses its CPU (then give it ours) or a claim stays
	 * unpublished, which it waits a second for before it gives up and
	 * frees the slots again (close_array()). Well beyond that: only an
	 * owner that died mid-resize leaves the slots moved for good. */
	const shm::CqEntry *e = ring_array(ring, word).at(p);
	uint64_t deadline = 0;
	/* A resize that gave up (and maybe one retried at once, closing the
	 * slot again before we saw it free) is no owner stuck mid-resize:
	 * the wait starts over. */
	uint32_t abandoned = ring.moves_abandoned.load(std::memory_order_acquire);
	for (unsigned round = 0;; round++) {
		if (ring.array.load(std::memory_order_acquire) != word ||
		    (e->state.load(std::memory_order_acquire) & shm::cq_slot_kind_mask) !=
			    shm::cq_slot_moved)
			return true;
		if (const uint32_t now_abandoned =
			    ring.moves_abandoned.load(std::memory_order_acquire);
		    now_abandoned != abandoned) {
			abandoned = now_abandoned;
			deadline = 0;
		}
		if (round < 64) {
			cpu_relax();
			continue;
		}
		if (!PeerSegment::owner_alive(owner_alive))
			return false; /* it died mid-resize: nobody will name an array */
		const uint64_t now = monotonic_ns();
		if (!deadline)
			deadline = now + 10000000000ull;
		else if (now > deadline)
			return false;
		sched_yield();
	}
}

int mark_overrun(shm::CqRing &ring, bool *overrun_now)
{
	if (!ring.ignore_overrun.load(std::memory_order_relaxed)) {
		uint32_t zero = 0;
		const bool first = ring.overrun.compare_exchange_strong(zero, 1);
		if (overrun_now)
			*overrun_now = first;
	}
	return ENOSPC;
}

void publish_with_channel(shm::CqRing &ring, shm::CqEntry &e, uint64_t ready, bool solicited,
			  CqChannel channel)
{
	/* Armed already: the entry carries its event, which is counted
	 * before the consumer can see the entry (shm_layout.h CqRing). */
	const bool raised = disarm(ring, solicited);
	e.raised_event = raised;
	/* Publish, then look at the arm (again): ordered against
	 * req_notify_cq's store of the arm and its poll after it. */
	e.state.store(ready, std::memory_order_seq_cst);
	if (!raised && !disarm(ring, solicited))
		return;
	/* A peer's descriptor, held until the token is written. */
	write_token(channel.attached ? int(fetch_channel_fd(channel.device, channel.kind, channel.id))
				     : channel.fd);
}

int defer_send_completion(Cq &cq, uint64_t wr_id, enum ibv_wc_status status,
			  enum ibv_wc_opcode opcode, uint32_t qp_num, uint32_t byte_len, SqSeq sq,
			  uint32_t wc_flags)
{
	Completion c = make_completion(wr_id, status, opcode, qp_num);
	c.wc.byte_len = byte_len;
	c.wc.wc_flags = wc_flags;
	c.wc.src_qp = sq.seq;
	c.wc.pkey_index = uint16_t(sq.slot);
	c.wc.slid = uint16_t(sq.slot >> 16);
	return deliver_completion(cq, c);
}

} // namespace cq_detail

int cq_ring_produce(CqTarget &target, const Completion &c, CqChannel channel,
		    bool *overrun_now, uint64_t *cons_seen)
{
	/* Where the entry's last word is not the time, it reads 0, whatever
	 * timestamp the Completion carries (the injection hook stamps every
	 * one). */
	return cq_detail::produce(
		target, counts_as_solicited(c), c.timestamp_ns != 0,
		[&](shm::CqEntry &e) {
			fill_entry(e, c);
			if (!target.ring->timestamps)
				e.timestamp_ns = 0;
		},
		channel, overrun_now, cons_seen);
}

namespace cq_detail {

bool defer(Cq &cq, const Completion &c)
{
	std::lock_guard guard(cq.deferred_lock);
	if (polling_batch != &cq && !cq.deferring.load(std::memory_order_relaxed))
		return false; /* end_poll() published them meanwhile */
	cq.deferred.push_back(c);
	cq.deferring.store(true, std::memory_order_relaxed);
	return true;
}

} // namespace cq_detail

int deliver_completion(Cq &cq, const Completion &c)
{
	/* This thread is inside an ibv_start_poll() batch of this very CQ (it
	 * posted from there, as rc_pingpong does): the completion appears at
	 * end_poll(). A device's completion is never visible to the poll batch
	 * that was running when the work request was posted, and its event
	 * fires for a CQE that is still there to poll after the event. Another
	 * thread's completion waits behind it (Cq::deferred). */
	if ((polling_batch == &cq || cq.deferring.load(std::memory_order_acquire)) &&
	    cq_detail::defer(cq, c)) [[unlikely]]
		return 0;
	return produce_now(cq, c);
}

namespace {

int produce_now(Cq &cq, const Completion &c)
{
	bool overrun_now = false;
	CqTarget target = own_cq_target(*cq.ring);
	int err = cq_ring_produce(target, c,
				  CqChannel::of(cq.channel ? cq.channel->ibv.fd : -1), &overrun_now);
	if (overrun_now)
		report_overrun(cq);
	return err;
}

} // namespace

} // namespace shmverbs
