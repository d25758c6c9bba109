/* SPDX-License-Identifier: MIT */
/*
 * The client side of the broker (docs/broker.md): one connection per
 * process, made on first use (never at library load), starting the daemon
 * if none runs. Every call blocks until the broker answers or the timeout
 * ($SHMVERBS_BROKER_TIMEOUT seconds, default 5; connecting, which may start
 * the daemon, gets at least 5 s) passes, and returns 0 or a positive errno:
 *   ETIMEDOUT     the broker did not answer in time
 *   ECONNRESET    the broker went away and a restarted one was gone too
 *   EACCES/EPERM  the runtime directory or the broker belongs to another
 *                 user, or has a loose mode (logged with the reason)
 *   EPROTO        the running broker speaks another protocol version
 *   EDEADLK       called from inside the event handler
 * and the broker's own answers (see daemon/directory.h).
 *
 * If the broker dies, the next call reconnects, which starts a new one, and
 * a call that was waiting is sent again once. Everything registered with the
 * old broker is gone then: generation() changes and the event handler gets
 * BrokerLost. A forked child never uses its parent's connection: it makes its
 * own on first use and starts with nothing registered.
 *
 * Thread-safe; calls from several threads run concurrently.
 */
#pragma once

#include "broker_protocol.h"

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace shmverbs {

using broker::ObjectKind;

/* An object on the fabric: a QPN or an SRQN of one device. */
struct BrokerObject {
	uint32_t device;
	ObjectKind kind;
	uint32_t id;
};

struct ResolvedObject {
	pid_t owner_pid = 0;
	uint64_t segment = 0; /* the broker's handle of the owner's segment */
	uint64_t offset = 0;  /* where the object lives in the segment */
	uint64_t size = 0;    /* the segment's size */
	int fd = -1;          /* the segment, to mmap; the caller closes it */
};

struct BrokerInfo {
	pid_t broker_pid = 0;
	uint32_t clients = 0;
	uint32_t ids_in_use = 0;
	uint32_t segments = 0;
	uint32_t published = 0;
	uint64_t ids_handed_out = 0;
};

struct BrokerEvent {
	enum class Type {
		/* A process whose objects we resolved (or whose fds we fetched)
		 * has gone: its numbers are free, its segments dropped. */
		PeerGone,
		/* Our connection to the broker broke: what we registered is
		 * gone. pid is the broker's. */
		BrokerLost,
	};
	Type type;
	pid_t pid;
};

/* Runs on the client's reader thread: keep it short, and do not call the
 * broker from it (EDEADLK). */
using BrokerEventHandler = std::function<void(const BrokerEvent &)>;

class BrokerClient {
public:
	/* The process's client; creating it does not connect. */
	static BrokerClient &instance();

	/* Connects now (every call below also connects on demand). */
	int connect();
	/* Closes the connection; the broker releases everything this process
	 * registered. The next call connects again. */
	void disconnect();
	/* Counts connections: registrations belong to one generation. */
	uint64_t generation() const;
	/* The connected broker's pid, 0 when not connected. */
	pid_t broker_pid() const;

	void set_event_handler(BrokerEventHandler handler);

	/* A fresh number for (device, kind), owned by this process. */
	int alloc_id(uint32_t device, ObjectKind kind, uint32_t *id);
	int free_id(const BrokerObject &object);
	/* Registers a memfd (any regular file) as a segment; *size gets its
	 * size. The broker keeps its own copy of the descriptor. */
	int register_segment(int fd, uint64_t *segment, uint64_t *size = nullptr);
	int unregister_segment(uint64_t segment);
	/* Declares that an owned object lives in an owned segment at offset. */
	int publish(const BrokerObject &object, uint64_t segment, uint64_t offset);
	/* Finds a published object's owner and receives its segment. */
	int resolve(const BrokerObject &object, ResolvedObject *out);
	/* Attaches a copy of fd to an owned object (slot < broker::fd_slots). */
	int attach_fd(const BrokerObject &object, uint32_t slot, int fd);
	/* Receives the descriptor attached to an object; the caller closes it.
	 * *file_id (0: the broker cannot tell) is equal for two objects of one
	 * owner only when they hold the same open file. */
	int fetch_fd(const BrokerObject &object, uint32_t slot, int *fd, pid_t *owner_pid = nullptr,
		     uint64_t *file_id = nullptr);
	int info(BrokerInfo *out);

	struct Connection; /* internal, in broker_client.cpp */

private:
	BrokerClient();
	int current(std::shared_ptr<Connection> *out);
	int call(broker::Frame &request, int fd, broker::Frame *reply, int *reply_fd);
	static void reader_main(std::shared_ptr<Connection> conn);
	static void atfork_prepare();
	static void atfork_parent();
	static void atfork_child();
	void orphan_connection();
	void deliver(const BrokerEvent &event);

	mutable std::mutex lock_; /* conn_, generation_ */
	std::shared_ptr<Connection> conn_;
	uint64_t generation_ = 0;
	std::mutex handler_lock_;
	BrokerEventHandler handler_;
	const double timeout_s_;
};

} // namespace shmverbs
