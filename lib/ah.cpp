/* SPDX-License-Identifier: MIT */
#include "ah.h"
#include "device.h"

#include <endian.h>
#include <netinet/in.h>
#include <netinet/ip.h>

#include <atomic>
#include <cstring>
#include <new>
#include <random>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Ah> && offsetof(Ah, ibv) == 0);

namespace {

std::atomic<uint32_t> next_ah_handle{1};

/* A source port in the RoCE v2 range when no flow label picks one. */
uint16_t random_udp_sport()
{
	thread_local std::minstd_rand rng{std::random_device{}()};
	constexpr uint32_t span = IB_ROCE_UDP_ENCAP_VALID_PORT_MAX - IB_ROCE_UDP_ENCAP_VALID_PORT_MIN + 1;
	return static_cast<uint16_t>(IB_ROCE_UDP_ENCAP_VALID_PORT_MIN + rng() % span);
}

} // namespace

Result<Ah> create_ah(Context &ctx, Pd &pd, const struct ibv_ah_attr &attr)
{
	const Port *port = ctx.device->port(attr.port_num);
	if (!port)
		return Err{EINVAL}; /* libmlx5 fails here without setting errno */
	const bool is_eth = port->attr.link_layer == IBV_LINK_LAYER_ETHERNET;
	const bool grh_required = port->attr.flags & IBV_QPF_GRH_REQUIRED;
	if (!attr.is_global && (is_eth || grh_required))
		return Err{EINVAL};

	bool roce_v2 = false;
	if (is_eth) {
		/* The kernel resolves the SGID entry (rdma_get_gid_attr): an
		 * empty one is ENODATA. The index is a uint8_t and RoCE tables
		 * have at least 256 entries, so it cannot be out of range. */
		const uint8_t index = attr.grh.sgid_index;
		if (index >= port->gids.size())
			return Err{EINVAL};
		if (!port->gids[index].valid)
			return Err{ENODATA};
		roce_v2 = port->gids[index].gid_type == IBV_GID_TYPE_ROCE_V2;
	}

	auto *ah = new (std::nothrow) Ah{};
	if (!ah)
		return Err{ENOMEM};
	ah->attr = attr;
	ah->is_eth = is_eth;
	ah->roce_v2 = roce_v2;
	if (roce_v2) {
		uint32_t fl = attr.grh.flow_label & IB_GRH_FLOWLABEL_MASK;
		ah->udp_sport = fl ? ibv_flow_label_to_udp_sport(fl) : random_udp_sport();
	}
	if (is_eth) {
		ah->pd = &pd;
		pd.uses.get();
	}
	ah->ibv.context = ctx.abi();
	ah->ibv.handle = next_ah_handle.fetch_add(1, std::memory_order_relaxed);
	return ah;
}

int destroy_ah(Ah &ah)
{
	if (ah.pd)
		ah.pd->uses.put();
	delete &ah;
	return 0;
}

int find_gid_index(Context &ctx, uint8_t port_num, const union ibv_gid &gid, bool roce_v2,
		   int &index)
{
	for (int i = 0;; i++) {
		union ibv_gid sgid;
		enum ibv_gid_type type;
		if (int err = query_gid(ctx, port_num, i, sgid))
			return err;
		if (int err = query_gid_type(ctx, port_num, static_cast<unsigned>(i), type))
			return err;
		if (std::memcmp(sgid.raw, gid.raw, sizeof(gid.raw)) == 0 &&
		    (type == IBV_GID_TYPE_ROCE_V2) == roce_v2) {
			index = i;
			return 0;
		}
	}
}

namespace {

constexpr uint8_t ib_next_header = 0x1b; /* IBA: the GRH is followed by a BTH */

void ipv4_mapped_gid(uint32_t addr_be, union ibv_gid &gid)
{
	std::memset(gid.raw, 0, sizeof(gid.raw));
	gid.raw[10] = 0xff;
	gid.raw[11] = 0xff;
	std::memcpy(gid.raw + 12, &addr_be, 4);
}

/* The header checksum of an IPv4 header with ihl 5, computed as libibverbs
 * does: the carry is folded once only, so that the same headers pass. */
uint16_t ipv4_header_checksum(struct iphdr header)
{
	header.check = 0;
	uint16_t words[10];
	std::memcpy(words, &header, sizeof(words));
	uint32_t sum = 0;
	for (uint16_t w : words)
		sum += w;
	sum = (sum & 0xffff) + (sum >> 16);
	return static_cast<uint16_t>(~sum);
}

/* The 40 bytes a RoCE v2 device scatters for an IPv4 packet hold 20 unused
 * bytes and then the IPv4 header. 6 (IPv6 or IB GRH), 4, or 0 when neither
 * (libibverbs: EPROTONOSUPPORT). An IPv6 version nibble is still read as
 * IPv4 when a well-formed IPv4 header with a valid checksum follows. */
int grh_ip_version(const struct ibv_grh &grh, struct iphdr &ip4)
{
	std::memcpy(&ip4, reinterpret_cast<const char *>(&grh) + 20, sizeof(ip4));
	const unsigned ip6_version = (be32toh(grh.version_tclass_flow) >> 28) & 0xf;
	if (ip6_version != 6)
		return ip4.version == 4 ? 4 : 0;
	if (ip4.ihl != 5)
		return 6;
	return ip4.check == ipv4_header_checksum(ip4) ? 4 : 6;
}

} // namespace

int init_ah_from_wc(Context &ctx, uint8_t port_num, const struct ibv_wc &wc,
		    const struct ibv_grh *grh, struct ibv_ah_attr &out)
{
	out = {};
	if (grh)
		out.grh.flow_label = be32toh(grh->version_tclass_flow) & IB_GRH_FLOWLABEL_MASK;
	out.dlid = wc.slid;
	out.sl = wc.sl;
	out.src_path_bits = wc.dlid_path_bits;
	out.port_num = port_num;
	if (!(wc.wc_flags & IBV_WC_GRH))
		return 0;
	if (!grh)
		return EINVAL;

	out.is_global = 1;
	struct iphdr ip4;
	const int version = grh_ip_version(*grh, ip4);
	if (version == 4) {
		/* No GID table holds a multicast address. */
		if ((be32toh(ip4.daddr) & 0xf0000000u) == 0xe0000000u)
			return EINVAL;
		union ibv_gid local;
		ipv4_mapped_gid(ip4.daddr, local);
		int index;
		if (int err = find_gid_index(ctx, port_num, local, true, index))
			return err;
		ipv4_mapped_gid(ip4.saddr, out.grh.dgid);
		out.grh.sgid_index = static_cast<uint8_t>(index);
		out.grh.hop_limit = ip4.ttl;
		out.grh.traffic_class = ip4.tos;
		return 0;
	}
	if (version == 6) {
		if (grh->dgid.raw[0] == 0xff)
			return EINVAL;
		out.grh.dgid = grh->sgid;
		bool roce_v2;
		if (grh->next_hdr == IPPROTO_UDP)
			roce_v2 = true;
		else if (grh->next_hdr == ib_next_header)
			roce_v2 = false;
		else
			return EPROTONOSUPPORT;
		int index;
		if (int err = find_gid_index(ctx, port_num, grh->dgid, roce_v2, index))
			return err;
		out.grh.sgid_index = static_cast<uint8_t>(index);
		out.grh.hop_limit = grh->hop_limit;
		out.grh.traffic_class = static_cast<uint8_t>(be32toh(grh->version_tclass_flow) >> 20);
		return 0;
	}
	return EPROTONOSUPPORT;
}

} // namespace shmverbs
