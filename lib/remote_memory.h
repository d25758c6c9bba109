/* SPDX-License-Identifier: MIT */
/*
 * Access to memory another QP's owner registered: the one interface through
 * which the data path reads, writes and atomically updates target memory.
 *
 * The target chooses per MR how peers reach its memory (KeyEntry::path in its
 * key table, which lives in its shared segment):
 *   MemPath::Cma     process_vm_writev/readv by the owner's pid; atomics are
 *                    read-modify-write under an OFD byte-range lock on the
 *                    target's segment file (the kernel drops it if the holder
 *                    dies), so they are atomic against each other;
 *   MemPath::Shared  the memshare fast path (lib/memshare, another helper):
 *                    the pages are a shared file, offset == VA; initiators map
 *                    it and use memcpy and CPU atomics.
 * A target in this very process is reached directly (memcpy) whatever the
 * path, except atomics on a Cma MR, which take the same lock as remote ones.
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

/* The implementation to use for an MR of a peer (or of this process). */
RemoteMemory &remote_memory_for(const PeerSegment &peer, const KeyEntry &mr);

/* Installs the implementation of a path (memshare registers MemPath::Shared
 * at load). Until one is installed, a Shared MR falls back to CMA. */
void register_remote_memory(MemPath path, RemoteMemory *impl);

/* Forces the CMA path for every MR ($SHMVERBS_FORCE_CMA=1; for tests). */
bool force_cma();

} // namespace shmverbs
