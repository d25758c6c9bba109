/* SPDX-License-Identifier: MIT */
#include "ethaddr.h"

#include <algorithm>
#include <cstring>

namespace shmverbs {

namespace {

bool is_v4_mapped(const union ibv_gid &g)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	/* ff0e::ffff:a.b.c.d is how an IPv4 multicast group is written as a GID. */
	static const uint8_t mcast[12] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !std::memcmp(g.raw, mapped, 12) || !std::memcmp(g.raw, mcast, 12);
}

bool is_zero(const union ibv_gid &g)
{
	return std::all_of(std::begin(g.raw), std::end(g.raw), [](uint8_t b) { return b == 0; });
}

} // namespace

std::optional<MacAddress> encoded_mac(const union ibv_gid &g)
{
	if (is_v4_mapped(g)) {
		/* IPv4 multicast 224.0.0.0/4: 01:00:5e + the low 23 bits. */
		if ((g.raw[12] & 0xf0) != 0xe0)
			return std::nullopt;
		return MacAddress{0x01, 0x00, 0x5e, uint8_t(g.raw[13] & 0x7f), g.raw[14], g.raw[15]};
	}
	if (g.raw[0] == 0xff) /* IPv6 multicast: 33:33 + the low 32 bits. */
		return MacAddress{0x33, 0x33, g.raw[12], g.raw[13], g.raw[14], g.raw[15]};
	static const uint8_t link_local[8] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0};
	if (!std::memcmp(g.raw, link_local, 8)) {
		/* EUI-64 interface id back to the MAC: drop the middle two bytes
		 * and flip the universal/local bit. */
		return MacAddress{uint8_t(g.raw[8] ^ 0x02), g.raw[9], g.raw[10],
				  g.raw[13], g.raw[14], g.raw[15]};
	}
	return std::nullopt;
}

int resolve_eth_l2(Context &ctx, uint8_t port_num, const union ibv_gid &sgid,
		   const union ibv_gid &dgid, MacAddress &mac, uint16_t &vid)
{
	const Port *port = ctx.device->port(port_num);
	if (!port || port->attr.link_layer != IBV_LINK_LAYER_ETHERNET || is_zero(sgid))
		return EINVAL;
	bool source_is_ours = std::any_of(port->gids.begin(), port->gids.end(), [&](const GidEntry &e) {
		return e.valid && !std::memcmp(e.gid.raw, sgid.raw, sizeof(sgid.raw));
	});
	if (!source_is_ours)
		return EINVAL;

	vid = 0xffff; /* the emulated interfaces carry no VLAN */
	if (auto m = encoded_mac(dgid)) {
		mac = *m;
		return 0;
	}
	/* The emulated fabric is the neighbour table. */
	for (Device *dev : devices()) {
		for (const Port &p : dev->ports) {
			if (p.attr.link_layer != IBV_LINK_LAYER_ETHERNET || p.gids.empty())
				continue;
			for (const GidEntry &e : p.gids) {
				if (!e.valid || std::memcmp(e.gid.raw, dgid.raw, sizeof(dgid.raw)))
					continue;
				auto m = encoded_mac(p.gids[0].gid);
				if (!m)
					return EHOSTUNREACH;
				mac = *m;
				return 0;
			}
		}
	}
	return EHOSTUNREACH;
}

} // namespace shmverbs
