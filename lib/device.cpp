/* SPDX-License-Identifier: MIT */
#include "device.h"
#include "log.h"

#include <endian.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Device>, "ibv_device* is cast to Device*");
static_assert(offsetof(Device, ibv) == 0);

namespace {

/* GUIDs: a locally administered EUI-64 ("SHMV" in the upper half) so they can
 * never collide with a real vendor's, then the device index. Every process
 * sees the same GUIDs for the same device, as with a real HCA. */
constexpr uint64_t guid_base = 0x5348'4d56'0000'0000ull;

uint64_t node_guid_for(uint32_t index) { return guid_base | (uint64_t(index + 1) << 16); }

/* One LID per port across all devices of the emulated fabric. */
uint16_t lid_for(uint32_t dev_index, unsigned nports, unsigned port)
{
	return static_cast<uint16_t>(1 + dev_index * nports + (port - 1));
}

void set_gid(GidEntry &e, uint64_t prefix, uint64_t iface, enum ibv_gid_type type)
{
	uint64_t p = htobe64(prefix), i = htobe64(iface);
	std::memcpy(e.gid.raw, &p, 8);
	std::memcpy(e.gid.raw + 8, &i, 8);
	e.gid_type = type;
	e.valid = true;
}

void set_ipv4_gid(GidEntry &e, uint32_t addr, enum ibv_gid_type type)
{
	std::memset(e.gid.raw, 0, sizeof(e.gid.raw));
	e.gid.raw[10] = 0xff;
	e.gid.raw[11] = 0xff;
	uint32_t be = htobe32(addr);
	std::memcpy(e.gid.raw + 12, &be, 4);
	e.gid_type = type;
	e.valid = true;
}

Port make_port(const Device &dev, unsigned nports, uint8_t port_num)
{
	Port p{};
	p.port_num = port_num;
	p.attr = dev.profile->port_attr(dev.link_layer);
	p.guid = dev.node_guid + port_num - 1;
	p.gids.resize(p.attr.gid_tbl_len);
	p.pkeys.resize(p.attr.pkey_tbl_len);
	p.pkeys[0] = 0xffff;

	constexpr uint64_t link_local = 0xfe80'0000'0000'0000ull;
	if (dev.link_layer == LinkLayer::InfiniBand) {
		p.attr.lid = lid_for(dev.index, nports, port_num);
		p.attr.sm_lid = 1;
		set_gid(p.gids[0], link_local, p.guid, IBV_GID_TYPE_IB);
	} else {
		/* RoCE: the layout a ConnectX shows for an interface with one IPv4
		 * address: v1 and v2 link-local, then v1 and v2 IPv4-mapped. The
		 * address is a loopback one, unique per port. */
		p.attr.lid = 0;
		p.attr.sm_lid = 0;
		uint64_t iface = p.guid ^ 0x0200'0000'0000'0000ull; /* EUI-64 U/L bit */
		set_gid(p.gids[0], link_local, iface, IBV_GID_TYPE_ROCE_V1);
		set_gid(p.gids[1], link_local, iface, IBV_GID_TYPE_ROCE_V2);
		uint32_t ip = 0x7f000000u | lid_for(dev.index, nports, port_num); /* 127.0.0.x */
		set_ipv4_gid(p.gids[2], ip, IBV_GID_TYPE_ROCE_V1);
		set_ipv4_gid(p.gids[3], ip, IBV_GID_TYPE_ROCE_V2);
	}
	return p;
}

} // namespace

struct ibv_device_attr Device::device_attr() const
{
	struct ibv_device_attr a = profile->device_attr();
	std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", profile->fw_ver());
	a.node_guid = htobe64(node_guid);
	a.sys_image_guid = htobe64(sys_image_guid);
	a.phys_port_cnt = static_cast<uint8_t>(ports.size());
	return a;
}

const Port *Device::port(uint8_t port_num) const
{
	if (port_num < 1 || port_num > ports.size())
		return nullptr;
	return &ports[port_num - 1];
}

std::vector<Device *> build_devices(const Config &cfg)
{
	std::vector<Device *> list;
	for (uint32_t i = 0; i < cfg.num_devices; i++) {
		auto *d = new Device{};
		d->index = i;
		d->profile = &Profile::get(cfg.profile);
		d->link_layer = cfg.link_layer;
		d->node_guid = node_guid_for(i);
		d->sys_image_guid = d->node_guid;
		d->ibv.node_type = IBV_NODE_CA;
		d->ibv.transport_type = IBV_TRANSPORT_IB;
		std::snprintf(d->ibv.name, sizeof(d->ibv.name), "%s%u", cfg.name_prefix.c_str(), i);
		std::snprintf(d->ibv.dev_name, sizeof(d->ibv.dev_name), "uverbs%u", i);
		/* No sysfs behind these: the paths name the emulation and are
		 * never opened by us (ibv_get_sysfs_path reports the same). */
		std::snprintf(d->ibv.dev_path, sizeof(d->ibv.dev_path),
			      "/sys/class/infiniband_verbs/uverbs%u", i);
		std::snprintf(d->ibv.ibdev_path, sizeof(d->ibv.ibdev_path),
			      "/sys/class/infiniband/%s", d->ibv.name);
		for (unsigned p = 1; p <= cfg.num_ports; p++)
			d->ports.push_back(make_port(*d, cfg.num_ports, static_cast<uint8_t>(p)));
		list.push_back(d);
	}
	return list;
}

const std::vector<Device *> &devices()
{
	/* Never destroyed, like the Devices it points to: ibv_device pointers
	 * stay valid until exit (and LeakSanitizer still sees them reachable). */
	static const std::vector<Device *> *list = [] {
		const Config &cfg = config();
		if (!cfg.error.empty())
			log_error("bad configuration: %s; no emulated device is offered",
				  cfg.error.c_str());
		return new std::vector<Device *>(build_devices(cfg));
	}();
	return *list;
}

Device *to_device(struct ibv_device *dev)
{
	if (!dev)
		return nullptr;
	const auto &list = devices();
	auto it = std::find(list.begin(), list.end(), reinterpret_cast<Device *>(dev));
	return it == list.end() ? nullptr : *it;
}

} // namespace shmverbs
