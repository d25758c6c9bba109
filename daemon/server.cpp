/* SPDX-License-Identifier: MIT */
#include "server.h"
#include "daemon_log.h"

#include <boost/asio/post.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>

namespace shmverbs::broker {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using boost::system::error_code;

namespace {

/* Frames handled per wake-up of one connection before the others get a
 * turn. */
constexpr int frames_per_turn = 64;
/* Replies and pushes waiting for a client that does not read; beyond this
 * the client is considered wedged and disconnected. */
constexpr size_t max_queued_frames = 1024;

const char *op_name(uint8_t op)
{
	switch (Op(op)) {
	case Op::Hello: return "hello";
	case Op::Info: return "info";
	case Op::AllocId: return "alloc-id";
	case Op::FreeId: return "free-id";
	case Op::RegisterSegment: return "register-segment";
	case Op::UnregisterSegment: return "unregister-segment";
	case Op::PublishObject: return "publish";
	case Op::Resolve: return "resolve";
	case Op::AttachFd: return "attach-fd";
	case Op::FetchFd: return "fetch-fd";
	case Op::PeerGone: return "peer-gone";
	}
	return "unknown";
}

const char *kind_name(uint8_t kind)
{
	return kind == uint8_t(ObjectKind::Qp) ? "qp" : kind == uint8_t(ObjectKind::Srq) ? "srq" : "?";
}

bool op_takes_fd(Op op)
{
	return op == Op::RegisterSegment || op == Op::AttachFd;
}

/* The number marks (directory.h IdMarks) beside the socket: written by a
 * broker as it hands numbers out, read by the broker that replaces it, so
 * that one killed while its clients live on does not see its numbers given
 * out again (a QP number twice on a device would deliver to the wrong QP). */
std::string marks_path(const std::string &socket_path) { return socket_path + ".ids"; }

IdMarks load_marks(const std::string &path)
{
	IdMarks marks;
	FILE *f = std::fopen(path.c_str(), "re");
	if (!f)
		return marks;
	unsigned long long key;
	unsigned next;
	while (std::fscanf(f, "%llu %u", &key, &next) == 2)
		marks[key] = next;
	std::fclose(f);
	return marks;
}

/* Written aside and renamed over the old file: a broker killed while it
 * writes leaves the previous marks, which cover fewer numbers than it
 * handed out only if it handed out mark_step since, which it cannot have
 * done before the save that was cut short returned. */
void save_marks(const std::string &path, const IdMarks &marks)
{
	const std::string tmp = path + ".new";
	FILE *f = std::fopen(tmp.c_str(), "we");
	if (!f) {
		log_always("cannot write %s: %s", tmp.c_str(), std::strerror(errno));
		return;
	}
	for (const auto &[key, next] : marks)
		std::fprintf(f, "%llu %u\n", static_cast<unsigned long long>(key), next);
	if (std::fclose(f) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0)
		log_always("cannot write %s: %s", path.c_str(), std::strerror(errno));
}

} // namespace

struct Server::Connection {
	explicit Connection(stream::socket s) : sock(std::move(s)) {}

	struct Outgoing {
		Frame frame;
		UniqueFd fd; /* sent with the first byte */
		size_t sent = 0;
	};

