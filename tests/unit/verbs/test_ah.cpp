/* SPDX-License-Identifier: MIT */
/*
 * Address handles through the C ABI. Untagged cases run on the default
 * InfiniBand port; cases tagged [eth] run in a separate test process with
 * SHMVERBS_LINK_LAYER=eth (tests/meson.build), where the GID table is
 * v1/v2 link-local at 0/1 and v1/v2 IPv4-mapped at 2/3 (lib/device.cpp).
 */
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"
#include "../common/qp_path.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace {

struct Fixture : shmv_test::DeviceWithPd {
	struct ibv_port_attr port{};

	Fixture() { REQUIRE(ibv_query_port(ctx, 1, &port) == 0); }

	union ibv_gid gid(int index) const
	{
		union ibv_gid g;
		REQUIRE(ibv_query_gid(ctx, 1, index, &g) == 0);
		return g;
	}
};

union ibv_gid remote_gid()
{
	union ibv_gid g{};
	g.global.subnet_prefix = htobe64(0xfe80000000000000ull);
	g.global.interface_id = htobe64(0x0002c90300a1b2c3ull);
	return g;
}

/* An IPv6 or IB GRH as a receive buffer holds it. */
struct ibv_grh make_grh(uint8_t next_hdr, uint8_t tclass, uint32_t flow, uint8_t hop_limit,
			const union ibv_gid &sgid, const union ibv_gid &dgid, unsigned version = 6)
{
	struct ibv_grh g{};
	g.version_tclass_flow = htobe32(version << 28 | uint32_t(tclass) << 20 | flow);
	g.paylen = htobe16(64);
	g.next_hdr = next_hdr;
	g.hop_limit = hop_limit;
	g.sgid = sgid;
	g.dgid = dgid;
	return g;
}

uint16_t ip_checksum(const struct iphdr &h)
{
	uint16_t words[10];
	std::memcpy(words, &h, sizeof(words));
	uint32_t sum = 0;
	for (uint16_t w : words)
		sum += w;
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return static_cast<uint16_t>(~sum);
}

/* What a RoCE v2 device scatters for an IPv4 packet: 20 bytes the device
 * leaves alone (`head`), then the IPv4 header. */
struct ibv_grh make_ipv4_grh(uint32_t saddr, uint32_t daddr, uint8_t ttl, uint8_t tos,
			     uint8_t head = 0, bool good_checksum = true)
{
	struct iphdr ip{};
	ip.version = 4;
	ip.ihl = 5;
	ip.tos = tos;
	ip.tot_len = htons(84);
	ip.ttl = ttl;
	ip.protocol = IPPROTO_UDP;
	ip.saddr = saddr;
	ip.daddr = daddr;
	ip.check = ip_checksum(ip);
	if (!good_checksum)
		ip.check ^= 0x1234;
	struct ibv_grh g;
	std::memset(&g, head, 20);
	std::memcpy(reinterpret_cast<char *>(&g) + 20, &ip, sizeof(ip));
	return g;
}

uint32_t ipv4_of(const union ibv_gid &gid)
{
	uint32_t a;
	std::memcpy(&a, gid.raw + 12, 4);
	return a;
}

struct ibv_ah_attr ib_attr(const Fixture &f)
{
	struct ibv_ah_attr a{};
	a.dlid = f.port.lid;
	a.sl = 3;
	a.port_num = 1;
	return a;
}

} // namespace

TEST_CASE("create and destroy an AH", "[ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	struct ibv_ah_attr attr = ib_attr(f);
	struct ibv_ah *ah = ibv_create_ah(f.pd, &attr);
	REQUIRE(ah);
	CHECK(ah->context == f.ctx);
	CHECK(ah->pd == f.pd);
	CHECK(ibv_destroy_ah(ah) == 0);

	errno = 0;
	CHECK(ibv_create_ah(nullptr, &attr) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_ah(f.pd, nullptr) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_destroy_ah(nullptr) == EINVAL);
}

