/* SPDX-License-Identifier: MIT */
/*
 * Fixtures shared by the tests that go through the public verbs API: an open
 * context on the first emulated device, optionally with a PD. Both release
 * what they hold at scope end and check that the release succeeded.
 */
#pragma once

#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

namespace shmv_test {

struct OpenDevice {
	struct ibv_device *dev = nullptr;
	struct ibv_context *ctx = nullptr;

	OpenDevice()
	{
		struct ibv_device **list = ibv_get_device_list(nullptr);
		REQUIRE(list);
		REQUIRE(list[0]);
		dev = list[0];
		ctx = ibv_open_device(dev);
		ibv_free_device_list(list);
		REQUIRE(ctx);
	}
	~OpenDevice() { CHECK(ibv_close_device(ctx) == 0); }
	OpenDevice(const OpenDevice &) = delete;
	OpenDevice &operator=(const OpenDevice &) = delete;
};

struct DeviceWithPd : OpenDevice {
	struct ibv_pd *pd = nullptr;

	DeviceWithPd()
	{
		pd = ibv_alloc_pd(ctx);
		REQUIRE(pd);
	}
	~DeviceWithPd() { CHECK(ibv_dealloc_pd(pd) == 0); }
};

} // namespace shmv_test
