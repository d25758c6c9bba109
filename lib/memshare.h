/* SPDX-License-Identifier: MIT */
/*
 * Registered memory that other processes can reach without a system call per
 * operation.
 *
 * Each process owns one "memory file": a memfd with a huge sparse size in
 * which file offset == virtual address. share(addr, len) switches the pages
 * around [addr, addr + len) from private anonymous memory to a
 * MAP_SHARED|MAP_FIXED mapping of the memory file at offset == address, with
 * the same contents and protections. A peer that received the fd maps a window
 * of it (map_peer) and its loads, stores and CPU atomics then land directly
 * in the target's pages. unshare() switches the pages back to private memory
 * when the last registration covering them goes.
 *
 * Hazards and what holds (docs/architecture.md, "Registered memory"):
 * - a user-space write by another thread during a switch is never lost: the
 *   range is made read-only first and a SIGSEGV handler (chained to the one it
 *   replaced) makes the writer wait for the switch and retry;
 * - fork(): a child never shares the parent's registered pages; it gets a
 *   private copy of their fork-time contents (pthread_atfork handlers);
 * - overlapping registrations: pages are refcounted;
 * - memory that cannot be switched safely (file-backed, hugetlb, shared,
 *   read-only, the main stack, pages the application replaced) is reported
 *   not shareable, and the caller uses the fallback path: CMA (cma.h) or bounce
 *   buffers (bounce.h).
 *
 * Everything here is thread-safe. Functions return 0 or a positive errno
 * (engine convention) unless stated otherwise.
 */
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace shmverbs::memshare {

/* How an initiator reaches a registered range of this process. */
enum class Path : uint8_t {
	shared = 1, /* through a window of the memory file (map_peer) */
	cma = 2,    /* process_vm_writev/readv by pid (cma.h) */
	bounce = 3, /* bounce slots + target-side helper thread (bounce.h) */
};

/* SHMVERBS_MEMORY_PATH, read once per process:
 *   auto   (default) shared where possible, else cma if available, else bounce;
 *   shared shared where possible, else bounce (never CMA, as if it were blocked);
 *   cma    never shared: cma if available, else bounce;
 *   bounce always bounce.
 * An unknown value is reported once and treated as auto. */
enum class Policy : uint8_t { automatic, shared, cma, bounce };
Policy policy();

/* ---- Target side: called by the MR code at reg/dereg time ---- */

/* Makes the pages around [addr, addr + len) shareable (or takes one more
 * reference on pages that already are) and returns the path initiators must
 * use for this registration. Path::shared means the whole page-aligned range
 * is now mapped from memory_file_fd() at offset == address. Any other result
 * changed nothing and needs no unshare(). Never fails: the fallbacks work on
 * any memory. len 0 is treated as one byte (the page holding addr). */
Path share(void *addr, size_t len);

/* Drops the reference share() took when it returned Path::shared for exactly
 * this (addr, len). Pages whose last reference goes are switched back to
 * private anonymous memory with the same contents and protections, unless the
 * application has unmapped or replaced them meanwhile (they are then left
 * alone). The memory file's copy is released either way. */
void unshare(void *addr, size_t len);

/* The fd of this process's memory file (created on first use; O_RDWR,
 * close-on-exec, sealed against shrinking), or -1 with errno. Owned by this
 * module: do not close. Pass it to peers (through the broker). */
int memory_file_fd();

/* Registers the fork() handlers (done when the library loads, so they come
 * first). A child never inherits a shared mapping of ours: until the child
 * handler has run, its first touch of a registered range faults and puts the
 * child's private copy in place (lib/fork.h, docs/architecture.md). */
void install_fork_handlers();

/* How many share() references cover the page holding addr (for tests). */
uint32_t share_count_at(const void *addr);

/* Whether the page holding addr is currently mapped from our memory file at
 * offset == address (for tests and diagnostics). */
bool page_is_shared(const void *addr);

/* ---- Initiator side: windows onto a peer's memory file ---- */

/* A mapping of [va, va + len) of a peer's memory file into this process.
 * Move-only; releases its reference when destroyed. Windows are cached per
 * memory file (identified by device and inode of the fd) and shared between
 * holders: mapping a range already covered by a window reuses it. */
class PeerWindow {
public:
	PeerWindow() = default;
	PeerWindow(PeerWindow &&o) noexcept;
	PeerWindow &operator=(PeerWindow &&o) noexcept;
	PeerWindow(const PeerWindow &) = delete;
	PeerWindow &operator=(const PeerWindow &) = delete;
	~PeerWindow();

	explicit operator bool() const { return entry_ != nullptr; }
	/* Local address of the target's virtual address va, which must lie in
	 * the [va, va + len) the window was opened for. */
	void *at(uint64_t va) const { return reinterpret_cast<void *>(va + delta_); }
	void reset();

private:
	friend int map_peer(int fd, uint64_t va, size_t len, PeerWindow &out);
	void *entry_ = nullptr;
	uint64_t delta_ = 0; /* local address - target address */
};

/* Opens (or reuses) a window of the peer's memory file fd covering
 * [va, va + len). 0, or EINVAL (range outside the file, fd not a sealed
 * memory file), or an mmap errno. fd is not kept: it may be closed after. */
int map_peer(int fd, uint64_t va, size_t len, PeerWindow &out);

/* Unmaps every unused cached window of the memory file fd (a peer that went
 * away). Windows still held stay valid until released. */
void forget_peer(int fd);

/* Number of windows currently mapped (cached or in use), for tests. */
size_t peer_window_count();

} // namespace shmverbs::memshare
