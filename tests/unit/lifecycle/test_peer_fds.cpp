/* SPDX-License-Identifier: MIT */
/*
 * A long-running process talking to many short-lived peers keeps none of
 * their descriptors: the mapped segment and its lock file, the completion
 * channel's eventfd and the memory file are dropped when the broker reports
 * the peer gone (PeerGone), whether the peer exited or was killed.
 */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <signal.h>

#include <vector>

using namespace lifecycle;

namespace {

struct Sender : UdEnd {
	/* One SEND to a new peer; it exits (or is killed, `kill`) after it. */
	void talk_to_a_peer(bool kill_it)
	{
		Proc peer({"self", "--peer", "ud-receiver", kill_it ? "wait" : "exit"});
		unsigned qpn = 0;
		std::string l = peer.line();
		REQUIRE(std::sscanf(l.c_str(), "qpn %u", &qpn) == 1);
		REQUIRE(post_send(dev.qp, mr, buf, 0, ah, qpn) == 0);
		struct ibv_wc wc{};
		REQUIRE(eventually([&] { return ibv_poll_cq(dev.cq, 1, &wc) == 1; }));
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(peer.line() == "got 0");
		if (kill_it)
			kill(peer.pid, SIGKILL);
		CHECK(peer.reap() == (kill_it ? 128 + SIGKILL : 0));
	}
};

} // namespace

TEST_CASE("descriptors of departed peers are closed: many peers come and go",
	  "[lifecycle][peer-fds]")
{
	Sender s;
	/* The first peer brings up what stays (broker connection, threads). */
	s.talk_to_a_peer(false);
	std::this_thread::sleep_for(std::chrono::milliseconds(200));
	const int before = count_fds();
	constexpr int peers = 24;
	for (int i = 0; i < peers; i++)
		s.talk_to_a_peer(i % 2 == 1);
	/* PeerGone arrives asynchronously, once per peer. */
	int after = before;
	CHECK(eventually([&] { return (after = count_fds()) <= before; }, 10000));
	CAPTURE(before, after);
	CHECK(after <= before);
}

namespace {

/* One SEND to a new "ud-receiver wait" peer, armed or not: the eventfds
 * this process holds once the peer got its message, before it goes. */
int eventfds_after_send(UdEnd &s, bool armed)
{
	std::vector<std::string> args = {"self", "--peer", "ud-receiver", "wait"};
	if (armed)
		args.push_back("armed");
	Proc peer(args);
	unsigned qpn = 0;
	std::string l = peer.line();
	REQUIRE(std::sscanf(l.c_str(), "qpn %u", &qpn) == 1);
	REQUIRE(post_send(s.dev.qp, s.mr, s.buf, 0, s.ah, qpn) == 0);
	struct ibv_wc wc{};
	REQUIRE(eventually([&] { return ibv_poll_cq(s.dev.cq, 1, &wc) == 1; }));
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(peer.line() == "got 0");
	const int n = count_eventfds();
	peer.send("bye");
	CHECK(peer.reap() == 0);
	return n;
}

} // namespace

TEST_CASE("a SEND looks up the receiver's channel eventfd only to signal it",
	  "[lifecycle][peer-fds]")
{
	/* The receiver's CQ has a completion channel. Not armed, the SEND
	 * owes it no token, and the sender does not fetch (nor keep) the
	 * descriptor: a lookup per SEND into every event-driven receiver's
	 * CQ. Armed, the SEND disarms it and writes the token the receiver
	 * waits for, through the descriptor it fetches then. */
	Sender s;
	s.talk_to_a_peer(false); /* what stays (broker connection, threads) */
	const int before = count_eventfds();
	CHECK(eventfds_after_send(s, false) == before);
	CHECK(eventfds_after_send(s, true) == before + 1);
}