	stream::socket sock;
	ClientId id = 0;
	pid_t pid = 0;
	FrameReader reader;
	std::deque<Outgoing> out;
	bool waiting_writable = false;
	bool closed = false;
};

Server::Server(asio::io_context &io, ServerOptions options)
	: io_(io), options_(std::move(options)), acceptor_(io), idle_timer_(io),
	  directory_(object_id_limit, load_marks(marks_path(options_.socket_path)),
		     [path = marks_path(options_.socket_path)](const IdMarks &m) {
			     save_marks(path, m);
		     })
{
}

Server::~Server() = default;

int Server::listen()
{
	error_code ec;
	/* A socket file left by a daemon that died: we hold the lock now, so
	 * nobody else serves it. */
	::unlink(options_.socket_path.c_str());
	stream::endpoint ep(options_.socket_path);
	acceptor_.open(ep.protocol(), ec);
	if (!ec)
		acceptor_.bind(ep, ec);
	if (!ec)
		acceptor_.listen(asio::socket_base::max_listen_connections, ec);
	if (ec) {
		log_always("cannot listen on %s: %s", options_.socket_path.c_str(),
			   ec.message().c_str());
		return ec.value() ? ec.value() : EIO;
	}
	log_verbose("listening on %s (idle timeout %lld ms)", options_.socket_path.c_str(),
		    static_cast<long long>(options_.idle_timeout.count()));
	accept_next();
	arm_idle_timer();
	return 0;
}

void Server::stop(const char *why)
{
	if (stopped_)
		return;
	stopped_ = true;
	log_verbose("stopping: %s", why);
	/* Remove the socket while we still hold the daemon lock, so that a
	 * successor never finds a socket nobody serves. */
	::unlink(options_.socket_path.c_str());
	/* Without a client no number is in use: a successor may start from
	 * the beginning. A broker stopped with clients leaves them. */
	if (connections_.empty())
		::unlink(marks_path(options_.socket_path).c_str());
	error_code ignored;
	acceptor_.close(ignored);
	idle_timer_.cancel();
	while (!connections_.empty())
		disconnect(*connections_.begin()->second, "broker stopping");
	io_.stop();
}

void Server::accept_next()
{
	acceptor_.async_accept([this](error_code ec, stream::socket sock) {
		if (ec == asio::error::operation_aborted || stopped_)
			return;
		if (ec) {
			/* EMFILE and friends: keep serving the clients we have. */
			log_always("accept: %s", ec.message().c_str());
			accept_next();
			return;
		}
		struct ucred cred = {};
		socklen_t len = sizeof(cred);
		if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
			log_always("SO_PEERCRED: %s", std::strerror(errno));
			accept_next();
			return;
		}
		if (cred.uid != geteuid()) {
			refuse(sock, cred.uid, cred.pid);
			accept_next();
			return;
		}
		error_code ignored;
		sock.native_non_blocking(true, ignored);
		auto conn = std::make_shared<Connection>(std::move(sock));
		conn->id = next_client_++;
		conn->pid = cred.pid;
		connections_[conn->id] = conn;
		directory_.add_client(conn->id, conn->pid);
		idle_timer_.cancel();
		log_verbose("client %llu (pid %d) connected, %zu connected",
			    static_cast<unsigned long long>(conn->id), int(conn->pid), connections_.size());

		Frame hello = make_frame(FrameKind::Push, Op::Hello);
		hello.hello.broker_pid = getpid();
		hello.hello.peer_uid = cred.uid;
		hello.hello.peer_pid = cred.pid;
		hello.hello.client_id = conn->id;
		queue(*conn, hello);
		flush(conn);
		wait_readable(conn);
		accept_next();
	});
}

void Server::refuse(stream::socket &sock, uid_t uid, pid_t pid)
{
	log_always("refused pid %d: uid %u is not the broker's uid %u", int(pid), unsigned(uid),
		   unsigned(geteuid()));
	/* Best effort, one frame into an empty socket buffer: tell the peer
	 * why before closing, so that it reports EACCES and not a reset. */
	Frame hello = make_frame(FrameKind::Push, Op::Hello, 0, EACCES);
	hello.hello.broker_pid = getpid();
	hello.hello.peer_uid = uid;
	hello.hello.peer_pid = pid;
	(void)::send(sock.native_handle(), &hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT);
	error_code ignored;
	sock.close(ignored);
}

void Server::wait_readable(const ConnectionPtr &conn)
{
	conn->sock.async_wait(stream::socket::wait_read, [this, conn](error_code ec) {
		if (conn->closed)
			return;
		if (ec) {
			disconnect(*conn, ec.message().c_str());
			return;
		}
		on_readable(conn);
	});
}

