/* SPDX-License-Identifier: MIT */
/*
 * The wire protocol between shmverbs processes and the broker daemon
 * (daemon/shmverbsd), on a SOCK_STREAM unix socket in the runtime directory.
 *
 * Every message is one 64-byte Frame: a 16-byte header and a 48-byte body
 * whose meaning depends on the header's op. Fixed-size frames keep both
 * sides trivial: read exactly sizeof(Frame) bytes, never parse lengths. A
 * frame may carry one file descriptor (SCM_RIGHTS) attached to its first
 * byte; a reader that never reads past the end of the current frame receives
 * that descriptor together with the frame it belongs to.
 *
 * Three kinds of frames:
 *   Request  client -> broker, with a client-chosen request_id;
 *   Reply    broker -> client, the same op and request_id, status 0 or a
 *            positive errno;
 *   Push     broker -> client, unsolicited (request_id 0): Hello, sent first
 *            on every connection, and PeerGone.
 * Both sides are the same build on the same machine: native byte order.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace shmverbs::broker {

/* Bumped on any change to a frame's layout or meaning. A client and a broker
 * of different versions refuse each other (EPROTO). */
inline constexpr uint16_t protocol_version = 1;
inline constexpr uint32_t frame_magic = 0x424d4853; /* "SHMB" in memory */

/* Device indices the broker accepts; the same bound as the configuration's. */
inline constexpr uint32_t max_devices = 64;
/* QP and SRQ numbers are 24-bit; 0 and 1 name the special QPs and are never
 * handed out. */
inline constexpr uint32_t first_object_id = 2;
inline constexpr uint32_t object_id_limit = 1u << 24;
/* Descriptors that can be attached to one object (AttachFd/FetchFd slots),
 * e.g. the eventfd a peer kicks after writing a completion. */
inline constexpr uint32_t fd_slots = 4;

enum class FrameKind : uint8_t {
	Request = 1,
	Reply = 2,
	Push = 3,
};

enum class Op : uint8_t {
	/* Push, first frame on every connection. status 0: welcome; EACCES:
	 * the peer runs as another user and the broker closes the socket. */
	Hello = 1,
	/* Counters of the broker, for diagnostics and tests. */
	Info = 2,
	/* Hands out a free number for (device, kind); the caller owns it. */
	AllocId = 3,
	/* Releases an owned number, its directory entry and attached fds. */
	FreeId = 4,
	/* Registers the shared-memory segment passed as the frame's fd. */
	RegisterSegment = 5,
	/* Drops a registered segment (EBUSY while an object lives in it). */
	UnregisterSegment = 6,
	/* Declares that an owned object lives in a segment at an offset. */
	PublishObject = 7,
	/* Finds the owner of (device, kind, id); the reply carries the
	 * segment's fd. The caller is told if the owner goes away. */
	Resolve = 8,
	/* Attaches the frame's fd to an owned object, in a slot. */
	AttachFd = 9,
	/* Fetches the fd attached to an object's slot. */
	FetchFd = 10,
	/* Push: a process whose objects this client resolved has gone. */
	PeerGone = 64,
};

enum class ObjectKind : uint8_t {
	Qp = 1,
	Srq = 2,
};

inline constexpr bool valid_object_kind(uint8_t k)
{
	return k == uint8_t(ObjectKind::Qp) || k == uint8_t(ObjectKind::Srq);
}

struct FrameHeader {
	uint32_t magic;      /* frame_magic */
	uint16_t version;    /* protocol_version */
	uint8_t kind;        /* FrameKind */
	uint8_t op;          /* Op */
	uint32_t request_id; /* Request/Reply: chosen by the client; Push: 0 */
	int32_t status;      /* Reply, Hello: 0 or a positive errno; else 0 */
};
static_assert(sizeof(FrameHeader) == 16, "header layout is part of the protocol");

