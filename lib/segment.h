/* SPDX-License-Identifier: MIT */
/*
 * The per-process, per-device shared segment and the cache of peers'
 * segments (layouts: lib/shm_layout.h).
 *
 * Own segment. Made on first use: a memfd with a large sparse size (only
 * touched pages cost memory), mapped MAP_SHARED once for the life of the
 * process (never unmapped: peers' operations and our own threads may race
 * with exit). An in-process allocator hands out areas for QP descriptors,
 * receive queues and CQ rings; the device's key table lives in it too. The
 * segment is registered with the broker on the first publish; once the
 * broker is lost it is registered and everything republished again, at
 * once (republish_all(), from a thread of its own).
 *
 * Peer segments. resolve() asks the broker where a (device, kind, number)
 * lives, maps the owner's segment once per (pid, segment) and caches it.
 * A peer's mapping is never unmapped while the process runs (an operation in
 * another thread may be using it); PeerGone marks it gone so that operations
 * toward it fail fast.
 */
#pragma once

#include "broker_client.h"
#include "shm_layout.h"

#include <linux/futex.h>
#include <sys/types.h>

#include <cstddef>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace shmverbs {

struct Device;

class Segment {
public:
	/* The segment of this process for a device; created on first use, never
	 * freed. Aborts the process only if no memfd can be made at all. */
	static Segment &of(uint32_t device_index);

	/* An area of `bytes` (64-byte aligned, zeroed), or 0 when full. */
	uint64_t alloc(uint64_t bytes);
	/* Returns an area; the pages wholly inside it are released. */
	void free(uint64_t off, uint64_t bytes);

	template <typename T>
	T *at(uint64_t off) const { return reinterpret_cast<T *>(base_ + off); }
	uint64_t offset_of(const void *p) const { return uint64_t(static_cast<const char *>(p) - base_); }
	shm::SegmentHeader &header() const { return *reinterpret_cast<shm::SegmentHeader *>(base_); }
	int fd() const { return fd_; }
	uint32_t device() const { return device_; }

	/* Publishes an owned object at `off` (registers the segment first if
	 * needed). Remembered for republishing after a broker restart. */
	int publish(broker::ObjectKind kind, uint32_t id, uint64_t off);
	/* After BrokerLost: registers every segment that had objects
	 * published with the broker that replaces the lost one (starting it
	 * if need be) and publishes them again. */
	static void republish_all();
	/* Forgets a published object (its number is freed by the caller). */
	void withdraw(broker::ObjectKind kind, uint32_t id);
	/* Attaches an fd to an owned, published object (broker slot). */
	int attach_fd(broker::ObjectKind kind, uint32_t id, uint32_t slot, int fd);
	/* Attaches a process-wide fd (the memory file, the bounce file:
	 * lib/mr_memory.h) in `slot` of every object this process publishes,
	 * now and later, on every device, so that a peer reaching any of
	 * them can fetch it. 0 once every current object has it. */
	static int attach_process_fd(uint32_t slot, int fd);

	/* A second open file description of the memfd: OFD locks taken through
	 * it conflict with those of every other description (lib/remote_memory). */
	int lock_fd();

	static constexpr uint64_t default_size = 1ull << 32; /* apparent, sparse */

	/* In a forked child (lib/fork.h): maps this, the parent's, segment
	 * MAP_PRIVATE over itself, so that nothing the child does through the
	 * parent's objects reaches the parent's shared memory. */
	void privatize_in_child();

private:
	Segment(uint32_t device, int fd, char *base, uint64_t size);
	int ensure_registered_locked(uint64_t *handle);

	const uint32_t device_;
	const int fd_;
	char *const base_;
	const uint64_t size_;

	std::mutex lock_;
	uint64_t next_ = 0;            /* bump pointer */
	std::map<uint64_t, std::vector<uint64_t>> free_; /* size -> offsets */
	uint64_t broker_handle_ = 0;
	uint64_t broker_generation_ = 0;
	struct Published {
		broker::ObjectKind kind;
		uint32_t id;
		uint64_t off;
		int fds[broker::fd_slots];
	};
	std::vector<Published> published_;
	int lock_fd_ = -1;
};

/* A peer's segment as this process maps it. Unmapped, and its fds closed,
 * when the last reference goes: the peer cache drops its own on PeerGone,
 * an operation in progress keeps the mapping until it ends. */
