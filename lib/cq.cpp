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
#include "device.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Cq> && offsetof(Cq, ibv) == 0,
	      "ibv_cq* and ibv_cq_ex* are converted to Cq*");
static_assert(std::is_standard_layout_v<CompChannel> && offsetof(CompChannel, ibv) == 0,
	      "ibv_comp_channel* is converted to CompChannel*");

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

bool is_rxe(const Context &ctx)
{
	return ctx.device->profile == &Profile::get(ProfileKind::Rxe);
}

/* libmlx5 reads MLX5_CQE_SIZE for every CQ and refuses anything but 64 or
 * 128 bytes; the rxe profile has no such variable. */
bool cqe_size_env_valid(const Context &ctx)
{
	if (is_rxe(ctx))
		return true;
	const char *env = std::getenv("MLX5_CQE_SIZE");
	if (!env)
		return true;
	int size = std::atoi(env);
	return size == 64 || size == 128;
}

bool wakes(CqArm arm, const Completion &c)
{
	switch (arm) {
	case CqArm::Next:
		return true;
	case CqArm::Solicited:
		return c.solicited || c.wc.status != IBV_WC_SUCCESS;
	case CqArm::None:
		break;
	}
	return false;
}

bool counts_as_solicited(const Completion &c)
{
	return c.solicited || c.wc.status != IBV_WC_SUCCESS;
}

/* Queues one completion event on the CQ's channel and wakes its readers. */
void raise_completion_event(Cq &cq)
{
	CompChannel *ch = cq.channel;
	if (!ch)
		return; /* as in uverbs: no channel, the event goes nowhere */
	std::lock_guard guard(ch->lock);
	if (cq.detached)
		return;
	ch->pending.push_back(&cq);
	uint64_t one = 1;
	/* Cannot block: a semaphore eventfd holds far more tokens than we
	 * can ever queue. */
	[[maybe_unused]] ssize_t n = ::write(ch->ibv.fd, &one, sizeof(one));
}

/* Removes the oldest completion; caller holds cq.lock, queue not empty. */
Completion pop_completion(Cq &cq)
{
	Completion c = cq.queue.front();
	cq.queue.pop_front();
	cq.unpolled.fetch_sub(1, std::memory_order_relaxed);
	if (counts_as_solicited(c))
		cq.unpolled_solicited.fetch_sub(1, std::memory_order_relaxed);
	return c;
}

/*
 * The extended polling API (ibv_start_poll() & co.), as libmlx5 provides it:
 * the CQ lock is taken by a successful start_poll() and released by
 * end_poll(); an empty CQ fails start_poll() with ENOENT and releases it.
 */
void load_current(Cq &cq)
{
	cq.current = pop_completion(cq);
	cq.ibv.cq_ex.status = cq.current.wc.status;
	cq.ibv.cq_ex.wr_id = cq.current.wc.wr_id;
}

int ex_start_poll(struct ibv_cq_ex *ibcq, struct ibv_poll_cq_attr *attr)
{
	if (attr && attr->comp_mask)
		return EINVAL;
	Cq &cq = *Cq::from(ibcq);
	cq.lock.lock();
	if (cq.queue.empty()) {
		cq.lock.unlock();
		return ENOENT;
	}
	load_current(cq);
	return 0;
}

int ex_next_poll(struct ibv_cq_ex *ibcq)
{
	Cq &cq = *Cq::from(ibcq);
	if (cq.queue.empty())
		return ENOENT;
	load_current(cq);
	return 0;
}

void ex_end_poll(struct ibv_cq_ex *ibcq)
{
	Cq::from(ibcq)->lock.unlock();
}

const Completion &cur(struct ibv_cq_ex *ibcq) { return Cq::from(ibcq)->current; }

enum ibv_wc_opcode ex_read_opcode(struct ibv_cq_ex *c) { return cur(c).wc.opcode; }
uint32_t ex_read_vendor_err(struct ibv_cq_ex *c) { return cur(c).wc.vendor_err; }
uint32_t ex_read_byte_len(struct ibv_cq_ex *c) { return cur(c).wc.byte_len; }
__be32 ex_read_imm_data(struct ibv_cq_ex *c) { return cur(c).wc.imm_data; }
uint32_t ex_read_qp_num(struct ibv_cq_ex *c) { return cur(c).wc.qp_num; }
uint32_t ex_read_src_qp(struct ibv_cq_ex *c) { return cur(c).wc.src_qp; }
unsigned int ex_read_wc_flags(struct ibv_cq_ex *c) { return cur(c).wc.wc_flags; }
uint32_t ex_read_slid(struct ibv_cq_ex *c) { return cur(c).wc.slid; }
uint8_t ex_read_sl(struct ibv_cq_ex *c) { return cur(c).wc.sl; }
uint8_t ex_read_dlid_path_bits(struct ibv_cq_ex *c) { return cur(c).wc.dlid_path_bits; }
uint64_t ex_read_completion_ts(struct ibv_cq_ex *c) { return cur(c).timestamp_ns; }
uint64_t ex_read_wallclock_ns(struct ibv_cq_ex *c) { return cur(c).wallclock_ns; }
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
		{
			std::lock_guard guard(ch.lock);
			if (!ch.pending.empty()) {
				Cq *cq = ch.pending.front();
				ch.pending.pop_front();
				uint64_t token;
				/* Present by the invariant: cannot block. */
				[[maybe_unused]] ssize_t n = ::read(ch.ibv.fd, &token, sizeof(token));
				pthread_mutex_lock(&cq->ibv.cq.mutex);
				cq->comp_events_reported++;
				pthread_mutex_unlock(&cq->ibv.cq.mutex);
				out = cq;
				return 0;
			}
		}
		/* Nothing queued: behave as read() on the uverbs channel fd
		 * does, according to the O_NONBLOCK flag the application may
		 * have set. Sleeping in poll() instead of read() keeps every
		 * token consumption under the lock. */
		int fl = fcntl(ch.ibv.fd, F_GETFL);
		if (fl < 0)
			return errno;
		if (fl & O_NONBLOCK)
			return EAGAIN;
		struct pollfd p = {ch.ibv.fd, POLLIN, 0};
		if (::poll(&p, 1, -1) < 0 && errno != EINTR)
			return errno;
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
	/* IBV_CQ_INIT_ATTR_MASK_PD names a parent domain; libmlx5 refuses
	 * anything else with EINVAL, and this emulation has no parent
	 * domains (ibv_alloc_parent_domain() fails with EOPNOTSUPP). */
	if (attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD)
		return Err{EINVAL};
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

	auto *cq = new (std::nothrow) Cq{};
	if (!cq)
		return Err{ENOMEM};
	cq->ctx = &ctx;
	cq->channel = attr.channel ? CompChannel::from(attr.channel) : nullptr;
	cq->wc_flags = attr.wc_flags;
	cq->extended = extended;
	cq->create_flags = (attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr.flags : 0;
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
	}
	ctx.add_event_source(cq, &cq->async_events);
	return cq;
}

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
	/* The device refuses to shrink below the completions it holds;
	 * those it holds move to the resized CQ in order. */
	if (cq.queue.size() > granted)
		return EINVAL;
	cq.ibv.cq.cqe = static_cast<int>(granted);
	return 0;
}

