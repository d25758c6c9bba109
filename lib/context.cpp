/* SPDX-License-Identifier: MIT */
#include "context.h"
#include "mr.h"
#include "log.h"
#include "fork.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <mutex>
#include <set>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Context>, "ibv_context* is converted back with offsetof");

namespace {

thread_local bool refused_inherited = false;
void (*inherited_hook)(Context &) = nullptr;

/* Open contexts, for the fork() child handler. Never freed. */
struct OpenContexts {
	std::mutex lock;
	std::set<Context *> all;
};
OpenContexts *&open_contexts()
{
	static OpenContexts *o = new OpenContexts;
	return o;
}

} // namespace

Context *to_context(struct ibv_context *ctx)
{
	refused_inherited = false;
	if (!ctx || !to_device(ctx->device))
		return nullptr;
	Context *c = Context::from(ctx);
	if (c->inherited.load(std::memory_order_relaxed)) {
		static std::once_flag logged;
		std::call_once(logged, [] {
			log_error("process %d: a verbs object of its parent used after fork(); "
				  "open the device again in the child (EIO)", int(getpid()));
		});
		refused_inherited = true;
		return nullptr;
	}
	return c;
}

bool inherited_context_refused() { return refused_inherited; }

void set_inherited_context_hook(void (*hook)(Context &)) { inherited_hook = hook; }

void fork_child::contexts()
{
	OpenContexts *old = open_contexts();
	/* Single-threaded here; the old lock may have been held at fork(). */
	for (Context *c : old->all) {
		c->inherited.store(true);
		if (inherited_hook)
			inherited_hook(*c);
	}
	open_contexts() = new OpenContexts;
}

namespace {

/* The object an event names, or nullptr for port and device events. */
const void *event_object(const struct ibv_async_event &e)
{
	switch (e.event_type) {
	case IBV_EVENT_CQ_ERR:
		return e.element.cq;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return e.element.qp;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return e.element.srq;
	case IBV_EVENT_WQ_FATAL:
		return e.element.wq;
	default:
		return nullptr;
	}
}

/* The context of the object an event names, via the ABI struct's ->context. */
struct ibv_context *event_context(const struct ibv_async_event &e)
{
	switch (e.event_type) {
	case IBV_EVENT_CQ_ERR:
		return e.element.cq ? e.element.cq->context : nullptr;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return e.element.srq ? e.element.srq->context : nullptr;
	case IBV_EVENT_WQ_FATAL:
		return e.element.wq ? e.element.wq->context : nullptr;
	default:
		break;
	}
	if (event_object(e))
		return e.element.qp->context;
	return nullptr;
}

} // namespace

void Context::add_event_source(const void *object, AsyncEventCounter *counter)
{
	std::lock_guard guard(event_lock);
	event_sources[object] = counter;
}

void Context::remove_event_source(const void *object)
{
	std::lock_guard guard(event_lock);
	event_sources.erase(object);
}

bool ack_async_event(const struct ibv_async_event &event)
{
	const void *object = event_object(event);
	if (!object)
		return true; /* port and device events need no acknowledgement */
	Context *ctx = to_context(event_context(event));
	if (!ctx)
		return false;
	AsyncEventCounter *counter = nullptr;
	{
		std::lock_guard guard(ctx->event_lock);
		auto it = ctx->event_sources.find(object);
		if (it != ctx->event_sources.end())
			counter = it->second;
	}
	if (counter)
		counter->ack();
	return true;
}

void Context::post_async_event(const struct ibv_async_event &event)
{
	{
		std::lock_guard guard(event_lock);
		events.push_back(event);
	}
	uint64_t one = 1;
	/* A semaphore eventfd cannot overflow at our rates; a failed write
	 * would only mean the counter is already saturated. */
	[[maybe_unused]] ssize_t n = ::write(vctx.context.async_fd, &one, sizeof(one));
}

void Context::post_async_event_if_open(Context *ctx, const struct ibv_async_event &event)
{
	/* close_context() leaves the set under this lock before it frees. */
	OpenContexts &o = *open_contexts();
	std::lock_guard guard(o.lock);
	if (o.all.count(ctx))
		ctx->post_async_event(event);
}

int Context::get_async_event(struct ibv_async_event &event)
{
	uint64_t token;
	/* One read consumes one queued event (EFD_SEMAPHORE); it blocks or
	 * fails with EAGAIN according to the O_NONBLOCK flag the application
	 * may have set on async_fd, and a signal interrupts it as it does the
	 * read of the uverbs fd (EINTR, or restarted under SA_RESTART). A
	 * token whose event was dropped (its object was destroyed unread) is
	 * skipped. */
	for (;;) {
		ssize_t n = ::read(vctx.context.async_fd, &token, sizeof(token));
		if (n != sizeof(token))
			return n < 0 ? errno : EIO;
		std::lock_guard guard(event_lock);
		if (events.empty())
			continue;
		event = events.front();
		events.pop_front();
		if (const void *object = event_object(event)) {
			auto it = event_sources.find(object);
			if (it != event_sources.end())
				it->second->report();
		}
		return 0;
	}
}

