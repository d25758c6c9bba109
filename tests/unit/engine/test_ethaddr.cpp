/* SPDX-License-Identifier: MIT */
/* The MAC addresses that multicast and link-local GIDs encode. */
#include "ethaddr.h"

#include <catch2/catch.hpp>

#include <cstring>

using shmverbs::encoded_mac;
using shmverbs::MacAddress;

namespace {

union ibv_gid gid(std::initializer_list<uint8_t> bytes)
{
	union ibv_gid g;
	std::memset(&g, 0, sizeof(g));
	size_t i = 0;
	for (uint8_t b : bytes)
		g.raw[i++] = b;
	return g;
}

} // namespace

TEST_CASE("encoded MACs", "[ethaddr]")
{
	struct {
		const char *what;
		union ibv_gid g;
		bool encoded;
		MacAddress mac;
	} cases[] = {
		{"IPv4 multicast", gid({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 224, 0x81, 2, 3}),
		 true, {0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
		{"IPv4 multicast written ff0e::ffff:a.b.c.d",
		 gid({0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3}), true,
		 {0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
		{"IPv4 unicast", gid({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}), false,
		 {}},
		{"IPv6 multicast", gid({0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa, 0xb, 0xc, 0xd}),
		 true, {0x33, 0x33, 0xa, 0xb, 0xc, 0xd}},
		{"link-local EUI-64",
		 gid({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}),
		 true, {0x00, 0x11, 0x22, 0x33, 0x44, 0x55}},
		{"global IPv6", gid({0x20, 0x01, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}), false,
		 {}},
	};
	for (auto &c : cases) {
		INFO(c.what);
		auto mac = encoded_mac(c.g);
		REQUIRE(mac.has_value() == c.encoded);
		if (c.encoded)
			CHECK(*mac == c.mac);
	}
}
