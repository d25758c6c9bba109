/* SPDX-License-Identifier: MIT */
#include "broker_client.h"
#include "broker_socket.h"
#include "log.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#ifndef SHMVERBS_BROKER_INSTALL_PATH
#define SHMVERBS_BROKER_INSTALL_PATH "/usr/local/bin/shmverbsd"
#endif

extern char **environ;

namespace shmverbs {

using namespace broker;
using Clock = std::chrono::steady_clock;

/* One connection to one broker. The reader thread and every caller share
 * it; a caller that finds it broken makes a new one. */
struct BrokerClient::Connection {
	UniqueFd sock;
	pid_t owner_pid = 0;  /* getpid() when made: other processes never use it */
	pid_t broker_pid = 0;
	uint64_t generation = 0;

	struct Pending {
		bool done = false;
		Frame reply{};
		UniqueFd fd;
	};

	std::mutex lock; /* everything below */
	std::condition_variable replied;
	std::map<uint32_t, Pending *> pending;
	uint32_t next_request = 1;
	bool broken = false;  /* the reader saw the end: no more requests */
	bool closing = false; /* we ended it on purpose: no BrokerLost */
	std::mutex send_lock; /* one frame at a time on the socket */

	/* After fork(), the child's copy is never used nor freed: its locks
	 * may be held by threads that do not exist there. */
	std::shared_ptr<Connection> keep_alive;
	Connection *next_orphan = nullptr;
};

namespace {

/* Set on the reader thread, where a blocking call would wait for itself. */
thread_local bool on_reader_thread = false;
/* Connections inherited over fork(), kept reachable (see keep_alive). */
BrokerClient::Connection *orphans = nullptr;

double timeout_from_env()
{
	const char *v = std::getenv("SHMVERBS_BROKER_TIMEOUT");
	if (!v || !*v)
		return 5;
	char *end;
	double d = std::strtod(v, &end);
	if (*end || !std::isfinite(d) || d <= 0) {
		log_error("SHMVERBS_BROKER_TIMEOUT=%s is not a number of seconds; using 5", v);
		return 5;
	}
	return d;
}

struct timeval to_timeval(double seconds)
{
	struct timeval tv;
	tv.tv_sec = time_t(seconds);
	tv.tv_usec = suseconds_t((seconds - double(tv.tv_sec)) * 1e6);
	return tv;
}

/* Errors that mean "nobody serves the socket right now": start a broker. */
bool nobody_serves(int err)
{
	return err == ENOENT || err == ECONNREFUSED || err == ECONNRESET;
}

/* Connects and reads the broker's Hello. */
int open_connection(const std::string &path, double timeout_s, UniqueFd *out, HelloBody *hello)
{
	struct sockaddr_un addr = {};
	addr.sun_family = AF_UNIX;
	if (path.size() >= sizeof(addr.sun_path))
		return ENAMETOOLONG;
	std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
	UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	if (!fd)
		return errno;
	/* Bounds connect() on a full backlog, every send, and the Hello. */
	struct timeval tv = to_timeval(timeout_s);
	::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0)
		return errno == EAGAIN ? ETIMEDOUT : errno;

	struct ucred cred = {};
	socklen_t len = sizeof(cred);
	if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
		return errno;
	if (cred.uid != geteuid()) {
		log_error("broker at %s runs as uid %u, not as our uid %u", path.c_str(),
			  unsigned(cred.uid), unsigned(geteuid()));
		return EACCES;
	}