TEST_CASE("AH validation on InfiniBand (libmlx5 builds the AV in user space)", "[ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	struct Row {
		const char *what;
		uint8_t port_num;
		bool is_global;
		uint8_t sgid_index;
		uint8_t static_rate;
		uint16_t dlid;
		int err;
	};
	const Row rows[] = {
		{"LID route", 1, false, 0, 0, 1, 0},
		{"port 0", 0, false, 0, 0, 1, EINVAL},
		{"port 2 of a one-port device", 2, false, 0, 0, 1, EINVAL},
		{"port 255", 255, false, 0, 0, 1, EINVAL},
		{"with GRH", 1, true, 0, 0, 1, 0},
		/* not checked on IB: they only fail on the wire */
		{"GRH with an empty SGID entry", 1, true, 5, 0, 1, 0},
		{"GRH with an SGID index beyond the table", 1, true, 200, 0, 1, 0},
		{"DLID 0 without GRH", 1, false, 0, 0, 0, 0},
		{"permissive DLID", 1, false, 0, 0, 0xffff, 0},
		{"static rate 100 Gb/s", 1, false, 0, IBV_RATE_100_GBPS, 1, 0},
		{"static rate out of the table", 1, false, 0, 200, 1, 0},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		struct ibv_ah_attr attr = ib_attr(f);
		attr.port_num = r.port_num;
		attr.is_global = r.is_global;
		attr.grh.sgid_index = r.sgid_index;
		attr.grh.dgid = remote_gid();
		attr.grh.hop_limit = 1;
		attr.static_rate = r.static_rate;
		attr.dlid = r.dlid;
		errno = 0;
		struct ibv_ah *ah = ibv_create_ah(f.pd, &attr);
		if (r.err) {
			CHECK(ah == nullptr);
			CHECK(errno == r.err);
		} else {
			REQUIRE(ah);
			CHECK(ibv_destroy_ah(ah) == 0);
		}
	}
}

TEST_CASE("an IB AH does not pin its PD (no kernel object in libmlx5)", "[ah][pd]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct ibv_ah_attr attr = ib_attr(f);
	struct ibv_ah *ah = ibv_create_ah(pd, &attr);
	REQUIRE(ah);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("init_ah_from_wc without GRH", "[ah]")
{
	Fixture f;
	struct ibv_wc wc{};
	wc.slid = 17;
	wc.sl = 5;
	wc.dlid_path_bits = 3;
	wc.wc_flags = 0;
	struct ibv_grh grh = make_grh(0x1b, 0, 0x12345, 64, remote_gid(), f.gid(0));
	struct ibv_ah_attr attr;
	std::memset(&attr, 0xa5, sizeof(attr));
	REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
	CHECK(attr.dlid == 17);
	CHECK(attr.sl == 5);
	CHECK(attr.src_path_bits == 3);
	CHECK(attr.port_num == 1);
	CHECK(attr.is_global == 0);
	CHECK(attr.static_rate == 0);
	/* libibverbs reads the flow label even without IBV_WC_GRH */
	CHECK(attr.grh.flow_label == 0x12345);
	CHECK(attr.grh.sgid_index == 0);

	/* no GRH buffer is needed when there is no GRH */
	REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, nullptr, &attr) == 0);
	CHECK(attr.grh.flow_label == 0);
	struct ibv_ah *ah = ibv_create_ah_from_wc(f.pd, &wc, nullptr, 1);
	REQUIRE(ah);
	CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("init_ah_from_wc with an IB GRH", "[ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	struct ibv_wc wc{};
	wc.slid = 9;
	wc.sl = 2;
	wc.wc_flags = IBV_WC_GRH;
	struct ibv_grh grh = make_grh(0x1b, 0x28, 0xabcde, 33, remote_gid(), f.gid(0));
	struct ibv_ah_attr attr;
	REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
	CHECK(attr.is_global == 1);
	CHECK(attr.dlid == 9);
	CHECK(attr.sl == 2);
	CHECK(attr.port_num == 1);
	CHECK(std::memcmp(&attr.grh.dgid, &grh.sgid, 16) == 0); /* reply to the sender */
	CHECK(attr.grh.sgid_index == 0);
	CHECK(attr.grh.hop_limit == 33);
	CHECK(attr.grh.traffic_class == 0x28);
	CHECK(attr.grh.flow_label == 0xabcde);

	struct ibv_ah *ah = ibv_create_ah_from_wc(f.pd, &wc, &grh, 1);
	REQUIRE(ah);
	CHECK(ah->pd == f.pd);
	CHECK(ibv_destroy_ah(ah) == 0);
}