void Context::drop_queued_events(const void *object)
{
	std::lock_guard guard(event_lock);
	const size_t dropped = std::erase_if(events, [object](const struct ibv_async_event &e) {
		return event_object(e) == object;
	});
	/* Their tokens go too, so that async_fd does not poll readable with
	 * nothing to read (an application that polls and then blocks in
	 * ibv_get_async_event() would wait for the next event). Tokens stand
	 * for no event in particular; one a reader already took finds no
	 * event and that reader waits for the next one, as it should. Never
	 * a blocking read, whatever the application made of the fd: with no
	 * RWF_NOWAIT (a kernel without it for eventfds), the tokens stay and
	 * get_async_event() skips them. */
	uint64_t token;
	struct iovec iov = {&token, sizeof(token)};
	for (size_t i = 0; i < dropped; i++)
		if (::preadv2(vctx.context.async_fd, &iov, 1, -1, RWF_NOWAIT) != sizeof(token))
			break;
}

void AsyncEventCounter::report()
{
	std::lock_guard guard(lock);
	reported++;
}

void AsyncEventCounter::ack()
{
	std::lock_guard guard(lock);
	completed++;
	acked.notify_all();
}

void AsyncEventCounter::wait_all_acked()
{
	std::unique_lock guard(lock);
	acked.wait(guard, [this] { return completed == reported; });
}

namespace {

/* A ConnectX has one completion EQ per online CPU (mlx5_core asks for as
 * many interrupt vectors, within the device's), rxe one vector per
 * possible CPU: a CQ may name any of them. Nothing here depends on which. */
int comp_vectors()
{
	constexpr long device_vectors = 64;
	const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	return int(std::clamp(cpus, 1L, device_vectors));
}

} // namespace

Result<Context> open_context(Device &dev)
{
	auto *ctx = new (std::nothrow) Context{};
	if (!ctx)
		return Err{ENOMEM};
	struct ibv_context &c = ctx->vctx.context;
	c.device = &dev.ibv;
	c.abi_compat = __VERBS_ABI_IS_EXTENDED;
	c.num_comp_vectors = comp_vectors();
	ctx->vctx.sz = sizeof(ctx->vctx);
	ctx->device = &dev;
	pthread_mutex_init(&c.mutex, nullptr);
	install_fork_child_handler();

	c.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	/* cmd_fd stands for the uverbs command fd; programs only pass it to
	 * ibv_import_device() or poll it, so an idle eventfd serves. */
	c.cmd_fd = eventfd(0, EFD_CLOEXEC);
	if (c.async_fd < 0 || c.cmd_fd < 0) {
		int err = errno;
		if (c.async_fd >= 0)
			::close(c.async_fd);
		if (c.cmd_fd >= 0)
			::close(c.cmd_fd);
		delete ctx;
		return Err{err};
	}
	{
		OpenContexts &o = *open_contexts();
		std::lock_guard guard(o.lock);
		o.all.insert(ctx);
	}
	return ctx;
}

int close_context(Context &ctx)
{
	{
		OpenContexts &o = *open_contexts();
		std::lock_guard guard(o.lock);
		o.all.erase(&ctx);
	}
	::close(ctx.vctx.context.async_fd);
	::close(ctx.vctx.context.cmd_fd);
	pthread_mutex_destroy(&ctx.vctx.context.mutex);
	delete &ctx;
	return 0;
}

int query_device(Context &ctx, struct ibv_device_attr &attr)
{
	attr = ctx.device->device_attr();
	return 0;
}

int query_device_ex(Context &ctx, const struct ibv_query_device_ex_input *input,
		    struct ibv_device_attr_ex *attr, size_t attr_size)
{
	if (!attr || (input && input->comp_mask))
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;

	struct ibv_device_attr_ex full{};
	full.orig_attr = ctx.device->device_attr();
	full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
	full.max_dm_size = ctx.device->profile->max_dm_size();
	full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
	full.cq_mod_caps.max_cq_count = 0xffff;
	full.cq_mod_caps.max_cq_period = 0xfff;
	/* A 1 GHz free-running clock: completion timestamps are nanoseconds. */
	full.hca_core_clock = 1000000;
	full.completion_timestamp_mask = 0x7fffffffffffffffull; /* mlx5_ib's */
	full.max_wq_type_rq = 0;
	full.odp_caps = odp_caps(*ctx.device, full.xrc_odp_caps);

