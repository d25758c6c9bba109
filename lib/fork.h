/* SPDX-License-Identifier: MIT */
/*
 * fork() protection of registered memory: ibv_fork_init(),
 * ibv_dontfork_range() and ibv_dofork_range().
 *
 * A real HCA keeps DMA-ing into the physical pages it pinned, so a parent
 * that forks and then writes to a registered buffer would get a copy-on-write
 * page the HCA never sees. libibverbs therefore marks registered ranges
 * MADV_DONTFORK after ibv_fork_init(). Registrations overlap (two MRs on one
 * page), so each page carries a count of the registrations that cover it:
 * the first one advises DONTFORK, the last one to go advises DOFORK.
 *
 * The emulation itself needs none of this (it reaches memory through the
 * process's virtual addresses, never through pinned pages), which is why
 * ibv_is_fork_initialized() reports IBV_FORK_UNNEEDED, as rdma-core 44 does on
 * a kernel with copy-on-fork for pinned pages. The ranges are still tracked
 * and advised exactly as rdma-core does, because a program can observe them
 * (a child does not see DONTFORK pages) and may rely on that.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace shmverbs {

class ForkRanges {
public:
	/* madvise(2)-shaped: 0, or -1 with errno. Replaceable for tests. */
	using Advise = int (*)(void *addr, size_t length, int advice);
	/* The page size of the mapping that holds addr (huge-page aware). */
	using PageSizeOf = size_t (*)(const void *addr);

	ForkRanges(Advise advise, PageSizeOf page_size_of);

	/* ibv_fork_init(): 0, EINVAL when a range was already registered
	 * without protection (too late to start), ENOSYS when the kernel has
	 * no MADV_DONTFORK, ENOMEM. huge_pages is RDMAV_HUGEPAGES_SAFE. */
	int init(bool huge_pages);
	bool initialized() const;

	/* 0, or -1 with errno when an madvise failed (nothing changed then).
	 * Before init() they only remember that it is now too late. */
	int dontfork(void *base, size_t size);
	int dofork(void *base, size_t size);

	/* A CQ, QP or SRQ was created. libmlx5 marks each queue buffer and
	 * doorbell record it allocates with ibv_dontfork_range(), so before
	 * init() the first one makes init() too late (EINVAL), as a
	 * registration does. Our queues live in the segment: after init()
	 * there is nothing to advise. */
	void queue_created();

	/* How many registrations cover addr (for tests). */
	uint32_t count_at(uintptr_t addr) const;
	/* Number of stored segments, i.e. maximal runs of equal count. */
	size_t segments() const;

private:
	struct Segment {
		uintptr_t end; /* exclusive */
		uint32_t count;
	};

	/* [start, end) page-aligned around [base, base + size). */
	void page_bounds(void *base, size_t size, uintptr_t &start, uintptr_t &end) const;
	/* Splits the segment containing addr so that a segment starts there. */
	void split_at(uintptr_t addr);
	void merge_around(uintptr_t start, uintptr_t end);
	/* Adds delta to every page of [start, end); pages at 0 stay 0 when
	 * delta is negative. */
	void add(uintptr_t start, uintptr_t end, int delta);

	Advise advise_;
	PageSizeOf page_size_of_;
	mutable std::mutex lock_;
	bool initialized_ = false;
	bool too_late_ = false;
	bool huge_pages_ = false;
	size_t page_size_ = 0;
	/* Disjoint segments with count > 0, keyed by start. */
	std::map<uintptr_t, Segment> segments_;
};

/* The process-wide instance behind the exported verbs. */
ForkRanges &process_fork_ranges();

/* rdma-core's ibverbs_init() part: RDMAV_FORK_SAFE / IBV_FORK_SAFE (set and
 * not "0") call ibv_fork_init(), once, at the first ibv_get_device_list();
 * set later they do nothing, and after a registration the init fails (a
 * warning on stderr, as rdma-core prints). */
void apply_fork_env();

/* rdma-core's reading of a boolean environment variable: set and not "0". */
bool env_flag(const char *name);

/*
 * fork() without exec. The child has the parent's memory but none of its
 * threads, and what the parent shares with its peers (its segment, its
 * published objects) stays the parent's. The engine's child handler
 * (pthread_atfork, installed by the first open_context) therefore starts the
 * child afresh, in this order:
 *  - segments: the parent's segment is remapped MAP_PRIVATE in the child (so
 *    nothing the child does reaches the parent's shared state) and
 *    forgotten; the child makes its own on first use and registers it with
 *    its own broker connection (BrokerClient's own handler);
 *  - key tables, the progress thread's state, the peer caches, the bounce
 *    server and the published process fds: new ones, made on first use (the
 *    old ones are left as they are: a lock in them may have been held by a
 *    thread that does not exist in the child);
 *  - contexts: every context open at fork() is marked inherited; its ops
 *    tables fail with EIO and the exported verbs refuse it (EIO, logged
 *    once), so the parent's objects cannot be used in the child.
 * A child made with vfork() or posix_spawn() runs no handler and execs.
 */
void install_fork_child_handler();
/* How many fork()s this process went through as the child. */
uint32_t fork_generation();

/* The per-subsystem parts of the child handler (each in its own file). */
namespace fork_child {
void segments();      /* lib/segment.cpp */
void key_tables();    /* lib/mr.cpp */
void windows();       /* lib/mw.cpp */
void progress();      /* lib/progress.cpp */
void remote_memory(); /* lib/remote_memory.cpp */
void mr_memory();     /* lib/mr_memory.cpp */
void contexts();      /* lib/context.cpp */
void copy_helper();   /* lib/copy_helper.cpp */
} // namespace fork_child

} // namespace shmverbs
