/* SPDX-License-Identifier: MIT */
/*
 * UD specifics of the send engine (lib/ud.cpp): routing an address handle
 * to a device port, the GRH a receiver finds in its buffer, and multicast
 * group membership across processes.
 *
 * Multicast membership lives in the runtime directory (the broker's), one
 * empty-named entry per attached QP:
 *   <runtime>/mcast/<device>.<gid hex>.<lid>/<qpn>   content: owner pid
 * ibv_attach_mcast creates it, ibv_detach_mcast removes it. A sender lists
 * the group, resolves each QP through the broker (a dead owner's QPs no
 * longer resolve) and checks the pid, so a stale entry of a dead process is
 * skipped and removed. The broker's fixed 64-byte frames cannot carry a
 * member list; a directory listing can, with no lock anyone could hold.
 */
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace shmverbs {

int mcast_join(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn);
void mcast_leave(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn);

} // namespace shmverbs