	std::memset(attr, 0, attr_size);
	std::memcpy(attr, &full, std::min(attr_size, sizeof(full)));
	return 0;
}

int query_port(Context &ctx, uint8_t port_num, struct ibv_port_attr *attr, size_t attr_len)
{
	const Port *port = ctx.device->port(port_num);
	if (!port || !attr)
		return EINVAL;
	std::memset(attr, 0, attr_len);
	std::memcpy(attr, &port->attr, std::min(attr_len, sizeof(port->attr)));
	return 0;
}

namespace {

const GidEntry *gid_at(Context &ctx, uint32_t port_num, uint32_t index, int &err)
{
	const Port *port = port_num <= 0xff ? ctx.device->port(static_cast<uint8_t>(port_num))
					    : nullptr;
	if (!port || index >= port->gids.size()) {
		err = EINVAL;
		return nullptr;
	}
	err = 0;
	return &port->gids[index];
}

void fill_gid_entry(const GidEntry &g, uint32_t port_num, uint32_t index,
		    struct ibv_gid_entry &out)
{
	out = {};
	out.gid = g.gid;
	out.gid_index = index;
	out.port_num = port_num;
	out.gid_type = g.gid_type;
	out.ndev_ifindex = 0;
}

} // namespace

int query_gid(Context &ctx, uint8_t port_num, int index, union ibv_gid &gid)
{
	int err;
	if (index < 0)
		return EINVAL;
	const GidEntry *g = gid_at(ctx, port_num, static_cast<uint32_t>(index), err);
	if (!g)
		return err;
	if (g->valid)
		gid = g->gid;
	else
		std::memset(&gid, 0, sizeof(gid));
	return 0;
}

int query_gid_ex(Context &ctx, uint32_t port_num, uint32_t gid_index,
		 struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	/* Flags: none defined, EINVAL as from the kernel's ioctl
	 * (uverbs_get_flags32); EOPNOTSUPP is rdma-core's answer only on
	 * kernels without it (before 5.10). */
	if (!entry || flags)
		return EINVAL;
	if (entry_size < sizeof(struct ibv_gid_entry))
		return EINVAL;
	int err;
	const GidEntry *g = gid_at(ctx, port_num, gid_index, err);
	if (!g)
		return err;
	if (!g->valid)
		return ENODATA;
	fill_gid_entry(*g, port_num, gid_index, *entry);
	return 0;
}

ssize_t query_gid_table(Context &ctx, struct ibv_gid_entry *entries, size_t max_entries,
			uint32_t flags, size_t entry_size)
{
	if (flags)
		return -EINVAL; /* as query_gid_ex() */
	if (entry_size < sizeof(struct ibv_gid_entry) || (!entries && max_entries))
		return -EINVAL;
	size_t n = 0;
	for (const Port &port : ctx.device->ports) {
		for (uint32_t i = 0; i < port.gids.size(); i++) {
			if (!port.gids[i].valid)
				continue;
			if (n == max_entries)
				return -EINVAL;
			auto *out = reinterpret_cast<struct ibv_gid_entry *>(
				reinterpret_cast<char *>(entries) + n * entry_size);
			fill_gid_entry(port.gids[i], port.port_num, i, *out);
			n++;
		}
	}
	return static_cast<ssize_t>(n);
}

int query_gid_type(Context &ctx, uint8_t port_num, unsigned index, enum ibv_gid_type &type)
{
	int err;
	const GidEntry *g = gid_at(ctx, port_num, index, err);
	if (!g)
		return err;
	type = g->valid ? g->gid_type : IBV_GID_TYPE_IB;
	return 0;
}

/* ENOENT for a port or index the device does not have: libibverbs reads
 * the entry from sysfs (ports/N/pkeys/I), which has no such file. */
int query_pkey(Context &ctx, uint8_t port_num, int index, __be16 &pkey)
{
	const Port *port = ctx.device->port(port_num);
	if (!port || index < 0 || size_t(index) >= port->pkeys.size())
		return ENOENT;
	pkey = htobe16(port->pkeys[index]);
	return 0;
}

/* libibverbs queries index 0, 1, ... until the query fails: no such port,
 * or the P_Key not in the table, is that failure, ENOENT. */
int get_pkey_index(Context &ctx, uint8_t port_num, __be16 pkey)
{
	const Port *port = ctx.device->port(port_num);
	if (!port)
		return -ENOENT;
	uint16_t want = be16toh(pkey);
	for (size_t i = 0; i < port->pkeys.size(); i++)
		if (port->pkeys[i] == want)
			return static_cast<int>(i);
	return -ENOENT;
}

} // namespace shmverbs
