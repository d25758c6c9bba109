/* SPDX-License-Identifier: MIT */
/*
 * The memshare test binary: Catch2 tests, or, re-executed by the seccomp test
 * as "--seccomp-inner" under a filter that blocks CMA, the checks that must
 * hold there (test_cma.cpp).
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>

int seccomp_inner_main();

int main(int argc, char **argv)
{
	if (argc >= 2 && std::strcmp(argv[1], "--seccomp-inner") == 0)
		return seccomp_inner_main();
	return Catch::Session().run(argc, argv);
}
