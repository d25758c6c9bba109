/* SPDX-License-Identifier: MIT */
/*
 * Cross Memory Attach (process_vm_writev/readv): the fallback for registered
 * memory that cannot be shared (memshare.h). One system call per operation
 * (~1.5 us here), fine for large transfers, 25x the floor for small ones.
 *
 * CMA is often blocked: seccomp (the default container profile without
 * CAP_SYS_PTRACE), Yama ptrace_scope >= 2. cma_available() probes once per
 * process, as libfabric and UCX do; the bounce path (bounce.h) takes over.
 */
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace shmverbs::memshare {

/* Whether CMA toward peers of the same user is expected to work: a
 * process_vm_readv on ourselves succeeds (seccomp, ENOSYS) and Yama allows
 * it. Probed on first call, then cached for the life of the process. Under
 * Yama ptrace_scope 1 the probe declares this process ptraceable by any
 * process of the same user (PR_SET_PTRACER_ANY), as libfabric's shm does, so
 * that peers can reach it. */
bool cma_available();

/* The uncached probe behind cma_available() (for tests). */
bool cma_probe();

/* Copies len bytes to/from remote_va in process pid, looping over partial
 * transfers. 0, or a positive errno: EPERM (blocked or not allowed), ESRCH
 * (no such process), EFAULT (range not mapped in the target), ENOSYS. */
int cma_write(pid_t pid, uint64_t remote_va, const void *src, size_t len);
int cma_read(pid_t pid, void *dst, uint64_t remote_va, size_t len);

/* Whether process_vm_readv on this very process works (only seccomp or a
 * kernel without CMA refuse it; Yama never does): what on-demand paging
 * needs (lib/mr.h, ODP). Probed once. */
bool cma_self_available();

/* A memcpy within this process that cannot fault: the kernel copies, so an
 * unmapped or write-protected page on either side is EFAULT instead of
 * SIGSEGV. 0 or a positive errno. One system call (ODP memory's accesses:
 * its pages may come and go under a registration). */
int copy_checked(void *dst, const void *src, size_t len);

/* Faults in, writable, the page holding the 8-byte word at `addr`
 * (madvise MADV_POPULATE_WRITE) before a CPU atomic on ODP memory: 0, or
 * EFAULT where it is not mapped or not writable. */
int fault_in_word(uint64_t addr);

} // namespace shmverbs::memshare
