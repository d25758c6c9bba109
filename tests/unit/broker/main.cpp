/* SPDX-License-Identifier: MIT */
/*
 * The broker test binary: Catch2 tests, or a peer process when re-executed
 * as "--peer <command>" (peer.cpp).
 */
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "harness.h"

#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
/* The fork test starts the child's reader thread after fork() in a process
 * with threads, which glibc supports and TSan does not try to model. */
extern "C" __attribute__((visibility("default"))) const char *__tsan_default_options()
{
	return "die_after_fork=0";
}
#endif

int main(int argc, char **argv)
{
	if (argc >= 2 && std::strcmp(argv[1], "--peer") == 0)
		return broker_test::run_peer(argc - 2, argv + 2);
	/* Run as `meson test` does even when started by hand: the daemon of
	 * this build, and short idle timeouts so that every case ends with
	 * its daemon gone. */
	setenv("SHMVERBS_BROKER", SHMVERBS_TEST_BROKER_PATH, 0);
	setenv("SHMVERBS_BROKER_IDLE_TIMEOUT", "0.3", 0);
	return Catch::Session().run(argc, argv);
}
