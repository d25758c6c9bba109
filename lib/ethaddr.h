/* SPDX-License-Identifier: MIT */
/*
 * ibv_resolve_eth_l2_from_gid() for the emulated RoCE fabric.
 *
 * rdma-core asks the kernel's neighbour table for the MAC of a destination
 * GID, except for addresses whose MAC is encoded in the address itself
 * (IPv4 and IPv6 multicast, IPv6 link-local). The emulated ports have no
 * network interface, so their neighbour table is the emulated fabric: a
 * unicast GID resolves when some emulated port owns it, to the MAC that the
 * port's link-local GID encodes.
 */
#pragma once

#include "context.h"

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <optional>

namespace shmverbs {

using MacAddress = std::array<uint8_t, 6>;

/* The MAC an address encodes (multicast or link-local), if any. */
std::optional<MacAddress> encoded_mac(const union ibv_gid &gid);

/* 0 with mac (and vid 0xffff: no VLAN), or a positive errno:
 * EINVAL when sgid is not a RoCE address of port_num of this context (the
 * kernel would find no interface to send from), EHOSTUNREACH when no
 * emulated port owns the unicast dgid. */
int resolve_eth_l2(Context &ctx, uint8_t port_num, const union ibv_gid &sgid,
		   const union ibv_gid &dgid, MacAddress &mac, uint16_t &vid);

} // namespace shmverbs