void Server::on_readable(const ConnectionPtr &conn)
{
	for (int i = 0; i < frames_per_turn; i++) {
		int r = conn->reader.read(conn->sock.native_handle());
		if (r == 0) {
			wait_readable(conn);
			return;
		}
		if (r < 0) {
			disconnect(*conn, r == -ECONNRESET ? "disconnected" : std::strerror(-r));
			return;
		}
		handle(*conn, conn->reader.frame(), conn->reader.take_fds());
		if (conn->closed)
			return;
		flush(conn);
		if (conn->closed)
			return;
	}
	/* More may be waiting: let the other connections have a turn first. */
	asio::post(io_, [this, conn] {
		if (!conn->closed)
			on_readable(conn);
	});
}

void Server::handle(Connection &conn, const Frame &req, std::vector<UniqueFd> fds)
{
	/* A client that does not speak the protocol gets no answer it could
	 * misread: it is disconnected, which releases whatever it had. */
	if (check_frame_header(req) || req.h.kind != uint8_t(FrameKind::Request) ||
	    fds.size() > 1) {
		disconnect(conn, "protocol violation");
		return;
	}
	UniqueFd passed = fds.empty() ? UniqueFd() : std::move(fds.front());
	Frame reply = make_frame(FrameKind::Reply, Op(req.h.op), req.h.request_id);
	UniqueFd reply_fd;
	int status;
	if (passed && !op_takes_fd(Op(req.h.op)))
		status = EINVAL;
	else
		status = serve(conn, req, std::move(passed), reply, reply_fd);
	reply.h.status = status;

	const ObjectName &name = req.object.object;
	switch (Op(req.h.op)) {
	case Op::AllocId:
	case Op::FreeId:
	case Op::PublishObject:
	case Op::Resolve:
		log_verbose("client %llu (pid %d): %s %s dev %u id %u -> %s",
			    static_cast<unsigned long long>(conn.id), int(conn.pid), op_name(req.h.op),
			    kind_name(name.kind), name.device, reply.object.object.id,
			    status ? std::strerror(status) : "ok");
		break;
	default:
		log_verbose("client %llu (pid %d): %s -> %s", static_cast<unsigned long long>(conn.id),
			    int(conn.pid), op_name(req.h.op), status ? std::strerror(status) : "ok");
		break;
	}
	queue(conn, reply, std::move(reply_fd));
}

int Server::serve(Connection &conn, const Frame &req, UniqueFd passed, Frame &reply,
		  UniqueFd &reply_fd)
{
	const ObjectName &name = req.object.object;
	int status;
	switch (Op(req.h.op)) {
	case Op::Info: {
		DirectoryStats s = directory_.stats();
		reply.info.broker_pid = getpid();
		reply.info.clients = uint32_t(connections_.size());
		reply.info.ids_in_use = s.ids_in_use;
		reply.info.segments = s.segments;
		reply.info.published = s.published;
		reply.info.ids_handed_out = s.ids_handed_out;
		return 0;
	}
	case Op::AllocId:
		reply.object = req.object;
		return directory_.alloc_id(conn.id, name.device, name.kind, &reply.object.object.id);
	case Op::FreeId:
		reply.object = req.object;
		return directory_.free_id(conn.id, name);
	case Op::RegisterSegment:
		if (!passed)
			return EBADF;
		return directory_.register_segment(conn.id, std::move(passed), &reply.segment.segment,
						   &reply.segment.size);
	case Op::UnregisterSegment:
		reply.segment = req.segment;
		return directory_.unregister_segment(conn.id, req.segment.segment);
	case Op::PublishObject:
		reply.object = req.object;
		return directory_.publish(conn.id, name, req.object.segment, req.object.offset);
	case Op::Resolve: {
		Resolution res;
		reply.object.object = name;
		if ((status = directory_.resolve(conn.id, name, &res)))
			return status;
		/* A copy, so that the reply keeps its descriptor even if the
		 * owner drops the segment before the reply leaves. */
		reply_fd.reset(::fcntl(res.fd, F_DUPFD_CLOEXEC, 0));
		if (!reply_fd)
			return errno;
		reply.object.owner_pid = res.owner_pid;
		reply.object.segment = res.segment;
		reply.object.offset = res.offset;
		reply.object.size = res.size;
		return 0;
	}
	case Op::AttachFd:
		reply.object = req.object;
		if (!passed)
			return EBADF;
		return directory_.attach_fd(conn.id, name, req.object.slot, std::move(passed));
	case Op::FetchFd: {
		reply.object = req.object;
		int fd = -1;
		pid_t owner = 0;
		uint64_t file_id = 0;
		if ((status = directory_.fetch_fd(conn.id, name, req.object.slot, &fd, &owner,
						  &file_id)))
			return status;
		reply.object.offset = file_id;
		reply_fd.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
		if (!reply_fd)
			return errno;
		reply.object.owner_pid = owner;
		return 0;
	}
	case Op::Hello: /* pushes only */
	case Op::PeerGone:
		break;
	}
	return EOPNOTSUPP;
}

