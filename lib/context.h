/* SPDX-License-Identifier: MIT */
/*
 * An open device: struct verbs_context (which ends with the struct ibv_context
 * the application holds) plus the engine's per-context state. Every object
 * created on a context points back here through its ->context member, which
 * is how an exported verb tells our objects from a real provider's.
 */
#pragma once

#include "device.h"
#include "huge_pages.h"
#include "result.h"

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace shmverbs {

/* Counts the async events reported about one object (a QP, CQ, SRQ or the
 * port/device) against those the application acknowledged, so that destroy
 * can wait as ibv_destroy_qp(3) requires. */
struct AsyncEventCounter {
	std::mutex lock;
	std::condition_variable acked;
	uint32_t reported = 0;
	uint32_t completed = 0;

	void report();
	void ack();
	/* Blocks until every reported event has been acknowledged. */
	void wait_all_acked();
};

struct Context {
	struct verbs_context vctx; /* vctx.context is what the application holds */
	Device *device;
	/* Open in the parent of this (forked) process: refused (lib/fork.h). */
	std::atomic<bool> inherited{false};

	/* Asynchronous events: a queue plus a semaphore eventfd that is the
	 * context's async_fd, so the fd works with poll()/epoll and O_NONBLOCK
	 * exactly like the uverbs fd of a real device. */
	std::mutex event_lock;
	std::deque<struct ibv_async_event> events;
	/* QPs, CQs and SRQs that async events can name, with the counter
	 * their destroy waits on. Guarded by event_lock. */
	std::unordered_map<const void *, AsyncEventCounter *> event_sources;

	/* The huge pages its queues hold as libmlx5's would (huge_pages.h). */
	HugeChunks huge_chunks;

	struct ibv_context *abi() { return &vctx.context; }
	/* Inline: ibv_wr_complete() asks it once per post (the fork check). */
	static Context *from(struct ibv_context *ctx)
	{
		auto *vctx = reinterpret_cast<struct verbs_context *>(
			reinterpret_cast<char *>(ctx) - offsetof(struct verbs_context, context));
		return reinterpret_cast<Context *>(reinterpret_cast<char *>(vctx) -
						   offsetof(Context, vctx));
	}

	/* Queues an event for ibv_get_async_event(). */
	void post_async_event(const struct ibv_async_event &event);
	/* post_async_event() to `ctx` unless it was closed: an object the
	 * application left alive past ibv_close_device() (a QP, a CQ, an
	 * SRQ) can still raise events from the progress thread; the kernel
	 * would have destroyed it with the file. */
	static void post_async_event_if_open(Context *ctx, const struct ibv_async_event &event);

	void add_event_source(const void *object, AsyncEventCounter *counter);
	void remove_event_source(const void *object);
	/* Drops the queued, not yet read events that name the object: as with
	 * uverbs, an object's destroy discards what the application never got. */
	void drop_queued_events(const void *object);
	/* 0, or EAGAIN when the fd is non-blocking and nothing is queued. The
	 * event is counted on the object it names (as uverbs counts what it
	 * delivers), whose destroy then waits for the acknowledgement. */
	int get_async_event(struct ibv_async_event &event);
};

/* Our Context behind an ibv_context, or nullptr if a real provider owns it
 * or it was inherited from the parent of this forked process. */
Context *to_context(struct ibv_context *ctx);
/* Whether this thread's last to_context() refused an inherited context (the
 * verb then fails with EIO instead of forwarding the object). */
bool inherited_context_refused();
/* The provider's part of marking a context inherited (its ops tables). */
void set_inherited_context_hook(void (*hook)(Context &));


/* ibv_ack_async_event(): false when the event names an object we do not own. */
bool ack_async_event(const struct ibv_async_event &event);

Result<Context> open_context(Device &dev);
int close_context(Context &ctx);

int query_device(Context &ctx, struct ibv_device_attr &attr);
int query_device_ex(Context &ctx, const struct ibv_query_device_ex_input *input,
		    struct ibv_device_attr_ex *attr, size_t attr_size);
int query_port(Context &ctx, uint8_t port_num, struct ibv_port_attr *attr, size_t attr_len);
int query_gid(Context &ctx, uint8_t port_num, int index, union ibv_gid &gid);
int query_gid_ex(Context &ctx, uint32_t port_num, uint32_t gid_index,
		 struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
ssize_t query_gid_table(Context &ctx, struct ibv_gid_entry *entries, size_t max_entries,
			uint32_t flags, size_t entry_size);
int query_gid_type(Context &ctx, uint8_t port_num, unsigned index, enum ibv_gid_type &type);
int query_pkey(Context &ctx, uint8_t port_num, int index, __be16 &pkey);
int get_pkey_index(Context &ctx, uint8_t port_num, __be16 pkey);

} // namespace shmverbs
