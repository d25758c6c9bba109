/* SPDX-License-Identifier: MIT */
/*
 * The target side of remote memory access: how a registered range becomes
 * reachable by peers, chosen once per registration.
 *
 * ibv_reg_mr calls mr_memory_attach() after validating the range and before
 * publishing the key, and records the returned path in the key entry, where
 * every initiator reads it (so all initiators of one MR use the same path,
 * which keeps RDMA atomics on it atomic against each other):
 *   MemPath::Shared  memshare switched the pages to the process's memory
 *                    file; its fd is attached to every object this process
 *                    publishes with the broker (slot kMemoryFileSlot) before
 *                    the key becomes visible;
 *   MemPath::Cma     process_vm_writev/readv (the pages stay private);
 *   MemPath::Bounce  the process's bounce server (created on the first such
 *                    MR; its fd goes to slot kBounceSlot) serves requests,
 *                    and only inside live Bounce MRs with the right access.
 * ibv_dereg_mr calls mr_memory_detach() once the key is withdrawn and no
 * operation holds it any more.
 *
 * The choice follows SHMVERBS_MEMORY_PATH (memshare::policy()): auto gives
 * Shared where the pages can be switched, else CMA if cma_available(), else
 * Bounce.
 */
#pragma once

#include "mr.h"

#include <cstdint>

namespace shmverbs {

/* Broker fd slots of every published object (slot 0 is the CQ channel). */
constexpr uint32_t kMemoryFileSlot = 1;
constexpr uint32_t kBounceSlot = 2;

/* Makes [addr, addr + length) reachable and returns the path peers must use.
 * Never fails: Bounce works on any memory. */
MemPath mr_memory_attach(uint64_t addr, uint64_t length, uint32_t access);

/* Undoes mr_memory_attach() for the same arguments and its result. */
void mr_memory_detach(uint64_t addr, uint64_t length, uint32_t access, MemPath path);

/* The bounce server's check: [addr, addr + len) lies in one live Bounce
 * registration that allows it (write: LOCAL_WRITE, which every remote
 * write, atomic and receive placement needs; read: REMOTE_READ). `odp`:
 * whether that registration is an ODP MR (its pages may be absent). */
bool bounce_range_allowed(uint64_t addr, uint64_t len, bool write, bool *odp = nullptr);

} // namespace shmverbs
