/* SPDX-License-Identifier: MIT */
/*
 * The broker's state, without any I/O: which client owns which QP/SRQ
 * number, which shared-memory segments each client registered, where each
 * published object lives, the descriptors attached to objects, and who
 * resolved whose objects (so that they can be told when the owner goes).
 *
 * Everything is owned by exactly one client, so removing a client removes
 * all it had: a dead process never leaves anything behind that could wedge
 * another. Every function returns 0 or a positive errno:
 *   EINVAL  device, kind, id or slot out of range; offset outside segment
 *   ENOENT  no such number, segment or published object
 *   EPERM   the number or segment belongs to another client
 *   EBUSY   the segment still holds a published object
 *   ENOSPC  the number space of (device, kind) is full
 *   ENODATA nothing attached in that slot
 */
#pragma once

#include "broker_protocol.h"
#include "broker_socket.h"

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

namespace shmverbs::broker {

/* The broker's name for a connection; never reused. */
using ClientId = uint64_t;

struct Resolution {
	pid_t owner_pid = 0;
	uint64_t segment = 0;
	uint64_t offset = 0;
	uint64_t size = 0; /* the segment's current st_size */
	int fd = -1;       /* the segment's descriptor, still owned by the directory */
};

struct DirectoryStats {
	uint32_t clients = 0;
	uint32_t ids_in_use = 0;
	uint32_t segments = 0;
	uint32_t published = 0;
	uint64_t ids_handed_out = 0;
};

/*
 * Where each number space goes on from in a directory that replaces a dead
 * one (its broker killed while its clients live on with their numbers):
 * by key_of(device, kind, 0), the next number to hand out. The numbers a
 * directory hands out stay behind the marks it saved last, so its
 * successor, started from them, gives none of them out again.
 */
using IdMarks = std::map<uint64_t, uint32_t>;

class Directory {
public:
	/* id_limit: numbers are handed out from [first_object_id, id_limit);
	 * tests use a small space to reach wrap-around and exhaustion. `start`:
	 * the marks of a predecessor; `save`, if set, is called with new
	 * marks before a number beyond those it last saved is handed out. */
	explicit Directory(uint32_t id_limit = object_id_limit, IdMarks start = {},
			   std::function<void(const IdMarks &)> save = {});
	/* Numbers handed out between two saves of the marks. */
	static constexpr uint32_t mark_step = 4096;

	void add_client(ClientId client, pid_t pid);
	/* Forgets a client and everything it owned. Returns the other clients
	 * that resolved one of its objects or fetched one of its descriptors
	 * (each once): they are owed a PeerGone. */
	std::vector<ClientId> remove_client(ClientId client);

	int alloc_id(ClientId client, uint32_t device, uint8_t kind, uint32_t *id);
	int free_id(ClientId client, const ObjectName &object);
	int register_segment(ClientId client, UniqueFd fd, uint64_t *segment, uint64_t *size);
	int unregister_segment(ClientId client, uint64_t segment);
	/* An object may be published again, e.g. moved to another segment. A
	 * number this directory never handed out and nobody holds is taken
	 * by the publisher: what a client republishes after its broker died
	 * (the successor's marks keep such numbers out of its own hands). */
	int publish(ClientId client, const ObjectName &object, uint64_t segment, uint64_t offset);
	/* Resolving one's own object is allowed and watches nobody. */
	int resolve(ClientId client, const ObjectName &object, Resolution *out);
	/* Replaces what the slot held. A descriptor naming the same open file
	 * as one the client attached before is closed and that one shared:
	 * processes attach their memory and bounce files to every object they
	 * publish, and a CQ channel to each of its QPs, so the broker holds
	 * one descriptor per file rather than one per object (thousands of
	 * QPs must not exhaust its RLIMIT_NOFILE). */
	int attach_fd(ClientId client, const ObjectName &object, uint32_t slot, UniqueFd fd);
	/* *fd stays owned by the directory. *file_id (if asked) names the open
	 * file: equal for two objects only if they hold the same file, never
	 * reused, so a client can keep one descriptor per file. */
	int fetch_fd(ClientId client, const ObjectName &object, uint32_t slot, int *fd,
		     pid_t *owner_pid, uint64_t *file_id = nullptr);

	DirectoryStats stats() const;

private:
	using Key = uint64_t; /* device, kind and id packed, see key_of() */

	/* An attached descriptor, shared by the objects that name its file. */
	struct AttachedFile {
		UniqueFd fd;
		uint64_t id; /* Directory::next_file_id_ */
	};
	struct Object {
		ClientId owner;
		uint64_t segment = 0; /* 0: not published */
		uint64_t offset = 0;
		std::array<std::shared_ptr<const AttachedFile>, fd_slots> fds;
	};
	struct Segment {
		ClientId owner;
		UniqueFd fd;
		uint32_t published = 0; /* objects that live in it */
	};
	struct Client {
		pid_t pid;
		std::set<Key> objects;
		std::set<uint64_t> segments;
		std::set<ClientId> watchers; /* resolved our objects */
		/* The descriptors its objects hold, by (st_dev, st_ino). */
		std::multimap<std::pair<dev_t, ino_t>, std::weak_ptr<const AttachedFile>> files;
	};
	/* Round-robin cursor of one (device, kind) number space. */
	struct IdSpace {
		uint32_t next = first_object_id;
		uint32_t in_use = 0;
		bool saved = false;     /* a mark was saved for it */
		uint32_t saved_at = 0;  /* the number handed out when it was */
	};
	/* Before number `n` of `space` (key `k`) is handed out: saves new
	 * marks when `n` is mark_step or more past the last save. */
	void keep_mark(uint64_t k, IdSpace &space, uint32_t n);
	/* `n` moved on by `by` in the round-robin order of the space. */
	uint32_t advance(uint32_t n, uint32_t by) const;

	static Key key_of(uint32_t device, uint8_t kind, uint32_t id);
	int check_name(const ObjectName &object) const;
	/* The object if `client` owns it; else nullptr and *err. */
	Object *owned_object(ClientId client, const ObjectName &object, int *err);
	void drop_object(Key key);
	void unpublish(Object &obj);
	std::shared_ptr<const AttachedFile> share_file(Client &c, UniqueFd fd);

	uint32_t id_limit_;
	std::function<void(const IdMarks &)> save_marks_;
	IdMarks marks_;
	uint64_t next_segment_ = 1;
	uint64_t next_file_id_ = 1;
	uint64_t ids_handed_out_ = 0;
	uint32_t published_ = 0;
	std::map<ClientId, Client> clients_;
	std::unordered_map<Key, Object> objects_;
	std::unordered_map<uint64_t, Segment> segments_;
	std::map<uint64_t, IdSpace> spaces_; /* key_of(device, kind, 0) */
};

} // namespace shmverbs::broker
