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

#include <cstddef>
#include <cstdint>

namespace shmverbs {

/* A multicast GID as the kernel tells one (rdma_is_multicast_addr): an
 * IPv6 multicast address (ff00::/8), or an IPv4-mapped one
 * (::ffff:224.0.0.0/4), the MGIDs RoCE v2 groups of IPv4 take. */
inline bool is_multicast_gid(const union ibv_gid &gid)
{
	static constexpr uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (gid.raw[0] == 0xff)
		return true;
	for (size_t i = 0; i < sizeof(v4_mapped); i++)
		if (gid.raw[i] != v4_mapped[i])
			return false;
	return (gid.raw[12] & 0xf0) == 0xe0;
}

int mcast_join(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn);
void mcast_leave(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn);

} // namespace shmverbs
