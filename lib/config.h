/* SPDX-License-Identifier: MIT */
/*
 * Configuration of the emulated fabric: how many devices, how many ports,
 * which link layer and which device profile. Read once per process from the
 * environment (SHMVERBS_*) and an optional config file; docs/configuration.md
 * lists every key.
 */
#pragma once

#include <string>

namespace shmverbs {

enum class LinkLayer { InfiniBand, Ethernet };
enum class ProfileKind { Mlx5, Rxe, Exact };

struct Config {
	unsigned num_devices = 1;
	unsigned num_ports = 1;
	LinkLayer link_layer = LinkLayer::InfiniBand;
	ProfileKind profile = ProfileKind::Mlx5;
	std::string name_prefix = "shm";
	/* Non-empty when the configuration could not be used; no device is
	 * then offered, and the message says why. */
	std::string error;
};

/* Parses environment and config file; never throws. */
Config load_config();

/* The configuration this process uses (loaded on first call). */
const Config &config();

} // namespace shmverbs
