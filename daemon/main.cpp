/* SPDX-License-Identifier: MIT */
/*
 * shmverbsd: the per-user broker of the shmverbs fabric. Clients start it on
 * first use (lib/broker_client.cpp); see docs/broker.md.
 *
 * Start-up contract with the client that spawns it: without --foreground the
 * process forks, the child becomes the daemon, and the parent exits only
 * once the child listens (status 0), found another daemon serving (status 0)
 * or failed (status 1). A client that waited for the parent can connect.
 */
#include "broker_socket.h"
#include "daemon_log.h"
#include "server.h"

#include <boost/asio/signal_set.hpp>
#include <boost/program_options.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

namespace po = boost::program_options;
using namespace shmverbs::broker;

namespace {

/* What the daemon child tells its parent through the start-up pipe. */
enum StartStatus : char { Serving = 0, AlreadyRunning = 1, Failed = 2 };

/* How long a new daemon waits for a predecessor that is exiting (it still
 * holds the lock, its socket is already gone). */
constexpr auto lock_wait = std::chrono::seconds(3);
/* How long the parent waits for the child to report. */
constexpr int start_report_ms = 5000;

struct Options {
	bool foreground = false;
	bool verbose = false;
	double idle_timeout_s = 10;
	std::string runtime_dir;
	std::string log_file;
};

double idle_timeout_default()
{
	const char *v = std::getenv("SHMVERBS_BROKER_IDLE_TIMEOUT");
	if (!v || !*v)
		return 10;
	char *end;
	double d = std::strtod(v, &end);
	if (*end || !std::isfinite(d) || d < 0)
		throw po::error(std::string("SHMVERBS_BROKER_IDLE_TIMEOUT=") + v +
				" is not a number of seconds");
	return d;
}

/* Returns true to run, false to exit with *status. */
bool parse_options(int argc, char **argv, Options *o, int *status)
{
	po::options_description desc(
		"Usage: shmverbsd [options]\n"
		"The shmverbs broker: hands out QP/SRQ numbers and shared-memory segments\n"
		"to the processes of one user. Clients start it on demand.\nOptions");
	desc.add_options()
		("help,h", "show this help")
		("version", "show the version")
		("foreground,f", po::bool_switch(&o->foreground), "do not detach; log to stderr")
		("verbose,v", po::bool_switch(&o->verbose), "log every connection and request")
		("idle-timeout", po::value<double>(&o->idle_timeout_s),
		 "exit after this many seconds without clients; 0: never "
		 "(default: $SHMVERBS_BROKER_IDLE_TIMEOUT or 10)")
		("runtime-dir", po::value<std::string>(&o->runtime_dir),
		 "directory of the socket and locks (default: $SHMVERBS_RUNTIME_DIR, "
		 "$XDG_RUNTIME_DIR/shmverbs, /tmp/shmverbs-$UID)")
		("log-file", po::value<std::string>(&o->log_file),
		 "when detached, append the log to this file instead of discarding it");
	try {
		o->idle_timeout_s = idle_timeout_default();
		po::variables_map vm;
		po::store(po::parse_command_line(argc, argv, desc), vm);
		po::notify(vm);
		if (vm.count("help")) {
			std::cout << desc << "\n";
			*status = 0;
			return false;
		}
		if (vm.count("version")) {
			std::cout << "shmverbsd " << SHMVERBS_VERSION_STRING << " (protocol "
				  << protocol_version << ")\n";
			*status = 0;
			return false;
		}
		if (!std::isfinite(o->idle_timeout_s) || o->idle_timeout_s < 0)
			throw po::error("--idle-timeout must be a number of seconds >= 0");
	} catch (const std::exception &e) {
		std::cerr << "shmverbsd: " << e.what() << "\n" << desc << "\n";
		*status = 2;
		return false;
	}
	if (o->runtime_dir.empty())
		o->runtime_dir = default_runtime_dir();
	return true;
}

/* True if a daemon answers on the socket. */
bool someone_listens(const std::string &path)
{
	UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	struct sockaddr_un addr = {};
	addr.sun_family = AF_UNIX;
	if (!fd || path.size() >= sizeof(addr.sun_path))
		return false;
	std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
	return ::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
}

/* Takes the daemon lock, which the daemon holds for its whole life. */
StartStatus take_daemon_lock(const Options &o, UniqueFd *lock)
{
	std::string path = runtime_path(o.runtime_dir, daemon_lock_name);
	std::string sock = runtime_path(o.runtime_dir, socket_name);
	lock->reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
	if (!*lock) {
		log_always("cannot open %s: %s", path.c_str(), std::strerror(errno));
		return Failed;
	}
	auto deadline = std::chrono::steady_clock::now() + lock_wait;
	while (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			log_always("flock %s: %s", path.c_str(), std::strerror(errno));
			return Failed;
		}
		/* Held: either a daemon serves (then we are not needed), or
		 * one is exiting (then the lock is free in a moment). */
		if (someone_listens(sock)) {
			log_verbose("another broker serves %s", sock.c_str());
			return AlreadyRunning;
		}
		if (std::chrono::steady_clock::now() > deadline) {
			log_always("%s stays locked but nobody serves %s", path.c_str(), sock.c_str());
			return Failed;
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
	}
	return Serving;
}

/* Detaches: the parent waits for the child's start-up report and exits with
 * it; the child returns the pipe end it reports on. */
UniqueFd detach(const Options &o)
{
	int p[2];
	if (::pipe2(p, O_CLOEXEC) != 0) {
		log_always("pipe: %s", std::strerror(errno));
		std::exit(1);
	}
	pid_t pid = ::fork();
	if (pid < 0) {
		log_always("fork: %s", std::strerror(errno));
		std::exit(1);
	}
	if (pid > 0) {
		::close(p[1]);
		struct pollfd pfd = {p[0], POLLIN, 0};
		char report = Failed;
		if (::poll(&pfd, 1, start_report_ms) != 1 || ::read(p[0], &report, 1) != 1)
			report = Failed;
		std::_Exit(report == Failed ? 1 : 0);
	}
	::close(p[0]);
	::setsid();
	if (::chdir("/") != 0) {
		/* Not fatal: we only use absolute paths. */
	}
	int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
	int log = -1;
	if (!o.log_file.empty())
		log = ::open(o.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (null >= 0) {
		::dup2(null, STDIN_FILENO);
		::dup2(null, STDOUT_FILENO);
		::dup2(log >= 0 ? log : null, STDERR_FILENO);
	}
	if (null > STDERR_FILENO)
		::close(null);
	if (log > STDERR_FILENO)
		::close(log);
	return UniqueFd(p[1]);
}

void report(UniqueFd &pipe, StartStatus s)
{
	if (!pipe)
		return;
	char c = s;
	ssize_t ignored = ::write(pipe.get(), &c, 1);
	(void)ignored;
	pipe.reset();
}

/* Each registered segment and attached fd is a descriptor: allow as many as
 * the hard limit permits. */
void raise_fd_limit()
{
	struct rlimit rl;
	if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		::setrlimit(RLIMIT_NOFILE, &rl);
	}
}

} // namespace