struct PeerSegment {
	PeerSegment() = default;
	~PeerSegment();
	PeerSegment(const PeerSegment &) = delete;
	PeerSegment &operator=(const PeerSegment &) = delete;

	pid_t pid = 0;
	uint64_t handle = 0;       /* broker's segment handle */
	char *base = nullptr;
	uint64_t size = 0;
	int fd = -1;               /* kept open: the OFD lock file for atomics */
	int lock_fd = -1;          /* own open file description of it */
	bool local = false;        /* our own segment */
	std::atomic<bool> gone{false};
	/* The object last resolved in this segment, packed by pack_object():
	 * a live one to fetch the owner's process-wide fds through. */
	std::atomic<uint64_t> via{0};

	template <typename T>
	T *at(uint64_t off, uint64_t bytes = sizeof(T)) const
	{
		if (off > size || bytes > size - off)
			return nullptr;
		return reinterpret_cast<T *>(base + off);
	}
	/* The owner's death notice (shm_layout.h SegmentHeader::owner_alive),
	 * for a caller that keeps it (a CqTarget); nullptr for our own. */
	const int *owner_alive_word() const
	{
		return local ? nullptr
			     : reinterpret_cast<const int *>(
				       base + offsetof(shm::SegmentHeader, owner_alive));
	}
	/* Whether that word still names a live holder: one load, no system
	 * call. */
	static bool owner_alive(const int *word)
	{
		return !word || (__atomic_load_n(word, __ATOMIC_ACQUIRE) & FUTEX_TID_MASK) != 0;
	}
	/* Still alive: not reported gone and its owner-alive word still held
	 * (shm_layout.h): one load, no system call. */
	bool alive() const
	{
		if (local)
			return true;
		if (gone.load(std::memory_order_acquire))
			return false;
		return owner_alive(owner_alive_word());
	}
};

constexpr uint64_t pack_object(uint32_t device, broker::ObjectKind kind, uint32_t id)
{
	return uint64_t(device) << 40 | uint64_t(kind) << 32 | id;
}
constexpr BrokerObject unpack_object(uint64_t v)
{
	return {uint32_t(v >> 40), broker::ObjectKind(uint8_t(v >> 32)), uint32_t(v)};
}

/* Where a published object lives. */
struct PeerObject {
	std::shared_ptr<PeerSegment> seg;
	uint64_t off = 0;
};

/*
 * Resolves (device, kind, id) through the broker, mapping and caching the
 * owner's segment. Results are cached per object; `refresh` drops the cached
 * entry first (after the cached one turned out stale). Returns 0, ENOENT
 * (nothing published under that number), or the broker's error.
 */
int resolve_object(uint32_t device, broker::ObjectKind kind, uint32_t id, PeerObject &out,
		   bool refresh = false);

/*
 * A peer's completion-channel eventfd as the cache holds it. It converts to
 * the descriptor number (-1: none), and the descriptor stays open while any
 * ChannelFd of it lives: the cache closes its copy when the owner is gone
 * (PeerGone) or the object is forgotten, so use the returned value within
 * the expression that fetched it, e.g.
 *   write_token(fetch_channel_fd(...));   (lib/cq.cpp publish_with_channel())
 * where the temporary outlives the call.
 */
class ChannelFd {
public:
	struct Owned {
		Owned(int fd_, pid_t owner_) : fd(fd_), owner(owner_) {}
		~Owned();
		Owned(const Owned &) = delete;
		Owned &operator=(const Owned &) = delete;
		const int fd;
		const pid_t owner; /* the process that attached it */
	};
	ChannelFd() = default;
	explicit ChannelFd(std::shared_ptr<const Owned> fd) : fd_(std::move(fd)) {}
	operator int() const { return fd_ ? fd_->fd : -1; }

private:
	std::shared_ptr<const Owned> fd_;
};

/* The eventfd attached to (device, kind, id) slot 0 (a CQ channel), fetched
 * once and cached until its owner is gone; -1 when none. */
ChannelFd fetch_channel_fd(uint32_t device, broker::ObjectKind kind, uint32_t id);

/* Drops cached resolutions of an object (its owner destroyed it). */
void forget_object(uint32_t device, broker::ObjectKind kind, uint32_t id);

/* Scales data-path timers: $SHMVERBS_TIME_SCALE (default 1.0; 0.01 makes
 * RNR and retry timeouts 100x shorter). */
double time_scale();

} // namespace shmverbs