	FrameReader reader;
	int r = reader.read(fd.get());
	if (r == 0)
		return ETIMEDOUT; /* SO_RCVTIMEO */
	if (r < 0)
		return -r;
	const Frame &f = reader.frame();
	if (check_frame_header(f) || f.h.kind != uint8_t(FrameKind::Push) ||
	    f.h.op != uint8_t(Op::Hello)) {
		log_error("the broker at %s speaks another protocol (version %u, ours %u); "
			  "stop it or use another SHMVERBS_RUNTIME_DIR",
			  path.c_str(), unsigned(f.h.version), unsigned(protocol_version));
		return EPROTO;
	}
	if (f.h.status) {
		log_error("the broker at %s refused us: %s", path.c_str(), std::strerror(f.h.status));
		return f.h.status;
	}
	/* From now on the reader thread waits for as long as the connection
	 * lives; callers bound their own waits. */
	tv = {};
	::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	*hello = f.hello;
	*out = std::move(fd);
	return 0;
}

/* The daemon to start: $SHMVERBS_BROKER, next to the library that holds
 * this code (or in the build tree's daemon/), or the configured install
 * path. */
std::string daemon_path()
{
	if (const char *env = std::getenv("SHMVERBS_BROKER"); env && *env)
		return env;
	std::vector<std::string> candidates;
	Dl_info info;
	if (::dladdr(reinterpret_cast<void *>(&daemon_path), &info) && info.dli_fname) {
		std::string lib = info.dli_fname;
		std::string dir = lib.find('/') == std::string::npos ? "." : lib.substr(0, lib.rfind('/'));
		candidates.push_back(dir + "/shmverbsd");
		candidates.push_back(dir + "/../daemon/shmverbsd");
	}
	candidates.push_back(SHMVERBS_BROKER_INSTALL_PATH);
	for (const std::string &c : candidates) {
		if (::access(c.c_str(), X_OK) == 0)
			return c;
	}
	return {};
}

/* Runs shmverbsd, which detaches and exits once its daemon listens. */
int spawn_daemon(const std::string &dir, Clock::time_point deadline)
{
	std::string path = daemon_path();
	if (path.empty()) {
		log_error("cannot find the broker daemon shmverbsd (looked next to the library and "
			  "at %s); set SHMVERBS_BROKER to its path",
			  SHMVERBS_BROKER_INSTALL_PATH);
		return ENOENT;
	}
	std::vector<std::string> args = {path, "--runtime-dir", dir};
	if (debug_enabled()) {
		args.push_back("--verbose");
		args.push_back("--log-file");
		args.push_back(dir + "/broker.log");
	}
	std::vector<char *> argv;
	for (std::string &a : args)
		argv.push_back(a.data());
	argv.push_back(nullptr);

	/* The daemon must not inherit our descriptors (it would keep them open
	 * for its whole life), our signal mask or ignored signals, nor our
	 * session (a terminal's hangup must not reach it). */
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_addclosefrom_np(&actions, 3);
	posix_spawnattr_t attr;
	posix_spawnattr_init(&attr);
	sigset_t none, all;
	sigemptyset(&none);
	sigfillset(&all);
	sigdelset(&all, SIGKILL);
	sigdelset(&all, SIGSTOP);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &all);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
						POSIX_SPAWN_SETSIGDEF);
	pid_t pid;
	int err = posix_spawn(&pid, path.c_str(), &actions, &attr, argv.data(), environ);
	posix_spawnattr_destroy(&attr);
	posix_spawn_file_actions_destroy(&actions);
	if (err) {
		log_error("cannot start the broker %s: %s", path.c_str(), std::strerror(err));
		return err;
	}
	log_debug("started broker %s (pid %d)", path.c_str(), int(pid));

	for (;;) {
		int status;
		pid_t r = ::waitpid(pid, &status, WNOHANG);
		if (r == pid) {
			if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
				return 0;
			log_error("the broker %s failed to start (status %d); run it with "
				  "--foreground --verbose to see why",
				  path.c_str(), WIFEXITED(status) ? WEXITSTATUS(status) : -1);
			return ECONNREFUSED;
		}
		/* The application reaps its children itself (or ignores
		 * SIGCHLD): connecting will tell whether it worked. */
		if (r < 0 && errno != EINTR)
			return 0;
		if (Clock::now() > deadline)
			return ETIMEDOUT;
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
	}
}

/* Starts a broker unless another process did so first. The start lock makes
 * many processes that start at once start one broker. */
int start_and_connect(const std::string &dir, double timeout_s, Clock::time_point deadline,
		      UniqueFd *out, HelloBody *hello, bool *start_failed)
{
	std::string lock_path = runtime_path(dir, start_lock_name);
	UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
	if (!lock)
		return errno;
	while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK && errno != EINTR)
			return errno;
		if (Clock::now() > deadline)
			return ETIMEDOUT;
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
	}
	std::string sock = runtime_path(dir, socket_name);
	int err = open_connection(sock, timeout_s, out, hello);
	if (!err || !nobody_serves(err))
		return err; /* someone started it while we waited for the lock */
	if ((err = spawn_daemon(dir, deadline))) {
		*start_failed = true;
		return err;
	}
	return open_connection(sock, timeout_s, out, hello);
}