TEST_CASE("init_ah_from_wc failures", "[ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	union ibv_gid mcast{};
	mcast.raw[0] = 0xff;
	mcast.raw[1] = 0x12;
	union ibv_gid unknown = remote_gid();
	struct Row {
		const char *what;
		struct ibv_grh grh;
		uint8_t port;
		int err;
	};
	const Row rows[] = {
		{"destination GID not ours", make_grh(0x1b, 0, 0, 64, remote_gid(), unknown), 1,
		 EINVAL},
		{"multicast destination", make_grh(0x1b, 0, 0, 64, remote_gid(), mcast), 1, EINVAL},
		{"RoCE v2 next header on an IB GID", make_grh(IPPROTO_UDP, 0, 0, 64, remote_gid(), f.gid(0)),
		 1, EINVAL},
		{"unknown next header", make_grh(IPPROTO_TCP, 0, 0, 64, remote_gid(), f.gid(0)), 1,
		 EPROTONOSUPPORT},
		{"neither IPv6 nor IPv4", make_grh(0x1b, 0, 0, 64, remote_gid(), f.gid(0), 5), 1,
		 EPROTONOSUPPORT},
		{"port 0", make_grh(0x1b, 0, 0, 64, remote_gid(), f.gid(0)), 0, EINVAL},
		{"port 2", make_grh(0x1b, 0, 0, 64, remote_gid(), f.gid(0)), 2, EINVAL},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		struct ibv_wc wc{};
		wc.wc_flags = IBV_WC_GRH;
		struct ibv_grh grh = r.grh;
		struct ibv_ah_attr attr;
		errno = 0;
		CHECK(ibv_init_ah_from_wc(f.ctx, r.port, &wc, &grh, &attr) == -1);
		CHECK(errno == r.err);
		errno = 0;
		CHECK(ibv_create_ah_from_wc(f.pd, &wc, &grh, r.port) == nullptr);
		CHECK(errno == r.err);
	}
	struct ibv_wc wc{};
	wc.wc_flags = IBV_WC_GRH;
	struct ibv_ah_attr attr;
	errno = 0;
	CHECK(ibv_init_ah_from_wc(f.ctx, 1, &wc, nullptr, &attr) == -1);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_init_ah_from_wc(nullptr, 1, &wc, nullptr, &attr) == -1);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_ah_from_wc(nullptr, &wc, nullptr, 1) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("init_ah_from_wc finds the zero GID at the first empty entry", "[ah]")
{
	/* ibv_query_gid reads an empty entry as the zero GID of type v1, and
	 * ibv_find_gid_index stops at the first match. */
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_INFINIBAND);
	union ibv_gid zero{};
	struct ibv_wc wc{};
	wc.wc_flags = IBV_WC_GRH;
	struct ibv_grh grh = make_grh(0x1b, 0, 0, 64, remote_gid(), zero);
	struct ibv_ah_attr attr;
	REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
	CHECK(attr.grh.sgid_index == 1);
}

/* ---- Ethernet (RoCE) ---- */

TEST_CASE("AH validation on Ethernet", "[.eth][ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_ETHERNET);
	struct Row {
		const char *what;
		uint8_t port_num;
		bool is_global;
		uint8_t sgid_index;
		int err;
	};
	const Row rows[] = {
		{"RoCE needs a GRH", 1, false, 0, EINVAL},
		{"v1 link-local", 1, true, 0, 0},
		{"v2 link-local", 1, true, 1, 0},
		{"v1 IPv4", 1, true, 2, 0},
		{"v2 IPv4", 1, true, 3, 0},
		{"empty SGID entry", 1, true, 4, ENODATA},
		{"last SGID entry, empty", 1, true, 255, ENODATA},
		{"port 0", 0, true, 0, EINVAL},
		{"port 2", 2, true, 0, EINVAL},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		struct ibv_ah_attr attr{};
		attr.port_num = r.port_num;
		attr.is_global = r.is_global;
		attr.grh.sgid_index = r.sgid_index;
		attr.grh.dgid = f.gid(r.sgid_index < 4 ? r.sgid_index : 0);
		attr.grh.hop_limit = 64;
		attr.grh.flow_label = 0x321;
		errno = 0;
		struct ibv_ah *ah = ibv_create_ah(f.pd, &attr);
		if (r.err) {
			CHECK(ah == nullptr);
			CHECK(errno == r.err);
		} else {
			REQUIRE(ah);
			CHECK(ibv_destroy_ah(ah) == 0);
		}
	}
}

