/* SPDX-License-Identifier: MIT */
#include "broker_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shmverbs::broker {

void UniqueFd::reset(int fd)
{
	if (fd_ >= 0)
		::close(fd_);
	fd_ = fd;
}

std::string default_runtime_dir()
{
	if (const char *dir = std::getenv("SHMVERBS_RUNTIME_DIR"); dir && *dir)
		return dir;
	if (const char *xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg)
		return std::string(xdg) + "/shmverbs";
	return "/tmp/shmverbs-" + std::to_string(geteuid());
}

int prepare_runtime_dir(const std::string &dir, std::string *why)
{
	if (dir.empty()) {
		*why = "empty runtime directory name";
		return EINVAL;
	}
	/* mkdir applies the umask, which can only remove bits from 0700. */
	if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
		int err = errno;
		*why = "cannot create runtime directory " + dir + ": " + std::strerror(err);
		return err;
	}
	struct stat st;
	if (::lstat(dir.c_str(), &st) != 0) {
		int err = errno;
		*why = "cannot stat runtime directory " + dir + ": " + std::strerror(err);
		return err;
	}
	/* Another user must not be able to plant a socket or a symlink where
	 * we look for our broker, nor to connect to ours. */
	if (!S_ISDIR(st.st_mode)) {
		*why = "runtime directory " + dir + " is not a directory";
		return ENOTDIR;
	}
	if (st.st_uid != geteuid()) {
		*why = "runtime directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
		       ", not by uid " + std::to_string(geteuid());
		return EPERM;
	}
	if (st.st_mode & 077) {
		char mode[8];
		std::snprintf(mode, sizeof(mode), "%04o", unsigned(st.st_mode & 07777));
		*why = "runtime directory " + dir + " has mode " + mode +
		       ", it must not be accessible to group or others (0700)";
		return EACCES;
	}
	return 0;
}

ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd)
{
	struct iovec iov = {const_cast<void *>(buf), len};
	struct msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
	if (fd >= 0) {
		msg.msg_control = control;
		msg.msg_controllen = sizeof(control);
		struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int));
		std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
	}
	ssize_t n;
	do
		n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

int send_frame(int sock, const Frame &frame, int fd)
{
	auto *bytes = reinterpret_cast<const char *>(&frame);
	size_t sent = 0;
	while (sent < sizeof(frame)) {
		/* The descriptor travels with the first byte only. */
		ssize_t n = send_with_fd(sock, bytes + sent, sizeof(frame) - sent, sent ? -1 : fd);
		if (n < 0)
			return n == -EAGAIN ? ETIMEDOUT : int(-n); /* EAGAIN: SO_SNDTIMEO */
		sent += size_t(n);
	}
	return 0;
}

int FrameReader::read(int sock)
{
	if (have_ == sizeof(frame_)) {
		have_ = 0;
		fds_.clear();
	}
	while (have_ < sizeof(frame_)) {
		struct iovec iov = {reinterpret_cast<char *>(&frame_) + have_, sizeof(frame_) - have_};
		struct msghdr msg = {};
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		/* Room for a few descriptors: a well-behaved peer sends at most
		 * one per frame, more are closed and reported as EPROTO. */
		alignas(struct cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
		msg.msg_control = control;
		msg.msg_controllen = sizeof(control);
		ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < count; i++) {
				int fd;
				std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				fds_.emplace_back(fd);
			}
		}
		if (msg.msg_flags & MSG_CTRUNC)
			return -EPROTO;
		if (n == 0)
			return -ECONNRESET;
		have_ += size_t(n);
	}
	return 1;
}

int check_frame_header(const Frame &frame)
{
	if (frame.h.magic != frame_magic || frame.h.version != protocol_version)
		return EPROTO;
	return 0;
}

} // namespace shmverbs::broker