int main(int argc, char **argv)
{
	Options o;
	int status = 0;
	if (!parse_options(argc, argv, &o, &status))
		return status;
	set_verbose(o.verbose);
	/* The socket and the locks are for our uid only. */
	::umask(077);
	::signal(SIGPIPE, SIG_IGN);

	std::string why;
	if (int err = prepare_runtime_dir(o.runtime_dir, &why)) {
		log_always("%s (%s)", why.c_str(), std::strerror(err));
		return 1;
	}
	UniqueFd start_pipe;
	if (!o.foreground)
		start_pipe = detach(o);

	UniqueFd lock;
	StartStatus s = take_daemon_lock(o, &lock);
	if (s != Serving) {
		report(start_pipe, s);
		return s == AlreadyRunning ? 0 : 1;
	}
	raise_fd_limit();

	boost::asio::io_context io;
	ServerOptions so;
	so.socket_path = runtime_path(o.runtime_dir, socket_name);
	so.idle_timeout = std::chrono::milliseconds(std::llround(o.idle_timeout_s * 1000));
	Server server(io, so);
	if (server.listen() != 0) {
		report(start_pipe, Failed);
		return 1;
	}
	boost::asio::signal_set signals(io, SIGINT, SIGTERM);
	signals.async_wait([&](const boost::system::error_code &ec, int sig) {
		if (!ec)
			server.stop(sig == SIGINT ? "SIGINT" : "SIGTERM");
	});
	log_verbose("broker %s started (pid %d, protocol %u)", SHMVERBS_VERSION_STRING, int(getpid()),
		    unsigned(protocol_version));
	report(start_pipe, Serving);
	io.run();
	log_verbose("exited");
	/* The lock goes with the process, after the socket was removed. */
	return 0;
}