/* Starting a broker may have to wait for an exiting one (up to 3 s, see
 * daemon/main.cpp), so connecting gets at least this long. */
constexpr double min_start_timeout_s = 5;

int connect_or_start(double timeout_s, UniqueFd *out, HelloBody *hello)
{
	std::string dir = default_runtime_dir();
	std::string why;
	if (int err = prepare_runtime_dir(dir, &why)) {
		log_error("broker: %s", why.c_str());
		return err;
	}
	std::string sock = runtime_path(dir, socket_name);
	auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
		std::chrono::duration<double>(std::max(timeout_s, min_start_timeout_s)));
	int err = 0;
	/* A broker can exit (idle) just as we connect: then we start the next
	 * one. A few rounds, within one deadline. */
	for (int round = 0; round < 3 && Clock::now() <= deadline; round++) {
		err = open_connection(sock, timeout_s, out, hello);
		if (!err || !nobody_serves(err))
			return err;
		bool start_failed = false;
		err = start_and_connect(dir, timeout_s, deadline, out, hello, &start_failed);
		if (!err || !nobody_serves(err) || start_failed)
			return err;
	}
	return err ? err : ETIMEDOUT;
}

} // namespace

BrokerClient::BrokerClient() : timeout_s_(timeout_from_env()) {}

BrokerClient &BrokerClient::instance()
{
	/* Never destroyed: the reader thread may outlive static destructors. */
	static BrokerClient *client = [] {
		auto *c = new BrokerClient();
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
		return c;
	}();
	return *client;
}

void BrokerClient::atfork_prepare()
{
	BrokerClient &c = instance();
	c.lock_.lock();
	c.handler_lock_.lock();
}

void BrokerClient::atfork_parent()
{
	BrokerClient &c = instance();
	c.handler_lock_.unlock();
	c.lock_.unlock();
}

void BrokerClient::atfork_child()
{
	BrokerClient &c = instance();
	c.handler_lock_.unlock();
	c.lock_.unlock();
	c.orphan_connection();
}

/* Forgets a connection inherited from the parent: close our copy of the
 * socket (never shutdown(): that would cut the parent's connection too), so
 * that the broker sees the parent go when the parent goes. */
void BrokerClient::orphan_connection()
{
	if (!conn_)
		return;
	Connection *c = conn_.get();
	::close(c->sock.release());
	c->keep_alive = std::move(conn_);
	c->next_orphan = orphans;
	orphans = c;
}

int BrokerClient::current(std::shared_ptr<Connection> *out)
{
	std::lock_guard guard(lock_);
	if (conn_ && conn_->owner_pid != getpid())
		orphan_connection(); /* forked without running our atfork handler */
	if (conn_) {
		std::lock_guard g(conn_->lock);
		if (!conn_->broken) {
			*out = conn_;
			return 0;
		}
	}
	conn_.reset();

	UniqueFd sock;
	HelloBody hello;
	if (int err = connect_or_start(timeout_s_, &sock, &hello))
		return err;
	auto c = std::make_shared<Connection>();
	c->sock = std::move(sock);
	c->owner_pid = getpid();
	c->broker_pid = hello.broker_pid;
	c->generation = ++generation_;

	/* The reader takes no signal meant for the application's threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int err = 0;
	try {
		std::thread(reader_main, c).detach();
	} catch (const std::system_error &e) {
		err = e.code().value() ? e.code().value() : EAGAIN;
	}
	pthread_sigmask(SIG_SETMASK, &old, nullptr);
	if (err)
		return err;
	log_debug("broker: connected to pid %d as client %llu (generation %llu)", int(c->broker_pid),
		  static_cast<unsigned long long>(hello.client_id),
		  static_cast<unsigned long long>(c->generation));
	conn_ = c;
	*out = std::move(c);
	return 0;
}

int BrokerClient::connect()
{
	if (on_reader_thread)
		return EDEADLK;
	std::shared_ptr<Connection> c;
	return current(&c);
}

void BrokerClient::disconnect()
{
	std::shared_ptr<Connection> c;
	{
		std::lock_guard guard(lock_);
		if (conn_ && conn_->owner_pid != getpid()) {
			orphan_connection();
			return;
		}
		c = std::move(conn_);
	}
	if (!c)
		return;
	{
		std::lock_guard g(c->lock);
		c->closing = true;
	}
	/* Wakes the reader, which then releases the socket. */
	::shutdown(c->sock.get(), SHUT_RDWR);
}

