/* SPDX-License-Identifier: MIT */
/*
 * ibv_dereg_mr and a remote process holding the key (item: a peer that died
 * holding a key must not hang dereg). The holder is a real process that
 * takes the key in our segment exactly as the send engine does and then
 * stops itself in the middle of its "operation" (tests/unit/lifecycle/
 * key_holder.cpp).
 */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <vector>

using namespace lifecycle;

namespace {

struct HeldKey {
	Dev dev{IBV_QPT_RC};
	/* On the heap, beside other objects: the holder is fork()ed while it
	 * is registered, and nothing the child does may reach these pages. */
	std::vector<char> buf = std::vector<char>(4096);
	struct ibv_mr *mr = nullptr;

	HeldKey()
	{
		mr = ibv_reg_mr(dev.pd, buf.data(), buf.size(),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		REQUIRE(mr);
	}
	std::vector<std::string> holder_argv() const
	{
		const char *path = getenv("SHMVERBS_TEST_KEY_HOLDER");
		REQUIRE(path);
		return {path, std::to_string(dev.qp->qp_num), std::to_string(mr->rkey)};
	}
};

} // namespace

TEST_CASE("dereg_mr waits while a live process holds the key, and returns when it lets go",
	  "[lifecycle][dead-holder]")
{
	HeldKey k;
	Proc holder(k.holder_argv());
	REQUIRE(holder.line() == "held");
	REQUIRE(holder.wait_stopped());
	int rc = -1;
	{
		Call dereg([&] { rc = ibv_dereg_mr(k.mr); });
		/* Stopped, but alive: its operation may still touch the memory. */
		CHECK_FALSE(dereg.wait(300));
		REQUIRE(kill(holder.pid, SIGCONT) == 0);
		CHECK(holder.line() == "released");
		CHECK(dereg.wait(5000));
	}
	CHECK(rc == 0);
	CHECK(holder.reap() == 0);
}

TEST_CASE("dereg_mr returns promptly when the process holding the key is killed mid-hold",
	  "[lifecycle][dead-holder]")
{
	for (bool reaped : {false, true}) {
		CAPTURE(reaped);
		HeldKey k;
		Proc holder(k.holder_argv());
		REQUIRE(holder.line() == "held");
		REQUIRE(holder.wait_stopped());
		int rc = -1;
		{
			Call dereg([&] { rc = ibv_dereg_mr(k.mr); });
			CHECK_FALSE(dereg.wait(200));
			REQUIRE(kill(holder.pid, SIGKILL) == 0);
			/* Unreaped, the holder is a zombie: as dead as a reaped one. */
			if (reaped)
				CHECK(holder.reap() == 128 + SIGKILL);
			auto t0 = std::chrono::steady_clock::now();
			CHECK(dereg.wait(1000));
			CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
		}
		CHECK(rc == 0);
	}
}