void Server::queue(Connection &conn, const Frame &frame, UniqueFd fd)
{
	if (conn.closed)
		return;
	if (conn.out.size() >= max_queued_frames) {
		disconnect(conn, "does not read its replies");
		return;
	}
	conn.out.push_back({frame, std::move(fd), 0});
}

void Server::flush(const ConnectionPtr &conn)
{
	if (conn->closed || conn->waiting_writable)
		return;
	while (!conn->out.empty()) {
		Connection::Outgoing &o = conn->out.front();
		ssize_t n = send_with_fd(conn->sock.native_handle(),
					 reinterpret_cast<const char *>(&o.frame) + o.sent,
					 sizeof(o.frame) - o.sent, o.sent ? -1 : o.fd.get());
		if (n == -EAGAIN || n == -EWOULDBLOCK) {
			conn->waiting_writable = true;
			conn->sock.async_wait(stream::socket::wait_write, [this, conn](error_code ec) {
				conn->waiting_writable = false;
				if (conn->closed)
					return;
				if (ec) {
					disconnect(*conn, ec.message().c_str());
					return;
				}
				flush(conn);
			});
			return;
		}
		if (n < 0) {
			disconnect(*conn, std::strerror(int(-n)));
			return;
		}
		o.sent += size_t(n);
		if (o.sent == sizeof(o.frame))
			conn->out.pop_front();
		else
			o.fd.reset(); /* it went with the first byte */
	}
}

void Server::disconnect(Connection &conn, const char *why)
{
	if (conn.closed)
		return;
	conn.closed = true;
	error_code ignored;
	conn.sock.close(ignored); /* cancels its pending waits */
	conn.out.clear();
	/* The last reference may be the map's: keep it for the rest of this. */
	ConnectionPtr keep;
	if (auto it = connections_.find(conn.id); it != connections_.end()) {
		keep = it->second;
		connections_.erase(it);
	}

	std::vector<ClientId> watchers = directory_.remove_client(conn.id);
	log_verbose("client %llu (pid %d) gone (%s), telling %zu peer(s), %zu connected",
		    static_cast<unsigned long long>(conn.id), int(conn.pid), why, watchers.size(),
		    connections_.size());
	for (ClientId w : watchers) {
		auto it = connections_.find(w);
		if (it == connections_.end())
			continue;
		Frame gone = make_frame(FrameKind::Push, Op::PeerGone);
		gone.peer_gone.pid = conn.pid;
		gone.peer_gone.client_id = conn.id;
		ConnectionPtr peer = it->second;
		queue(*peer, gone);
		flush(peer);
	}
	if (connections_.empty())
		arm_idle_timer();
}

void Server::arm_idle_timer()
{
	if (stopped_ || options_.idle_timeout.count() <= 0)
		return;
	idle_timer_.expires_after(options_.idle_timeout);
	idle_timer_.async_wait([this](error_code ec) {
		if (ec || !connections_.empty())
			return;
		stop("idle");
	});
}

} // namespace shmverbs::broker