uint64_t BrokerClient::generation() const
{
	std::lock_guard guard(lock_);
	return generation_;
}

pid_t BrokerClient::broker_pid() const
{
	std::lock_guard guard(lock_);
	return conn_ && conn_->owner_pid == getpid() ? conn_->broker_pid : 0;
}

void BrokerClient::set_event_handler(BrokerEventHandler handler)
{
	std::lock_guard guard(handler_lock_);
	handler_ = std::move(handler);
}

void BrokerClient::deliver(const BrokerEvent &event)
{
	BrokerEventHandler handler;
	{
		std::lock_guard guard(handler_lock_);
		handler = handler_;
	}
	if (!handler)
		return;
	try {
		handler(event);
	} catch (...) {
		log_error("broker: the event handler threw; event dropped");
	}
}

void BrokerClient::reader_main(std::shared_ptr<Connection> c)
{
	on_reader_thread = true;
	pthread_setname_np(pthread_self(), "shmverbs-broker");
	FrameReader reader;
	for (;;) {
		int r = reader.read(c->sock.get());
		if (r <= 0)
			break;
		const Frame &f = reader.frame();
		if (check_frame_header(f))
			break; /* not our broker's language: treat it as lost */
		if (f.h.kind == uint8_t(FrameKind::Reply)) {
			std::vector<UniqueFd> fds = reader.take_fds();
			std::lock_guard guard(c->lock);
			auto it = c->pending.find(f.h.request_id);
			if (it == c->pending.end())
				continue; /* its caller timed out; fds are closed */
			it->second->reply = f;
			if (!fds.empty())
				it->second->fd = std::move(fds.front());
			it->second->done = true;
			c->replied.notify_all();
		} else if (f.h.kind == uint8_t(FrameKind::Push) && f.h.op == uint8_t(Op::PeerGone)) {
			instance().deliver({BrokerEvent::Type::PeerGone, f.peer_gone.pid});
		}
	}
	bool lost;
	{
		std::lock_guard guard(c->lock);
		c->broken = true;
		lost = !c->closing;
		c->replied.notify_all();
	}
	/* Ended by the broker or by garbage on the socket: make sure the broker
	 * sees us go too (our socket is closed only when the last caller lets
	 * go of the connection). */
	::shutdown(c->sock.get(), SHUT_RDWR);
	if (lost) {
		log_debug("broker: lost the connection to pid %d", int(c->broker_pid));
		instance().deliver({BrokerEvent::Type::BrokerLost, c->broker_pid});
	}
}

int BrokerClient::call(Frame &req, int fd, Frame *reply, int *reply_fd)
{
	if (on_reader_thread)
		return EDEADLK;
	/* A broker that died before answering: its state died with it, so the
	 * request goes once more to the broker the reconnect starts. */
	for (int attempt = 0;; attempt++) {
		std::shared_ptr<Connection> c;
		if (int err = current(&c))
			return err;

		Connection::Pending p;
		uint32_t id = 0;
		{
			std::lock_guard guard(c->lock);
			if (!c->broken) {
				id = c->next_request++;
				if (id == 0) /* 0 is the pushes' */
					id = c->next_request++;
				c->pending[id] = &p;
			}
		}
		int err = id ? 0 : ECONNRESET;
		if (id) {
			req.h.request_id = id;
			{
				std::lock_guard guard(c->send_lock);
				err = send_frame(c->sock.get(), req, fd);
			}
			auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
							 std::chrono::duration<double>(timeout_s_));
			std::unique_lock guard(c->lock);
			if (!err)
				c->replied.wait_until(guard, deadline, [&] { return p.done || c->broken; });
			c->pending.erase(id);
			if (p.done) {
				*reply = p.reply;
				if (reply->h.op != req.h.op)
					return EPROTO;
				if (reply_fd)
					*reply_fd = p.fd.release();
				return reply->h.status;
			}
			if (!err) {
				err = c->broken ? ECONNRESET : ETIMEDOUT;
			} else if (err == EPIPE || err == ECONNRESET) {
				/* Do not wait for the reader to notice: the retry
				 * must not pick this connection again. */
				c->broken = true;
				err = ECONNRESET;
			}
		}
		if (err != ECONNRESET || attempt > 0)
			return err;
	}
}

