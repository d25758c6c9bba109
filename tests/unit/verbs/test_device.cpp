/* SPDX-License-Identifier: MIT */
/* Device discovery and queries through the C ABI of the drop-in library. */
#include <infiniband/verbs.h>
#include <shmverbs/shmverbs.h>

#include "../common/fixtures.h"

#include <catch2/catch.hpp>

#include <time.h>

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

/* ibv_query_gid_ex() and ibv_query_gid_table() as rdma-core 44 answers
 * them over the kernel's ioctl (Linux 5.10 on; Debian 12 runs 6.1): flags
 * are EINVAL (uverbs_get_flags32 allows none), an empty entry within the
 * table ENODATA, a table larger than the caller's array EINVAL (negative
 * from the table call). */
TEST_CASE("ibv_query_gid_ex and ibv_query_gid_table on InfiniBand", "[device][gid]")
{
	shmv_test::OpenDevice d;
	struct ibv_context *ctx = d.ctx;

	struct ibv_gid_entry e;
	std::memset(&e, 0xa5, sizeof(e));
	REQUIRE(ibv_query_gid_ex(ctx, 1, 0, &e, 0) == 0);
	union ibv_gid gid;
	REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(std::memcmp(&e.gid, &gid, sizeof(gid)) == 0);
	CHECK(e.gid_index == 0);
	CHECK(e.port_num == 1);
	CHECK(e.gid_type == IBV_GID_TYPE_IB);
	CHECK(e.ndev_ifindex == 0);

	CHECK(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == ENODATA); /* in the table, empty */
	CHECK(ibv_query_gid_ex(ctx, 1, 100000, &e, 0) == EINVAL);
	CHECK(ibv_query_gid_ex(ctx, 2, 0, &e, 0) == EINVAL);
	CHECK(ibv_query_gid_ex(ctx, 0, 0, &e, 0) == EINVAL);
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &e, 1) == EINVAL);

	struct ibv_gid_entry table[4];
	std::memset(table, 0, sizeof(table));
	REQUIRE(ibv_query_gid_table(ctx, table, 4, 0) == 1); /* only the valid ones */
	CHECK(std::memcmp(&table[0].gid, &gid, sizeof(gid)) == 0);
	CHECK(table[0].gid_index == 0);
	CHECK(table[0].port_num == 1);
	CHECK(table[0].gid_type == IBV_GID_TYPE_IB);
	CHECK(ibv_query_gid_table(ctx, table, 0, 0) == -EINVAL); /* no room for it */
	CHECK(ibv_query_gid_table(ctx, table, 4, 1) == -EINVAL);
}

TEST_CASE("P_Key queries fail as libibverbs' sysfs reads do: -1 and ENOENT", "[device]")
{
	/* ibv_query_pkey() reads ports/N/pkeys/I, a file a port or index the
	 * device lacks does not have; ibv_get_pkey_index() queries index 0,
	 * 1, ... and returns the failure of the first that fails. */
	shmv_test::OpenDevice d;
	struct ibv_port_attr port{};
	REQUIRE(ibv_query_port(d.ctx, 1, &port) == 0);
	__be16 pkey;
	const struct {
		uint8_t port;
		int index;
	} bad[] = {{1, port.pkey_tbl_len}, {1, -1}, {0, 0}, {2, 0}};
	for (const auto &b : bad) {
		CAPTURE(int(b.port), b.index);
		errno = 0;
		CHECK(ibv_query_pkey(d.ctx, b.port, b.index, &pkey) == -1);
		CHECK(errno == ENOENT);
	}
	errno = 0;
	CHECK(ibv_get_pkey_index(d.ctx, 1, htobe16(0x1234)) == -1);
	CHECK(errno == ENOENT);
	errno = 0;
	CHECK(ibv_get_pkey_index(d.ctx, 2, htobe16(0xffff)) == -1);
	CHECK(errno == ENOENT);
	CHECK(ibv_get_pkey_index(d.ctx, 1, htobe16(0xffff)) == 0);
}

