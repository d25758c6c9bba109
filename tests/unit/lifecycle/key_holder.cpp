/* SPDX-License-Identifier: MIT */
/*
 * A remote holder of an rkey, for the lifecycle tests: it takes the key in
 * the owner's segment exactly as the send engine does for an RDMA operation
 * (dp::acquire_key), says "held", stops itself (SIGSTOP) as if preempted in
 * the middle of the operation, and on SIGCONT releases the key and says
 * "released".
 *
 *   key-holder QPN RKEY     (device 0; QPN: any QP of the owner, to find
 *                            its segment through the broker)
 */
#include "datapath_internal.h"
#include "segment.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

using namespace shmverbs;

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	uint32_t qpn = uint32_t(std::strtoul(argv[1], nullptr, 0));
	uint32_t rkey = uint32_t(std::strtoul(argv[2], nullptr, 0));
	PeerObject obj;
	if (int err = resolve_object(0, broker::ObjectKind::Qp, qpn, obj)) {
		std::printf("resolve failed %d\n", err);
		return 3;
	}
	{
		KeyRef ref = dp::acquire_key(*obj.seg, rkey);
		if (!ref) {
			std::printf("no such key\n");
			return 4;
		}
		std::printf("held\n");
		std::fflush(stdout);
		raise(SIGSTOP);
	}
	std::printf("released\n");
	std::fflush(stdout);
	return 0;
}