/* Names one object on the fabric. */
struct ObjectName {
	uint32_t device; /* device index, < max_devices */
	uint32_t id;     /* QPN or SRQN */
	uint8_t kind;    /* ObjectKind */
	uint8_t reserved[3];
};
static_assert(sizeof(ObjectName) == 12);

/* Hello (push). */
struct HelloBody {
	int32_t broker_pid;
	uint32_t peer_uid;  /* the client's uid as SO_PEERCRED reports it */
	int32_t peer_pid;   /* the client's pid as SO_PEERCRED reports it */
	uint32_t reserved;
	uint64_t client_id; /* the broker's name for this connection */
};

/* Info (reply). */
struct InfoBody {
	int32_t broker_pid;
	uint32_t clients;     /* open connections */
	uint32_t ids_in_use;  /* QPNs + SRQNs over all devices */
	uint32_t segments;    /* registered segments */
	uint32_t published;   /* objects with a segment */
	uint32_t reserved;
	uint64_t ids_handed_out; /* AllocId successes since start */
};

/* AllocId, FreeId, PublishObject, Resolve, AttachFd, FetchFd: one body.
 * Requests fill what their op needs (AllocId: object.id 0; PublishObject:
 * segment, offset; AttachFd/FetchFd: slot); replies echo object and fill
 *   AllocId:  object.id
 *   Resolve:  owner_pid, segment, offset, size (+ the segment's fd)
 *   FetchFd:  owner_pid, offset = the file's identity (+ the attached fd):
 *             equal for two objects of one owner only when they hold the
 *             same open file, never reused; 0 from a broker that cannot tell */
struct ObjectBody {
	ObjectName object;
	uint32_t slot;
	uint64_t segment;
	uint64_t offset;
	uint64_t size;
	int32_t owner_pid;
	uint32_t reserved;
};

/* RegisterSegment (request: the fd; reply: segment, size),
 * UnregisterSegment (request: segment). */
struct SegmentBody {
	uint64_t segment; /* broker-wide handle, never 0, never reused */
	uint64_t size;    /* st_size of the descriptor */
};

/* PeerGone (push). */
struct PeerGoneBody {
	int32_t pid;
	uint32_t reserved;
	uint64_t client_id;
};

inline constexpr size_t frame_body_size = 48;

struct Frame {
	FrameHeader h;
	union {
		uint8_t raw[frame_body_size];
		HelloBody hello;
		InfoBody info;
		ObjectBody object;
		SegmentBody segment;
		PeerGoneBody peer_gone;
	};
};
static_assert(sizeof(HelloBody) <= frame_body_size);
static_assert(sizeof(InfoBody) <= frame_body_size);
static_assert(sizeof(ObjectBody) == frame_body_size, "the largest body fills the frame");
static_assert(sizeof(SegmentBody) <= frame_body_size);
static_assert(sizeof(PeerGoneBody) <= frame_body_size);
static_assert(sizeof(Frame) == 64, "one frame is one 64-byte read");
static_assert(std::is_trivially_copyable_v<Frame> && std::is_standard_layout_v<Frame>);

/* A zeroed frame with a valid header. */
inline Frame make_frame(FrameKind kind, Op op, uint32_t request_id = 0, int32_t status = 0)
{
	Frame f{};
	f.h.magic = frame_magic;
	f.h.version = protocol_version;
	f.h.kind = uint8_t(kind);
	f.h.op = uint8_t(op);
	f.h.request_id = request_id;
	f.h.status = status;
	return f;
}

/* Where things live in the runtime directory. */
inline constexpr const char *socket_name = "broker.sock";
/* Held (flock) by the running daemon for its whole life: a socket file whose
 * lock is free is stale. */
inline constexpr const char *daemon_lock_name = "broker.lock";
/* Held by a client while it checks for and starts a daemon, so that many
 * processes starting at once start one daemon. */
inline constexpr const char *start_lock_name = "start.lock";

} // namespace shmverbs::broker
