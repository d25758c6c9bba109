/* SPDX-License-Identifier: MIT */
#include "config.h"
#include "device.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <unistd.h>

using namespace shmverbs;

namespace {

struct EnvGuard {
	const char *name;
	explicit EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
	~EnvGuard() { unsetenv(name); }
};

} // namespace

TEST_CASE("default configuration is one IB device with one port, mlx5 profile", "[config]")
{
	Config c = load_config();
	CHECK(c.error.empty());
	CHECK(c.num_devices == 1);
	CHECK(c.num_ports == 1);
	CHECK(c.link_layer == LinkLayer::InfiniBand);
	CHECK(c.profile == ProfileKind::Mlx5);
}

TEST_CASE("environment selects devices, ports, link layer and profile", "[config]")
{
	EnvGuard d("SHMVERBS_DEVICES", "3"), p("SHMVERBS_PORTS", "2"),
		l("SHMVERBS_LINK_LAYER", "eth"), f("SHMVERBS_PROFILE", "rxe");
	Config c = load_config();
	REQUIRE(c.error.empty());
	CHECK(c.num_devices == 3);
	CHECK(c.num_ports == 2);
	CHECK(c.link_layer == LinkLayer::Ethernet);
	CHECK(c.profile == ProfileKind::Rxe);
}

TEST_CASE("bad configuration offers no device and says why", "[config]")
{
	SECTION("unknown profile")
	{
		EnvGuard f("SHMVERBS_PROFILE", "cx9");
		Config c = load_config();
		CHECK(c.num_devices == 0);
		CHECK(c.error.find("profile") != std::string::npos);
	}
	SECTION("too many ports")
	{
		EnvGuard p("SHMVERBS_PORTS", "9");
		Config c = load_config();
		CHECK(c.num_devices == 0);
		CHECK(c.error.find("ports") != std::string::npos);
	}
	SECTION("not a number")
	{
		EnvGuard d("SHMVERBS_DEVICES", "many");
		Config c = load_config();
		CHECK(c.num_devices == 0);
		CHECK_FALSE(c.error.empty());
	}
	SECTION("missing config file")
	{
		EnvGuard f("SHMVERBS_CONFIG", "/nonexistent/shmverbs.conf");
		Config c = load_config();
		CHECK(c.num_devices == 0);
		CHECK(c.error.find("/nonexistent/shmverbs.conf") != std::string::npos);
	}
}

TEST_CASE("config file is read and the environment overrides it", "[config]")
{
	char path[] = "/tmp/shmverbs-conf-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0);
	const char text[] = "# test\ndevices = 2\nlink_layer = eth\nprofile = exact\n";
	REQUIRE(write(fd, text, sizeof(text) - 1) == ssize_t(sizeof(text) - 1));
	close(fd);
	EnvGuard f("SHMVERBS_CONFIG", path), d("SHMVERBS_DEVICES", "4");
	Config c = load_config();
	unlink(path);
	REQUIRE(c.error.empty());
	CHECK(c.num_devices == 4);
	CHECK(c.link_layer == LinkLayer::Ethernet);
	CHECK(c.profile == ProfileKind::Exact);
}

TEST_CASE("devices get distinct names, GUIDs and LIDs", "[config][device]")
{
	Config c;
	c.num_devices = 2;
	c.num_ports = 2;
	auto devs = build_devices(c);
	REQUIRE(devs.size() == 2);
	CHECK(std::string(devs[0]->ibv.name) == "shm0");
	CHECK(std::string(devs[1]->ibv.name) == "shm1");
	CHECK(devs[0]->node_guid != devs[1]->node_guid);
	CHECK(devs[0]->ports[0].attr.lid != devs[0]->ports[1].attr.lid);
	CHECK(devs[0]->ports[1].attr.lid != devs[1]->ports[0].attr.lid);
	CHECK(devs[0]->port(0) == nullptr);
	CHECK(devs[0]->port(3) == nullptr);
	for (auto *d : devs)
		delete d;
}