int BrokerClient::alloc_id(uint32_t device, ObjectKind kind, uint32_t *id)
{
	if (!id)
		return EINVAL;
	Frame req = make_frame(FrameKind::Request, Op::AllocId);
	Frame reply{};
	req.object.object.device = device;
	req.object.object.kind = uint8_t(kind);
	int err = call(req, -1, &reply, nullptr);
	if (!err)
		*id = reply.object.object.id;
	return err;
}

namespace {
Frame object_request(Op op, const BrokerObject &o)
{
	Frame f = make_frame(FrameKind::Request, op);
	f.object.object.device = o.device;
	f.object.object.id = o.id;
	f.object.object.kind = uint8_t(o.kind);
	return f;
}
} // namespace

int BrokerClient::free_id(const BrokerObject &object)
{
	Frame req = object_request(Op::FreeId, object);
	Frame reply{};
	return call(req, -1, &reply, nullptr);
}

int BrokerClient::register_segment(int fd, uint64_t *segment, uint64_t *size)
{
	if (fd < 0)
		return EBADF;
	if (!segment)
		return EINVAL;
	Frame req = make_frame(FrameKind::Request, Op::RegisterSegment);
	Frame reply{};
	int err = call(req, fd, &reply, nullptr);
	if (err)
		return err;
	*segment = reply.segment.segment;
	if (size)
		*size = reply.segment.size;
	return 0;
}

int BrokerClient::unregister_segment(uint64_t segment)
{
	Frame req = make_frame(FrameKind::Request, Op::UnregisterSegment);
	Frame reply{};
	req.segment.segment = segment;
	return call(req, -1, &reply, nullptr);
}

int BrokerClient::publish(const BrokerObject &object, uint64_t segment, uint64_t offset)
{
	Frame req = object_request(Op::PublishObject, object);
	Frame reply{};
	req.object.segment = segment;
	req.object.offset = offset;
	return call(req, -1, &reply, nullptr);
}

int BrokerClient::resolve(const BrokerObject &object, ResolvedObject *out)
{
	if (!out)
		return EINVAL;
	Frame req = object_request(Op::Resolve, object);
	Frame reply{};
	int fd = -1;
	int err = call(req, -1, &reply, &fd);
	UniqueFd owned(fd);
	if (err)
		return err;
	if (!owned)
		return EPROTO;
	out->owner_pid = reply.object.owner_pid;
	out->segment = reply.object.segment;
	out->offset = reply.object.offset;
	out->size = reply.object.size;
	out->fd = owned.release();
	return 0;
}

int BrokerClient::attach_fd(const BrokerObject &object, uint32_t slot, int fd)
{
	if (fd < 0)
		return EBADF;
	Frame req = object_request(Op::AttachFd, object);
	Frame reply{};
	req.object.slot = slot;
	return call(req, fd, &reply, nullptr);
}

int BrokerClient::fetch_fd(const BrokerObject &object, uint32_t slot, int *fd, pid_t *owner_pid,
			   uint64_t *file_id)
{
	if (!fd)
		return EINVAL;
	Frame req = object_request(Op::FetchFd, object);
	Frame reply{};
	req.object.slot = slot;
	int got = -1;
	int err = call(req, -1, &reply, &got);
	UniqueFd owned(got);
	if (err)
		return err;
	if (!owned)
		return EPROTO;
	if (owner_pid)
		*owner_pid = reply.object.owner_pid;
	if (file_id)
		*file_id = reply.object.offset;
	*fd = owned.release();
	return 0;
}

int BrokerClient::info(BrokerInfo *out)
{
	if (!out)
		return EINVAL;
	Frame req = make_frame(FrameKind::Request, Op::Info);
	Frame reply{};
	int err = call(req, -1, &reply, nullptr);
	if (err)
		return err;
	out->broker_pid = reply.info.broker_pid;
	out->clients = reply.info.clients;
	out->ids_in_use = reply.info.ids_in_use;
	out->segments = reply.info.segments;
	out->published = reply.info.published;
	out->ids_handed_out = reply.info.ids_handed_out;
	return 0;
}

} // namespace shmverbs
