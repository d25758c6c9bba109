/* SPDX-License-Identifier: MIT */
/*
 * What the broker daemon and its clients share besides the frame layout:
 * the per-user runtime directory that holds the socket and the locks, and
 * frame transfer with descriptor passing (SCM_RIGHTS). No Asio here: the
 * client side uses plain blocking sockets, the daemon calls these on the
 * native handles of its non-blocking Asio sockets.
 */
#pragma once

#include "broker_protocol.h"

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace shmverbs::broker {

/* An owned file descriptor, closed on destruction. */
class UniqueFd {
public:
	UniqueFd() = default;
	explicit UniqueFd(int fd) : fd_(fd) {}
	UniqueFd(UniqueFd &&o) noexcept : fd_(o.release()) {}
	UniqueFd &operator=(UniqueFd &&o) noexcept
	{
		if (this != &o)
			reset(o.release());
		return *this;
	}
	UniqueFd(const UniqueFd &) = delete;
	UniqueFd &operator=(const UniqueFd &) = delete;
	~UniqueFd() { reset(); }

	int get() const { return fd_; }
	explicit operator bool() const { return fd_ >= 0; }
	int release() { return std::exchange(fd_, -1); }
	void reset(int fd = -1);

private:
	int fd_ = -1;
};

/* The runtime directory, in order: $SHMVERBS_RUNTIME_DIR,
 * $XDG_RUNTIME_DIR/shmverbs, /tmp/shmverbs-<euid>. */
std::string default_runtime_dir();

/* Creates `dir` (mode 0700) if it does not exist, then accepts it only if it
 * is a directory (not a symlink) owned by the effective uid with no group or
 * other permission bits. Returns 0 or a positive errno (EPERM: another
 * owner; EACCES: looser mode; ENOTDIR; or what mkdir/lstat said) and then
 * sets *why to a sentence for the log. */
int prepare_runtime_dir(const std::string &dir, std::string *why);

inline std::string runtime_path(const std::string &dir, const char *name)
{
	return dir + "/" + name;
}

/* Sends up to len bytes, passing `fd` (if >= 0) with the first byte. Never
 * raises SIGPIPE. Returns the number of bytes sent or -errno. */
ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd);

/* Sends a whole frame on a blocking socket. Returns 0 or a positive errno. */
int send_frame(int sock, const Frame &frame, int fd = -1);

/* Collects one frame from a stream socket, possibly over several reads, with
 * the descriptors that came with it. Each read asks for no more than the
 * rest of the current frame, so a descriptor is never credited to the wrong
 * frame. Works on blocking and non-blocking sockets. */
class FrameReader {
public:
	/* Returns 1 when a frame is complete (see frame(), take_fds()),
	 * 0 when a non-blocking socket has no more bytes for now, or -errno:
	 * -ECONNRESET at end of stream, -EPROTO when the control data was
	 * truncated (the peer sent more descriptors than we accept). After a
	 * complete frame, the next call starts the next frame. */
	int read(int sock);

	const Frame &frame() const { return frame_; }
	std::vector<UniqueFd> take_fds() { return std::move(fds_); }

private:
	Frame frame_{};
	size_t have_ = 0;
	std::vector<UniqueFd> fds_;
};

/* Checks magic and version. Returns 0 or EPROTO. */
int check_frame_header(const Frame &frame);

} // namespace shmverbs::broker