TEST_CASE("a RoCE AH pins its PD (it is a kernel object)", "[.eth][ah][pd]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_ETHERNET);
	struct ibv_pd *pd = ibv_alloc_pd(f.ctx);
	REQUIRE(pd);
	struct ibv_ah_attr attr{};
	attr.port_num = 1;
	attr.is_global = 1;
	attr.grh.sgid_index = 3;
	attr.grh.dgid = f.gid(3);
	struct ibv_ah *ah = ibv_create_ah(pd, &attr);
	REQUIRE(ah);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("init_ah_from_wc with a RoCE v2 IPv4 header", "[.eth][ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_ETHERNET);
	const union ibv_gid local = f.gid(3);
	const uint32_t local_ip = ipv4_of(local);
	const uint32_t remote_ip = inet_addr("10.1.2.3");

	struct ibv_wc wc{};
	wc.wc_flags = IBV_WC_GRH;
	wc.sl = 0;

	SECTION("the IPv4-mapped v2 GID at index 3")
	{
		struct ibv_grh grh = make_ipv4_grh(remote_ip, local_ip, 17, 0x60);
		struct ibv_ah_attr attr;
		REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
		CHECK(attr.is_global == 1);
		CHECK(attr.grh.sgid_index == 3);
		CHECK(attr.grh.hop_limit == 17);
		CHECK(attr.grh.traffic_class == 0x60);
		CHECK(attr.port_num == 1);
		union ibv_gid expect{};
		expect.raw[10] = expect.raw[11] = 0xff;
		std::memcpy(expect.raw + 12, &remote_ip, 4);
		CHECK(std::memcmp(&attr.grh.dgid, &expect, 16) == 0);

		struct ibv_ah *ah = ibv_create_ah_from_wc(f.pd, &wc, &grh, 1);
		REQUIRE(ah);
		CHECK(ibv_dealloc_pd(f.pd) == EBUSY);
		CHECK(ibv_destroy_ah(ah) == 0);
	}
	SECTION("an IPv6 version nibble in front of a valid IPv4 header is still IPv4")
	{
		struct ibv_grh grh = make_ipv4_grh(remote_ip, local_ip, 17, 0, 0x60);
		struct ibv_ah_attr attr;
		REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
		CHECK(attr.grh.sgid_index == 3);
	}
	SECTION("with a bad checksum it is read as IPv6, and matches nothing")
	{
		struct ibv_grh grh = make_ipv4_grh(remote_ip, local_ip, 17, 0, 0x60, false);
		struct ibv_ah_attr attr;
		errno = 0;
		CHECK(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == -1);
		CHECK(errno == EPROTONOSUPPORT); /* next header 0x60: neither UDP nor BTH */
	}
	SECTION("a multicast destination is refused")
	{
		struct ibv_grh grh = make_ipv4_grh(remote_ip, inet_addr("239.1.1.1"), 1, 0);
		struct ibv_ah_attr attr;
		errno = 0;
		CHECK(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == -1);
		CHECK(errno == EINVAL);
	}
	SECTION("an address that is not ours is not found")
	{
		struct ibv_grh grh = make_ipv4_grh(remote_ip, inet_addr("10.9.9.9"), 1, 0);
		struct ibv_ah_attr attr;
		errno = 0;
		CHECK(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == -1);
		CHECK(errno == EINVAL);
	}
}

TEST_CASE("init_ah_from_wc with RoCE IPv6 headers", "[.eth][ah]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_ETHERNET);
	struct ibv_wc wc{};
	wc.wc_flags = IBV_WC_GRH;
	struct Row {
		const char *what;
		uint8_t next_hdr;
		int local_index;
		int expect_index;
	};
	const Row rows[] = {
		{"v2 (UDP) to the link-local GID", IPPROTO_UDP, 1, 1},
		{"v1 (BTH) to the link-local GID", 0x1b, 0, 0},
		{"v1 to the IPv4-mapped GID", 0x1b, 2, 2},
		{"v2 to the IPv4-mapped GID, IPv6-encoded", IPPROTO_UDP, 3, 3},
	};
	for (const Row &r : rows) {
		INFO(r.what);
		struct ibv_grh grh = make_grh(r.next_hdr, 0x10, 0x777, 9, remote_gid(), f.gid(r.local_index));
		struct ibv_ah_attr attr;
		REQUIRE(ibv_init_ah_from_wc(f.ctx, 1, &wc, &grh, &attr) == 0);
		CHECK(attr.grh.sgid_index == r.expect_index);
		CHECK(attr.grh.hop_limit == 9);
		CHECK(attr.grh.traffic_class == 0x10);
		CHECK(attr.grh.flow_label == 0x777);
		struct ibv_ah *ah = ibv_create_ah(f.pd, &attr);
		REQUIRE(ah);
		CHECK(ibv_destroy_ah(ah) == 0);
	}
}

/* RoCE v2 groups of IPv4 have IPv4-mapped MGIDs (::ffff:224.0.0.0/4, as
 * the RDMA CM builds them); the kernel takes them as multicast
 * (rdma_is_multicast_addr), to attach and to send to. */
TEST_CASE("RoCE v2: an IPv4 multicast group is joined and reached", "[.eth][ah][mcast]")
{
	Fixture f;
	REQUIRE(f.port.link_layer == IBV_LINK_LAYER_ETHERNET);
	std::vector<char> buf(4096);
	struct ibv_mr *mr = ibv_reg_mr(f.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr);
	struct ibv_cq *cq = ibv_create_cq(f.ctx, 8, nullptr, nullptr, 0);
	REQUIRE(cq);
	struct ibv_qp *qp[2];
	for (struct ibv_qp *&q : qp) {
		struct ibv_qp_init_attr a{};
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_UD;
		a.cap = {2, 2, 1, 1, 0};
		q = ibv_create_qp(f.pd, &a);
		REQUIRE(q);
		shmv_test::QpPath path;
		path.qkey = 0x1234;
		REQUIRE(shmv_test::qp_to_rts(q, IBV_QPT_UD, 0, 0, path) == 0);
	}
	union ibv_gid mgid{};
	mgid.raw[10] = mgid.raw[11] = 0xff;
	const uint32_t group = inet_addr("239.1.2.3");
	std::memcpy(mgid.raw + 12, &group, 4);
	REQUIRE(ibv_attach_mcast(qp[1], &mgid, 0) == 0);
	/* Neither multicast nor the IPv6 form: still refused. */
	union ibv_gid unicast = mgid;
	const uint32_t host = inet_addr("10.1.2.3");
	std::memcpy(unicast.raw + 12, &host, 4);
	CHECK(ibv_attach_mcast(qp[1], &unicast, 0) == EINVAL);

	REQUIRE(shmv_test::post_recv_sge(qp[1], {uint64_t(uintptr_t(buf.data() + 1024)), 256,
						  mr->lkey}, 7) == 0);
	struct ibv_ah_attr at{};
	at.port_num = 1;
	at.is_global = 1;
	at.grh.sgid_index = 3; /* v2 IPv4 */
	at.grh.dgid = mgid;
	at.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(f.pd, &at);
	REQUIRE(ah);
	std::memcpy(buf.data(), "group", 5);
	struct ibv_send_wr wr{};
	wr.wr_id = 8;
	wr.opcode = IBV_WR_SEND;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = 0x1234;
	REQUIRE(shmv_test::post_send_sge(qp[0], wr, {uint64_t(uintptr_t(buf.data())), 5,
						     mr->lkey}) == 0);
	bool received = false;
	struct ibv_wc wc{};
	while (shmv_test::wait_wc(cq, wc, 200)) {
		CHECK(wc.status == IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV) {
			received = wc.wr_id == 7 && wc.qp_num == qp[1]->qp_num;
			CHECK(std::memcmp(buf.data() + 1024 + 40, "group", 5) == 0);
		}
	}
	CHECK(received);
	CHECK(ibv_detach_mcast(qp[1], &mgid, 0) == 0);
	CHECK(ibv_destroy_ah(ah) == 0);
	for (struct ibv_qp *q : qp)
		CHECK(ibv_destroy_qp(q) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
}
