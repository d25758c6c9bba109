/* SPDX-License-Identifier: MIT */
#include "config.h"

#include <boost/program_options.hpp>

#include <cstdlib>
#include <fstream>
#include <mutex>

namespace po = boost::program_options;

namespace shmverbs {

namespace {

constexpr unsigned max_devices = 64;
constexpr unsigned max_ports = 4;

po::options_description describe(std::string &link_layer, std::string &profile, Config &c)
{
	po::options_description desc("shmverbs");
	desc.add_options()
		("devices", po::value(&c.num_devices), "number of emulated devices")
		("ports", po::value(&c.num_ports), "ports per device")
		("link_layer", po::value(&link_layer), "ib or eth")
		("profile", po::value(&profile), "mlx5, rxe or exact")
		("name_prefix", po::value(&c.name_prefix), "device name prefix");
	return desc;
}

/* SHMVERBS_LINK_LAYER -> "link_layer"; variables we do not know are ignored
 * here (the daemon and the data path read their own). */
std::string env_name_mapper(const std::string &var)
{
	static const char *const known[] = {"DEVICES", "PORTS", "LINK_LAYER", "PROFILE",
					    "NAME_PREFIX"};
	const std::string prefix = "SHMVERBS_";
	if (var.compare(0, prefix.size(), prefix) != 0)
		return {};
	std::string key = var.substr(prefix.size());
	for (const char *k : known) {
		if (key == k) {
			for (char &ch : key)
				ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
			return key;
		}
	}
	return {};
}

} // namespace

Config load_config()
{
	Config c;
	std::string link_layer = "ib";
	std::string profile = "mlx5";
	try {
		po::options_description desc = describe(link_layer, profile, c);
		po::variables_map vm;
		/* Environment first: po::store keeps the first value it sees. */
		po::store(po::parse_environment(desc, env_name_mapper), vm);
		if (const char *path = std::getenv("SHMVERBS_CONFIG"); path && *path) {
			std::ifstream in(path);
			if (!in)
				throw std::runtime_error(std::string("cannot read config file ") + path);
			po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
		}
		po::notify(vm);
	} catch (const std::exception &e) {
		c.error = e.what();
		c.num_devices = 0;
		return c;
	}

	if (link_layer == "ib" || link_layer == "infiniband")
		c.link_layer = LinkLayer::InfiniBand;
	else if (link_layer == "eth" || link_layer == "ethernet" || link_layer == "roce")
		c.link_layer = LinkLayer::Ethernet;
	else
		c.error = "link_layer must be ib or eth, not '" + link_layer + "'";

	if (profile == "mlx5")
		c.profile = ProfileKind::Mlx5;
	else if (profile == "rxe")
		c.profile = ProfileKind::Rxe;
	else if (profile == "exact")
		c.profile = ProfileKind::Exact;
	else
		c.error = "profile must be mlx5, rxe or exact, not '" + profile + "'";

	if (c.num_devices > max_devices)
		c.error = "devices must be at most " + std::to_string(max_devices);
	if (c.num_ports < 1 || c.num_ports > max_ports)
		c.error = "ports must be 1.." + std::to_string(max_ports);
	if (c.name_prefix.empty() || c.name_prefix.size() > 32)
		c.error = "name_prefix must be 1..32 characters";

	if (!c.error.empty())
		c.num_devices = 0;
	return c;
}

const Config &config()
{
	static const Config c = load_config();
	return c;
}

} // namespace shmverbs
