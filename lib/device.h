/* SPDX-License-Identifier: MIT */
/*
 * The emulated devices of this process. They are built once from the
 * configuration and live until the process exits, like the sysfs entries a
 * real libibverbs scans; struct ibv_device is their first member so that the
 * pointers handed out by ibv_get_device_list() lead straight back here.
 */
#pragma once

#include "config.h"
#include "profile.h"

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <vector>

namespace shmverbs {

struct GidEntry {
	union ibv_gid gid;
	enum ibv_gid_type gid_type; /* IBV_GID_TYPE_IB, ROCE_V1 or ROCE_V2 */
	bool valid;
};

struct Port {
	uint8_t port_num;
	struct ibv_port_attr attr;
	uint64_t guid; /* host order */
	std::vector<GidEntry> gids; /* gid_tbl_len entries, unused ones invalid */
	std::vector<uint16_t> pkeys; /* pkey_tbl_len entries, unused ones 0 */
};

struct Device {
	struct ibv_device ibv; /* must stay first: ibv_device* <-> Device* */
	uint32_t index;
	const Profile *profile;
	LinkLayer link_layer;
	uint64_t node_guid; /* host order */
	uint64_t sys_image_guid;
	std::vector<Port> ports; /* ports[0] is port 1 */

	struct ibv_device_attr device_attr() const;
	/* nullptr when port_num is out of range */
	const Port *port(uint8_t port_num) const;
};

/* All emulated devices; empty when none are configured. */
const std::vector<Device *> &devices();

/* The emulated Device behind an ibv_device, or nullptr if it is not ours. */
Device *to_device(struct ibv_device *dev);

/* Builds the device table for a configuration (exposed for tests). */
std::vector<Device *> build_devices(const Config &cfg);

} // namespace shmverbs