TEST_CASE("device attributes a ConnectX reports: capability flags, timestamp mask, clock",
	  "[device]")
{
	shmv_test::OpenDevice d;
	struct ibv_device_attr_ex x{};
	REQUIRE(ibv_query_device_ex(d.ctx, nullptr, &x) == 0);
	/* SEND_WITH_INV and LOCAL_INV are there (SPDK looks at this bit). */
	CHECK(x.orig_attr.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS);
	CHECK_FALSE(x.orig_attr.device_cap_flags & IBV_DEVICE_N_NOTIFY_CQ);
	CHECK(x.completion_timestamp_mask == 0x7fffffffffffffffull); /* mlx5_ib */
	/* libmlx5's raw clock is all in tv_nsec (mlx5_query_rt_values). */
	struct ibv_values_ex v{};
	v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
	REQUIRE(ibv_query_rt_values_ex(d.ctx, &v) == 0);
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	const int64_t now_ns = int64_t(now.tv_sec) * 1000000000ll + now.tv_nsec;
	CHECK(v.raw_clock.tv_sec == 0);
	CHECK(v.raw_clock.tv_nsec <= now_ns);
	CHECK(v.raw_clock.tv_nsec > now_ns - 1000000000ll);
}

TEST_CASE("the exported ibv_query_port writes the compat struct, flags included",
	  "[device]")
{
	/* A caller of the symbol itself (bindings, a function pointer) gets
	 * rdma-core 44's _compat_ibv_port_attr: up to and including flags,
	 * nothing after it. */
	shmv_test::OpenDevice d;
	struct ibv_port_attr want{};
	REQUIRE(ibv_query_port(d.ctx, 1, &want) == 0);
	struct ibv_port_attr got;
	std::memset(&got, 0xab, sizeof(got));
	REQUIRE((ibv_query_port)(d.ctx, 1, reinterpret_cast<struct _compat_ibv_port_attr *>(&got)) ==
		0);
	CHECK(got.flags == want.flags);
	CHECK(got.link_layer == want.link_layer);
	CHECK(got.port_cap_flags2 == 0xabab); /* past the compat struct */
}

TEST_CASE("RoCE: the default P_Key alone", "[.eth][device]")
{
	/* mlx5_query_port_roce(): pkey_tbl_len 1; a QP cannot name another. */
	shmv_test::OpenDevice d;
	struct ibv_port_attr port{};
	REQUIRE(ibv_query_port(d.ctx, 1, &port) == 0);
	CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(port.pkey_tbl_len == 1);
	/* IB's alone: mlx5_query_port_roce() leaves them 0. */
	CHECK(port.max_vl_num == 0);
	CHECK(port.subnet_timeout == 0);
	__be16 pkey;
	REQUIRE(ibv_query_pkey(d.ctx, 1, 0, &pkey) == 0);
	CHECK(pkey == htobe16(0xffff));
	CHECK(ibv_query_pkey(d.ctx, 1, 1, &pkey) != 0);

	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 4, nullptr, nullptr, 0);
	REQUIRE(cq);
	struct ibv_qp_init_attr ia{};
	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp);
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = 1;
	a.pkey_index = 1;
	const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
	CHECK(ibv_modify_qp(qp, &a, mask) == EINVAL);
	a.pkey_index = 0;
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("ibv_query_gid_table on Ethernet: RoCE v1 and v2, link-local and IPv4",
	  "[.eth][device][gid]")
{
	shmv_test::OpenDevice d;
	struct ibv_context *ctx = d.ctx;

	struct ibv_gid_entry table[8];
	std::memset(table, 0, sizeof(table));
	REQUIRE(ibv_query_gid_table(ctx, table, 8, 0) == 4);
	const uint32_t types[] = {IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2,
				  IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2};
	for (uint32_t i = 0; i < 4; i++) {
		CAPTURE(i);
		CHECK(table[i].gid_index == i);
		CHECK(table[i].port_num == 1);
		CHECK(table[i].gid_type == types[i]);
		struct ibv_gid_entry one;
		REQUIRE(ibv_query_gid_ex(ctx, 1, i, &one, 0) == 0);
		CHECK(std::memcmp(&one, &table[i], sizeof(one)) == 0);
		union ibv_gid gid;
		REQUIRE(ibv_query_gid(ctx, 1, int(i), &gid) == 0);
		CHECK(std::memcmp(&gid, &table[i].gid, sizeof(gid)) == 0);
	}
	/* Link-local (fe80::/64) at 0 and 1, IPv4-mapped 127.0.0.1 at 2 and 3. */
	CHECK(table[0].gid.raw[0] == 0xfe);
	CHECK(table[1].gid.raw[0] == 0xfe);
	const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
	CHECK(std::memcmp(table[2].gid.raw, v4, 16) == 0);
	CHECK(std::memcmp(table[3].gid.raw, v4, 16) == 0);
	CHECK(ibv_query_gid_table(ctx, table, 3, 0) == -EINVAL);
	struct ibv_gid_entry e;
	CHECK(ibv_query_gid_ex(ctx, 1, 4, &e, 0) == ENODATA);
}
