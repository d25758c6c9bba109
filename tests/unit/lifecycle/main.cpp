/* SPDX-License-Identifier: MIT */
/*
 * Lifecycle of peers: processes that die holding things, come and go, fork.
 * The binary re-executes itself as a peer ("--peer ROLE ARGS"); peers talk
 * to the test over stdin/stdout lines. Every wait is bounded.
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "lifecycle.h"

#include <cstring>

int main(int argc, char **argv)
{
	if (argc > 2 && std::strcmp(argv[1], "--peer") == 0)
		return lifecycle::peer_main(argv[2], argc - 3, argv + 3);
	return Catch::Session().run(argc, argv);
}
