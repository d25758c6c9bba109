/* SPDX-License-Identifier: MIT */
/* Device discovery and queries through the C ABI of the drop-in library. */
#include <infiniband/verbs.h>
#include <shmverbs/shmverbs.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <string>

TEST_CASE("ibv_get_device_list lists shm0", "[device]")
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE(list != nullptr);
	REQUIRE(n == 1);
	CHECK(std::string(ibv_get_device_name(list[0])) == "shm0");
	CHECK(list[1] == nullptr);
	CHECK(ibv_get_device_guid(list[0]) != 0);
	CHECK(ibv_get_device_index(list[0]) == 0);
	ibv_free_device_list(list);
}

TEST_CASE("open, query and close the emulated device", "[device]")
{
	struct ibv_device **list = ibv_get_device_list(nullptr);
	REQUIRE(list);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	REQUIRE(ctx);
	CHECK(shmverbs_is_emulated(ctx) == 1);

	struct ibv_device_attr attr;
	REQUIRE(ibv_query_device(ctx, &attr) == 0);
	CHECK(attr.vendor_id == 0x02c9);
	CHECK(attr.vendor_part_id == 4119);
	CHECK(attr.phys_port_cnt == 1);
	CHECK(attr.max_qp_wr == 32768);

	struct ibv_port_attr port;
	REQUIRE(ibv_query_port(ctx, 1, &port) == 0);
	CHECK(port.state == IBV_PORT_ACTIVE);
	CHECK(port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	CHECK(port.lid != 0);
	CHECK(port.active_mtu == IBV_MTU_4096);
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL);
	CHECK(ibv_query_port(ctx, 0, &port) == EINVAL);

	union ibv_gid gid;
	REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(gid.global.subnet_prefix == htobe64(0xfe80000000000000ull));
	CHECK(gid.global.interface_id == ibv_get_device_guid(ctx->device));
	CHECK(ibv_query_gid(ctx, 1, 100000, &gid) == -1);

	__be16 pkey;
	REQUIRE(ibv_query_pkey(ctx, 1, 0, &pkey) == 0);
	CHECK(pkey == htobe16(0xffff));
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0);

	REQUIRE(ibv_close_device(ctx) == 0);
}
