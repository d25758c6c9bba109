/* SPDX-License-Identifier: MIT */
/*
 * The peer side of the multi-process broker tests: the test binary
 * re-executed as "--peer <command> [args]". A peer reports on stdout, one
 * line per fact, and waits for orders on stdin; it exits at end of input.
 *
 *   hold N     allocate N QPNs on device 0, print "broker <pid>" and
 *              "ids <n>...", then wait for end of input
 *   once       connect, print "broker <pid>", exit at once
 *   owner      publish a QP in a 4 KiB memfd segment (the text "owner-data"
 *              at offset 256) with an eventfd attached in slot 0; print
 *              "ready <qpn>"; then serve "read" (-> "data <text at 256>"),
 *              "event" (-> "event <eventfd count>")
 *   stall      connect, print "broker <pid>"; on "go" time one Info call and
 *              print "result <errno> <milliseconds>"
 *   segment    publish a QP in this process's own segment of device 0
 *              (lib/segment.h, as the verbs do; the text "segment-data" in
 *              its area), print "broker <pid>" and "ready <qpn>", then
 *              wait for end of input without calling the broker again
 */
#include "broker_client.h"
#include "harness.h"
#include "segment.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

using shmverbs::BrokerClient;
using shmverbs::BrokerInfo;
using shmverbs::ObjectKind;

namespace broker_test {

namespace {

void say(const std::string &line)
{
	std::printf("%s\n", line.c_str());
	std::fflush(stdout);
}

int fail(const char *what, int err)
{
	say(std::string("error ") + what + " " + std::strerror(err));
	return 1;
}

void wait_for_end_of_input()
{
	for (std::string line; std::getline(std::cin, line);) {
	}
}

int hold(int count)
{
	BrokerClient &b = BrokerClient::instance();
	std::string ids = "ids";
	for (int i = 0; i < count; i++) {
		uint32_t id;
		if (int err = b.alloc_id(0, ObjectKind::Qp, &id))
			return fail("alloc_id", err);
		ids += " " + std::to_string(id);
	}
	say("broker " + std::to_string(b.broker_pid()));
	say(ids);
	wait_for_end_of_input();
	return 0;
}

int once()
{
	BrokerClient &b = BrokerClient::instance();
	if (int err = b.connect())
		return fail("connect", err);
	say("broker " + std::to_string(b.broker_pid()));
	return 0;
}

int owner()
{
	BrokerClient &b = BrokerClient::instance();
	constexpr size_t size = 4096, offset = 256;
	int memfd = memfd_create("peer-segment", MFD_CLOEXEC);
	if (memfd < 0 || ftruncate(memfd, size) != 0)
		return fail("memfd", errno);
	auto *mem = static_cast<char *>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
	if (mem == MAP_FAILED)
		return fail("mmap", errno);
	std::strcpy(mem + offset, "owner-data");

	uint64_t segment;
	uint32_t qpn;
	if (int err = b.register_segment(memfd, &segment))
		return fail("register_segment", err);
	if (int err = b.alloc_id(0, ObjectKind::Qp, &qpn))
		return fail("alloc_id", err);
	if (int err = b.publish({0, ObjectKind::Qp, qpn}, segment, offset))
		return fail("publish", err);
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (efd < 0)
		return fail("eventfd", errno);
	if (int err = b.attach_fd({0, ObjectKind::Qp, qpn}, 0, efd))
		return fail("attach_fd", err);
	say("ready " + std::to_string(qpn));

	for (std::string line; std::getline(std::cin, line);) {
		if (line == "read") {
			say(std::string("data ") + (mem + offset));
		} else if (line == "event") {
			uint64_t count = 0;
			if (read(efd, &count, sizeof(count)) != sizeof(count))
				count = 0;
			say("event " + std::to_string(count));
		}
	}
	return 0;
}

int stall()
{
	BrokerClient &b = BrokerClient::instance();
	if (int err = b.connect())
		return fail("connect", err);
	say("broker " + std::to_string(b.broker_pid()));
	std::string line;
	if (!std::getline(std::cin, line) || line != "go")
		return 1;
	auto start = std::chrono::steady_clock::now();
	BrokerInfo info;
	int err = b.info(&info);
	auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
		std::chrono::steady_clock::now() - start);
	say("result " + std::to_string(err) + " " + std::to_string(ms.count()));
	wait_for_end_of_input();
	return 0;
}

int segment_owner()
{
	BrokerClient &b = BrokerClient::instance();
	shmverbs::Segment &seg = shmverbs::Segment::of(0);
	uint32_t qpn;
	if (int err = b.alloc_id(0, ObjectKind::Qp, &qpn))
		return fail("alloc_id", err);
	const uint64_t off = seg.alloc(64);
	if (!off)
		return fail("alloc", ENOMEM);
	std::strcpy(seg.at<char>(off), "segment-data");
	if (int err = seg.publish(ObjectKind::Qp, qpn, off))
		return fail("publish", err);
	say("broker " + std::to_string(b.broker_pid()));
	say("ready " + std::to_string(qpn));
	wait_for_end_of_input();
	return 0;
}

} // namespace

int run_peer(int argc, char **argv)
{
	std::string cmd = argc > 0 ? argv[0] : "";
	if (cmd == "hold" && argc == 2)
		return hold(std::atoi(argv[1]));
	if (cmd == "once")
		return once();
	if (cmd == "owner")
		return owner();
	if (cmd == "stall")
		return stall();
	if (cmd == "segment")
		return segment_owner();
	std::fprintf(stderr, "unknown peer command %s\n", cmd.c_str());
	return 2;
}

} // namespace broker_test
