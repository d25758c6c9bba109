/* SPDX-License-Identifier: MIT */
/*
 * The broker's event loop (Boost.Asio, one thread): accepts clients of the
 * same uid on the unix socket, answers their requests from the Directory,
 * passes descriptors, pushes PeerGone when a client disconnects, and stops
 * after it has had no client for the idle timeout.
 *
 * The loop never blocks on a client: sockets are non-blocking, replies wait
 * in a per-connection queue until the socket is writable, and a client that
 * lets that queue overflow is disconnected.
 */
#pragma once

#include "directory.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>

namespace shmverbs::broker {

struct ServerOptions {
	std::string socket_path;
	/* Stop after this long without clients; zero or less: never. */
	std::chrono::milliseconds idle_timeout{10000};
};

class Server {
public:
	Server(boost::asio::io_context &io, ServerOptions options);
	~Server();

	/* Binds the socket (replacing a stale one: the caller holds the daemon
	 * lock) and starts accepting. Returns 0 or a positive errno. */
	int listen();
	/* Disconnects every client, removes the socket and stops the loop. */
	void stop(const char *why);

private:
	struct Connection;
	using ConnectionPtr = std::shared_ptr<Connection>;

	void accept_next();
	void refuse(boost::asio::local::stream_protocol::socket &sock, uid_t uid, pid_t pid);
	void wait_readable(const ConnectionPtr &conn);
	void on_readable(const ConnectionPtr &conn);
	void handle(Connection &conn, const Frame &request, std::vector<UniqueFd> fds);
	/* Carries out one request; returns the reply's status. */
	int serve(Connection &conn, const Frame &request, UniqueFd passed, Frame &reply,
		  UniqueFd &reply_fd);
	void queue(Connection &conn, const Frame &frame, UniqueFd fd = {});
	void flush(const ConnectionPtr &conn);
	void disconnect(Connection &conn, const char *why);
	void arm_idle_timer();

	boost::asio::io_context &io_;
	ServerOptions options_;
	boost::asio::local::stream_protocol::acceptor acceptor_;
	boost::asio::steady_timer idle_timer_;
	Directory directory_;
	std::map<ClientId, ConnectionPtr> connections_;
	ClientId next_client_ = 1;
	bool stopped_ = false;
};

} // namespace shmverbs::broker