int destroy_cq(Cq &cq)
{
	if (cq.uses.busy())
		return EBUSY;

	/* From here on the CQ is gone for the device: undelivered events
	 * are withdrawn from the channel (with their tokens, keeping the
	 * channel's invariant), as uverbs drops unread events of a CQ. */
	if (CompChannel *ch = cq.channel) {
		std::lock_guard guard(ch->lock);
		cq.detached = true;
		for (auto it = ch->pending.begin(); it != ch->pending.end();) {
			if (*it != &cq) {
				++it;
				continue;
			}
			it = ch->pending.erase(it);
			uint64_t token;
			[[maybe_unused]] ssize_t n = ::read(ch->ibv.fd, &token, sizeof(token));
		}
	}

	/* Events already handed to the application must be acknowledged
	 * first (ibv_get_cq_event(3)), and so must its async events. */
	pthread_mutex_lock(&cq.ibv.cq.mutex);
	while (cq.ibv.cq.comp_events_completed < cq.comp_events_reported)
		pthread_cond_wait(&cq.ibv.cq.cond, &cq.ibv.cq.mutex);
	pthread_mutex_unlock(&cq.ibv.cq.mutex);
	cq.async_events.wait_all_acked();
	cq.ctx->remove_event_source(&cq);

	if (CompChannel *ch = cq.channel) {
		pthread_mutex_lock(&cq.ctx->abi()->mutex);
		ch->ibv.refcnt--;
		pthread_mutex_unlock(&cq.ctx->abi()->mutex);
	}
	pthread_cond_destroy(&cq.ibv.cq.cond);
	pthread_mutex_destroy(&cq.ibv.cq.mutex);
	delete &cq;
	return 0;
}

int poll_cq(Cq &cq, int num_entries, struct ibv_wc *wc)
{
	if (num_entries <= 0)
		return 0;
	if (!wc)
		return -EINVAL;
	std::lock_guard guard(cq.lock);
	int n = 0;
	while (n < num_entries && !cq.queue.empty())
		wc[n++] = pop_completion(cq).wc;
	return n;
}

int req_notify_cq(Cq &cq, int solicited_only)
{
	bool fire;
	{
		std::lock_guard guard(cq.arm_lock);
		cq.arm = solicited_only ? CqArm::Solicited : CqArm::Next;
		/* The arm doorbell carries the consumer index: completions
		 * that are already there and not yet polled raise the event
		 * at once, as on ConnectX. */
		fire = solicited_only ? cq.unpolled_solicited.load() > 0 : cq.unpolled.load() > 0;
		if (fire)
			cq.arm = CqArm::None;
	}
	if (fire)
		raise_completion_event(cq);
	return 0;
}

int modify_cq(Cq &cq, const struct ibv_modify_cq_attr &attr)
{
	/* librxe has no modify_cq: libibverbs' default answers. */
	if (is_rxe(*cq.ctx))
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

int deliver_completion(Cq &cq, const Completion &c)
{
	bool overrun_now = false;
	bool dropped = false;
	{
		std::lock_guard guard(cq.lock);
		if (cq.overrun) {
			dropped = true; /* an overrun CQ is in error for good */
		} else if (cq.queue.size() >= uint32_t(cq.ibv.cq.cqe)) {
			dropped = true;
			if (!(cq.create_flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) && !cq.overrun) {
				cq.overrun = true;
				overrun_now = true;
			}
		} else {
			cq.queue.push_back(c);
			cq.unpolled.fetch_add(1, std::memory_order_relaxed);
			if (counts_as_solicited(c))
				cq.unpolled_solicited.fetch_add(1, std::memory_order_relaxed);
		}
	}
	if (overrun_now) {
		struct ibv_async_event ev{};
		ev.element.cq = cq.abi();
		ev.event_type = IBV_EVENT_CQ_ERR;
		cq.ctx->post_async_event(ev);
	}
	if (dropped)
		return ENOSPC;

	bool fire;
	{
		std::lock_guard guard(cq.arm_lock);
		fire = wakes(cq.arm, c);
		if (fire)
			cq.arm = CqArm::None;
	}
	if (fire)
		raise_completion_event(cq);
	return 0;
}

} // namespace shmverbs
