/* SPDX-License-Identifier: MIT */
/*
 * Access to memory another QP's owner registered: the one interface through
 * which the data path reads, writes and atomically updates target memory.
 *
 * The target chooses per MR how peers reach its memory (KeyEntry::path in its
 * key table, which lives in its shared segment; lib/mr_memory.h), and every
 * initiator obeys it, so all RDMA atomics on one MR go the same way:
 *   MemPath::Shared  the pages are the target's memory file at offset == VA;
 *                    the initiator maps a window of it per MR (memshare::
 *                    map_peer, cached per peer) and uses memcpy and real CPU
 *                    atomics on the same physical pages, so they are atomic
 *                    against the target's own CPU atomics too;
 *   MemPath::Cma     process_vm_writev/readv by the owner's pid; atomics are
 *                    read-modify-write under an OFD byte-range lock on the
 *                    target's segment file (the kernel drops it if the holder
 *                    dies), so they are atomic against each other;
 *   MemPath::Bounce  requests to the target's bounce server (BounceClient,
 *                    cached per peer); atomics are CPU atomics executed by
 *                    the target's helper thread.
 * The memory file and bounce file fds are fetched from the broker once per
 * peer (through the object last resolved in its segment, which carries them
 * in slots kMemoryFileSlot/kBounceSlot) and dropped when the peer is gone.
 * A target in this very process is reached directly (memcpy, CPU atomics)
 * whatever the path, except atomics on a Cma MR, which take the same lock
 * as remote ones.
 *
 * Contracts for every implementation:
 *  - `addr` is the target's virtual address, already checked against the
 *    key's range and access by the caller, which holds the key (KeyRef) for
 *    the whole call, so a concurrent dereg_mr waits;
 *  - the local side is this process's memory (iovecs);
 *  - return 0, or EFAULT when the target's memory is not mapped (the caller
 *    reports an access error), or ESRCH when the target process is gone.
 */
#pragma once

#include "mr.h"
#include "segment.h"

#include <sys/uio.h>

#include <cstdint>
#include <memory>

namespace shmverbs {

enum class AtomicOp { CmpSwp, FetchAdd };

class RemoteMemory {
public:
	virtual ~RemoteMemory() = default;
	/* Copies the local iovecs, in order, to [addr, addr + total). */
	virtual int write(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			  const struct iovec *local, int count) = 0;
	/* Copies [addr, addr + total) into the local iovecs, in order. */
	virtual int read(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			 const struct iovec *local, int count) = 0;
	/* 8-byte atomic at addr (8-byte aligned): CmpSwp stores b if the value
	 * equals a; FetchAdd adds a. *old gets the value before. */
	virtual int atomic(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
			   AtomicOp op, uint64_t a, uint64_t b, uint64_t *old) = 0;
};

/*
 * A window onto a peer's memory file (MemPath::Shared) that the data path
 * may keep between operations. The file's offset is the target's virtual
 * address whatever MR covers it now, so the window serves any address in
 * [lo, hi) for as long as that process lives (the caller still checks and
 * holds the key of every access). `hold` keeps the mapping.
 */
struct SharedWindow {
	std::shared_ptr<const void> hold;
	pid_t pid = 0;
	uint64_t segment = 0; /* PeerSegment::handle */
	uint64_t lo = 0, hi = 0;
	uint64_t delta = 0;   /* local address - target address */

	bool covers(const PeerSegment &p, uint64_t addr, uint64_t len) const
	{
		return hold && pid == p.pid && segment == p.handle && addr >= lo && addr <= hi &&
		       len <= hi - addr;
	}
	char *at(uint64_t addr) const { return reinterpret_cast<char *>(addr + delta); }
};

/* A window covering the MR `mr` of `peer` (whose path is Shared): 0, or
 * the errno write() would return. */
int shared_window(const PeerSegment &peer, const KeyEntry &mr, SharedWindow &out);

/* The implementation to use for an MR of a peer (or of this process). */
RemoteMemory &remote_memory_for(const PeerSegment &peer, const KeyEntry &mr);

/* Drops what is cached about a process's memory (its fds, windows, bounce
 * client): it is gone (PeerGone). Operations still using them finish first. */
void forget_peer_memory(pid_t pid);

} // namespace shmverbs
