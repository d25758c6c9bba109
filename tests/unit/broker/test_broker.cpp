/* SPDX-License-Identifier: MIT */
/*
 * The broker with real processes: the daemon (SHMVERBS_BROKER), peers that
 * are this binary re-executed (peer.cpp), and this process's own client.
 * Each test case has a runtime directory of its own (Fabric); the daemons
 * run with a short idle timeout (main.cpp) and are gone when a case ends.
 */
#include "broker_client.h"
#include "broker_socket.h"
#include "harness.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>

using namespace broker_test;
using namespace shmverbs;

namespace {

BrokerClient &client()
{
	return BrokerClient::instance();
}

std::string broker_binary()
{
	const char *path = std::getenv("SHMVERBS_BROKER");
	return path ? path : "";
}

/* Collects the events pushed to this process. */
struct EventLog {
	std::mutex m;
	std::condition_variable cv;
	std::vector<BrokerEvent> events;
	std::vector<int> calls_from_handler; /* what a broker call returned there */

	bool wait_for(BrokerEvent::Type type, pid_t pid, Ms timeout)
	{
		std::unique_lock g(m);
		return cv.wait_for(g, timeout, [&] { return seen(type, pid); });
	}
	bool seen(BrokerEvent::Type type, pid_t pid)
	{
		for (const BrokerEvent &e : events)
			if (e.type == type && e.pid == pid)
				return true;
		return false;
	}
};

std::shared_ptr<EventLog> log_events()
{
	auto log = std::make_shared<EventLog>();
	client().set_event_handler([log](const BrokerEvent &e) {
		BrokerInfo info;
		int err = client().info(&info);
		std::lock_guard g(log->m);
		log->events.push_back(e);
		log->calls_from_handler.push_back(err);
		log->cv.notify_all();
	});
	return log;
}

/* Sends SIGCONT to a stopped broker whatever happens to the test. */
struct ContinueOnExit {
	pid_t pid;
	~ContinueOnExit() { kill(pid, SIGCONT); }
};

/* A raw connection, for what the client library never sends. */
broker::UniqueFd raw_connect(const std::string &path)
{
	broker::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	struct sockaddr_un addr = {};
	addr.sun_family = AF_UNIX;
	std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
	if (connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0)
		return broker::UniqueFd();
	struct timeval tv = {2, 0};
	setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

std::optional<uint32_t> number(const std::optional<std::string> &s)
{
	if (!s)
		return std::nullopt;
	return uint32_t(std::stoul(*s));
}

} // namespace

TEST_CASE("the first client starts the broker in the runtime directory", "[broker]")
{
	Fabric f;
	REQUIRE_FALSE(f.broker_alive());
	REQUIRE(client().connect() == 0);
	CHECK(f.broker_alive());
	pid_t pid = client().broker_pid();
	CHECK(pid > 0);
	CHECK(pid != getpid());

	struct stat st;
	REQUIRE(stat(f.dir().c_str(), &st) == 0);
	CHECK((st.st_mode & 07777) == 0700);
	REQUIRE(lstat(f.socket().c_str(), &st) == 0);
	CHECK(S_ISSOCK(st.st_mode));
	CHECK((st.st_mode & 077) == 0);

	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.broker_pid == pid);
	CHECK(info.clients == 1);
}

TEST_CASE("processes starting at once share one broker and get unique numbers", "[broker]")
{
	Fabric f;
	constexpr int processes = 8, each = 16;
	std::vector<Process> peers;
	for (int i = 0; i < processes; i++)
		peers.push_back(Process::peer({"hold", std::to_string(each)}));

	std::set<std::string> brokers;
	std::set<uint32_t> ids;
	for (Process &p : peers) {
		auto broker = p.expect("broker ", 10s);
		REQUIRE(broker);
		brokers.insert(*broker);
		auto line = p.expect("ids", 5s);
		REQUIRE(line);
		for (const std::string &w : split(*line)) {
			uint32_t id = uint32_t(std::stoul(w));
			CHECK(id >= 2);
			CHECK(id < (1u << 24));
			ids.insert(id);
		}
	}
	CHECK(brokers.size() == 1);
	CHECK(ids.size() == size_t(processes * each));

	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(std::to_string(info.broker_pid) == *brokers.begin());
	CHECK(info.clients == processes + 1);
	CHECK(info.ids_in_use == processes * each);
	client().disconnect();

	for (Process &p : peers) {
		p.close_stdin();
		auto status = p.wait(5s);
		REQUIRE(status);
		CHECK(WIFEXITED(*status));
		CHECK(WEXITSTATUS(*status) == 0);
	}
	CHECK(f.wait_broker_gone(3s));
}

TEST_CASE("the broker exits after the idle timeout and removes its socket", "[broker]")
{
	Fabric f;
	SECTION("once its last client has gone")
	{
		Process p = Process::peer({"once"});
		REQUIRE(p.expect("broker ", 5s));
		REQUIRE(p.wait(5s) == 0);
		CHECK(f.wait_broker_gone(3s));
	}
	SECTION("not while a client is connected")
	{
		REQUIRE(client().connect() == 0);
		pid_t pid = client().broker_pid();
		usleep(700 * 1000); /* more than twice the idle timeout */
		CHECK(f.broker_alive());
		BrokerInfo info;
		REQUIRE(client().info(&info) == 0);
		CHECK(info.broker_pid == pid);
		client().disconnect();
		CHECK(f.wait_broker_gone(3s));
	}
}

TEST_CASE("resolve gives the owner's pid and its segment, fetch_fd its eventfd", "[broker]")
{
	Fabric f;
	Process owner = Process::peer({"owner"});
	auto qpn = number(owner.expect("ready ", 5s));
	REQUIRE(qpn);

	ResolvedObject r;
	REQUIRE(client().resolve({0, ObjectKind::Qp, *qpn}, &r) == 0);
	broker::UniqueFd segment(r.fd);
	CHECK(r.owner_pid == owner.pid());
	CHECK(r.offset == 256);
	CHECK(r.size == 4096);
	auto *mem = static_cast<char *>(mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0));
	REQUIRE(mem != MAP_FAILED);
	CHECK(std::string(mem + r.offset) == "owner-data");
	std::strcpy(mem + r.offset, "written-by-resolver");
	owner.write_line("read");
	CHECK(owner.expect("data ", 5s) == "written-by-resolver");
	munmap(mem, r.size);

	int efd = -1;
	pid_t pid = 0;
	REQUIRE(client().fetch_fd({0, ObjectKind::Qp, *qpn}, 0, &efd, &pid) == 0);
	broker::UniqueFd event(efd);
	CHECK(pid == owner.pid());
	uint64_t kick = 5;
	REQUIRE(write(efd, &kick, sizeof(kick)) == sizeof(kick));
	owner.write_line("event");
	CHECK(owner.expect("event ", 5s) == "5");

	SECTION("the owner's objects are its own")
	{
		BrokerObject theirs{0, ObjectKind::Qp, *qpn};
		uint64_t seg;
		int pipefd[2];
		REQUIRE(pipe2(pipefd, O_CLOEXEC) == 0);
		broker::UniqueFd rd(pipefd[0]), wr(pipefd[1]);
		int fd;
		uint32_t id;
		CHECK(client().free_id(theirs) == EPERM);
		CHECK(client().attach_fd(theirs, 0, wr.get()) == EPERM);
		CHECK(client().fetch_fd(theirs, 1, &fd) == ENODATA);
		CHECK(client().fetch_fd(theirs, broker::fd_slots, &fd) == EINVAL);
		CHECK(client().register_segment(rd.get(), &seg) == EINVAL);
		CHECK(client().register_segment(-1, &seg) == EBADF);
		CHECK(client().alloc_id(broker::max_devices, ObjectKind::Qp, &id) == EINVAL);
		CHECK(client().resolve({0, ObjectKind::Srq, *qpn}, &r) == ENOENT);
	}
}

TEST_CASE("a killed client's peers are told and its numbers are released", "[broker]")
{
	Fabric f;
	auto events = log_events();
	Process watched = Process::peer({"owner"});
	Process unwatched = Process::peer({"owner"});
	auto qpn = number(watched.expect("ready ", 5s));
	REQUIRE(qpn);
	REQUIRE(unwatched.expect("ready ", 5s));

	ResolvedObject r;
	REQUIRE(client().resolve({0, ObjectKind::Qp, *qpn}, &r) == 0);
	close(r.fd);
	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.ids_in_use == 2);
	CHECK(info.segments == 2);

	pid_t watched_pid = watched.pid(), unwatched_pid = unwatched.pid();
	watched.kill(SIGKILL);
	REQUIRE(watched.wait(5s));
	CHECK(events->wait_for(BrokerEvent::Type::PeerGone, watched_pid, 3s));
	CHECK(client().resolve({0, ObjectKind::Qp, *qpn}, &r) == ENOENT);
	REQUIRE(client().info(&info) == 0);
	CHECK(info.clients == 2);
	CHECK(info.ids_in_use == 1);
	CHECK(info.segments == 1);
	CHECK(info.published == 1);

	/* Only those that resolved its objects hear of a process's end. */
	unwatched.kill(SIGKILL);
	REQUIRE(unwatched.wait(5s));
	CHECK(eventually(
		[] {
			BrokerInfo i;
			return client().info(&i) == 0 && i.ids_in_use == 0;
		},
		3s));
	CHECK_FALSE(events->wait_for(BrokerEvent::Type::PeerGone, unwatched_pid, 200ms));

	std::lock_guard g(events->m);
	REQUIRE(events->calls_from_handler.size() == 1);
	CHECK(events->calls_from_handler[0] == EDEADLK);
}

TEST_CASE("a forked child makes its own connection and leaves the parent's alone", "[broker]")
{
	Fabric f;
	uint32_t mine;
	REQUIRE(client().alloc_id(0, ObjectKind::Qp, &mine) == 0);
	pid_t broker = client().broker_pid();
	uint64_t generation = client().generation();

	pid_t child = fork();
	REQUIRE(child >= 0);
	if (child == 0) {
		uint32_t id;
		BrokerInfo info;
		int code = client().alloc_id(0, ObjectKind::Qp, &id) ? 20
			   : id == mine				       ? 21
			   : client().info(&info)		       ? 22
			   : info.clients != 2			       ? 23
			   : info.broker_pid != broker		       ? 24
			   : client().free_id({0, ObjectKind::Qp, mine}) != EPERM ? 25
										   : 0;
		_exit(code);
	}
	int status = 0;
	bool exited = eventually([&] { return waitpid(child, &status, WNOHANG) == child; }, 5s);
	if (!exited) {
		kill(child, SIGKILL);
		waitpid(child, &status, 0);
	}
	REQUIRE(exited);
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);

	CHECK(eventually(
		[] {
			BrokerInfo i;
			return client().info(&i) == 0 && i.clients == 1;
		},
		3s));
	CHECK(client().generation() == generation);
	CHECK(client().free_id({0, ObjectKind::Qp, mine}) == 0);
}

TEST_CASE("a broker that dies is replaced on the next call", "[broker]")
{
	Fabric f;
	auto events = log_events();
	uint32_t id;
	REQUIRE(client().alloc_id(0, ObjectKind::Qp, &id) == 0);
	pid_t first = client().broker_pid();
	uint64_t generation = client().generation();

	REQUIRE(kill(first, SIGKILL) == 0);
	CHECK(events->wait_for(BrokerEvent::Type::BrokerLost, first, 3s));
	/* Its socket file stays behind; the next broker replaces it. */
	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.broker_pid != first);
	CHECK(info.ids_in_use == 0);
	CHECK(client().generation() == generation + 1);
	/* The dead broker's numbers may still be in use: the new one goes on
	 * from the marks the old one left beside the socket. */
	uint32_t next;
	REQUIRE(client().alloc_id(0, ObjectKind::Qp, &next) == 0);
	CHECK(next != id);
}

TEST_CASE("a broker that dies: a process that publishes nothing new is found again",
	  "[broker]")
{
	/* A server that created its QPs at start and now only serves them
	 * (or sleeps) makes no broker call of its own: it republishes what it
	 * published as soon as it hears of the loss, so that a client that
	 * comes later finds it through the broker that replaces the old. */
	Fabric f;
	Process owner = Process::peer({"segment"});
	auto broker = number(owner.expect("broker ", 5s));
	auto qpn = number(owner.expect("ready ", 5s));
	REQUIRE(broker);
	REQUIRE(qpn);
	REQUIRE(kill(pid_t(*broker), SIGKILL) == 0);
	ResolvedObject r{};
	int err = -1;
	CHECK(eventually(
		[&] {
			err = client().resolve({0, ObjectKind::Qp, *qpn}, &r);
			return err == 0;
		},
		5s));
	CAPTURE(err);
	REQUIRE(err == 0);
	broker::UniqueFd segment(r.fd);
	CHECK(client().broker_pid() != pid_t(*broker));
	CHECK(r.owner_pid == owner.pid());
	auto *mem = static_cast<char *>(mmap(nullptr, r.size, PROT_READ, MAP_SHARED, r.fd, 0));
	REQUIRE(mem != MAP_FAILED);
	CHECK(std::string(mem + r.offset) == "segment-data");
	munmap(mem, r.size);
}

TEST_CASE("when no broker can be started, calls fail at once with an errno", "[broker]")
{
	Fabric f;
	struct Row {
		const char *daemon;
		int expected;
	} rows[] = {
		{"/nonexistent/shmverbsd", ENOENT},
		{"/bin/false", ECONNREFUSED},
	};
	std::string saved = broker_binary();
	for (const Row &r : rows) {
		INFO(r.daemon);
		setenv("SHMVERBS_BROKER", r.daemon, 1);
		auto start = std::chrono::steady_clock::now();
		uint32_t id;
		CHECK(client().alloc_id(0, ObjectKind::Qp, &id) == r.expected);
		CHECK(std::chrono::steady_clock::now() - start < 4s); /* well under the 5 s broker timeout */
	}
	setenv("SHMVERBS_BROKER", saved.c_str(), 1);
	CHECK_FALSE(f.broker_alive());
}

TEST_CASE("a socket file nobody listens on is replaced", "[broker]")
{
	Fabric f;
	REQUIRE(mkdir(f.dir().c_str(), 0700) == 0);
	{
		broker::UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
		struct sockaddr_un addr = {};
		addr.sun_family = AF_UNIX;
		std::strncpy(addr.sun_path, f.socket().c_str(), sizeof(addr.sun_path) - 1);
		REQUIRE(bind(s.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
	}
	REQUIRE(access(f.socket().c_str(), F_OK) == 0);
	REQUIRE(client().connect() == 0);
	CHECK(f.broker_alive());
}

TEST_CASE("a broker that does not answer makes calls time out", "[broker]")
{
	Fabric f;
	Process p = Process::peer({"stall"}, {"SHMVERBS_BROKER_TIMEOUT=0.3"});
	auto broker = number(p.expect("broker ", 5s));
	REQUIRE(broker);
	REQUIRE(kill(pid_t(*broker), SIGSTOP) == 0);
	{
		ContinueOnExit resume{pid_t(*broker)};
		p.write_line("go");
		auto result = p.expect("result ", 5s);
		REQUIRE(result);
		auto words = split(*result);
		REQUIRE(words.size() == 2);
		CHECK(std::stoi(words[0]) == ETIMEDOUT);
		CHECK(std::stoi(words[1]) >= 250);
		CHECK(std::stoi(words[1]) < 2000);
	}
	p.close_stdin();
	CHECK(p.wait(5s) == 0);
}

TEST_CASE("a client that breaks the protocol is disconnected, others go on", "[broker]")
{
	Fabric f;
	REQUIRE(client().connect() == 0);
	auto bad = GENERATE(as<std::string>{}, "version", "magic", "reply");
	INFO(bad);
	broker::UniqueFd s = raw_connect(f.socket());
	REQUIRE(s);
	broker::FrameReader reader;
	REQUIRE(reader.read(s.get()) == 1);
	CHECK(reader.frame().h.op == uint8_t(broker::Op::Hello));
	CHECK(reader.frame().h.status == 0);

	broker::Frame frame = broker::make_frame(broker::FrameKind::Request, broker::Op::Info, 7);
	if (bad == "version")
		frame.h.version = broker::protocol_version + 1;
	else if (bad == "magic")
		frame.h.magic = 0;
	else
		frame.h.kind = uint8_t(broker::FrameKind::Reply);
	REQUIRE(broker::send_frame(s.get(), frame) == 0);
	CHECK(reader.read(s.get()) == -ECONNRESET);

	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.clients == 1);
}

TEST_CASE("a second daemon finds the first serving and leaves", "[broker]")
{
	Fabric f;
	REQUIRE(client().connect() == 0);
	Process d = Process::start({broker_binary(), "--foreground", "--verbose", "--runtime-dir", f.dir()},
				   {}, true);
	std::string log = d.read_all(5s);
	auto status = d.wait(5s);
	REQUIRE(status);
	CHECK(WIFEXITED(*status));
	CHECK(WEXITSTATUS(*status) == 0);
	CHECK_THAT(log, Catch::Contains("another broker serves"));
	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.broker_pid == client().broker_pid());
}

TEST_CASE("--foreground --verbose logs connections, requests and the idle exit", "[broker]")
{
	Fabric f;
	Process d = Process::start({broker_binary(), "--foreground", "--verbose", "--idle-timeout", "0.3",
				    "--runtime-dir", f.dir()},
				   {}, true);
	REQUIRE(d.expect("", 5s)); /* its first line: it listens */
	REQUIRE(access(f.socket().c_str(), F_OK) == 0);
	Process p = Process::peer({"hold", "1"});
	pid_t peer_pid = p.pid();
	REQUIRE(p.expect("ids", 5s));
	p.close_stdin();
	REQUIRE(p.wait(5s) == 0);

	std::string log = d.read_all(5s);
	auto status = d.wait(5s);
	REQUIRE(status);
	CHECK(WIFEXITED(*status));
	CHECK(WEXITSTATUS(*status) == 0);
	CHECK_THAT(log, Catch::Contains("(pid " + std::to_string(peer_pid) + ") connected"));
	CHECK_THAT(log, Catch::Contains("alloc-id qp dev 0 id 2 -> ok"));
	CHECK_THAT(log, Catch::Contains("gone (disconnected)"));
	CHECK_THAT(log, Catch::Contains("stopping: idle"));
	CHECK(access(f.socket().c_str(), F_OK) != 0);
}

TEST_CASE("a runtime directory others could reach is refused", "[broker][runtime-dir]")
{
	Fabric f;
	std::string why;
	const std::string dir = f.dir();

	SECTION("missing: created with mode 0700 whatever the umask")
	{
		mode_t old = umask(0);
		int err = broker::prepare_runtime_dir(dir, &why);
		umask(old);
		REQUIRE(err == 0);
		struct stat st;
		REQUIRE(stat(dir.c_str(), &st) == 0);
		CHECK((st.st_mode & 07777) == 0700);
	}
	SECTION("group or others have access")
	{
		REQUIRE(mkdir(dir.c_str(), 0700) == 0);
		REQUIRE(chmod(dir.c_str(), 0755) == 0);
		CHECK(broker::prepare_runtime_dir(dir, &why) == EACCES);
		CHECK_THAT(why, Catch::Contains("0755"));
		CHECK(client().connect() == EACCES);
		Process d = Process::start({broker_binary(), "--foreground", "--runtime-dir", dir}, {}, true);
		std::string log = d.read_all(5s);
		auto status = d.wait(5s);
		REQUIRE(status);
		CHECK(WEXITSTATUS(*status) == 1);
		CHECK_THAT(log, Catch::Contains("mode 0755"));
		CHECK(access(f.socket().c_str(), F_OK) != 0);
	}
	SECTION("a symlink to a good directory")
	{
		std::string target = dir + "-target";
		REQUIRE(mkdir(target.c_str(), 0700) == 0);
		REQUIRE(symlink(target.c_str(), dir.c_str()) == 0);
		CHECK(broker::prepare_runtime_dir(dir, &why) == ENOTDIR);
		CHECK(client().connect() == ENOTDIR);
		unlink(dir.c_str());
		rmdir(target.c_str());
	}
	SECTION("owned by another user")
	{
		if (geteuid() != 0) {
			WARN("skipped: only root can give a directory to another user");
			return;
		}
		REQUIRE(mkdir(dir.c_str(), 0700) == 0);
		REQUIRE(chown(dir.c_str(), 65534, 65534) == 0);
		CHECK(broker::prepare_runtime_dir(dir, &why) == EPERM);
		CHECK_THAT(why, Catch::Contains("uid 65534"));
		CHECK(client().connect() == EPERM);
	}
}

namespace {

/* In a child of a root process: become nobody, but keep the power to pass
 * the 0700 directory, so that it is the broker itself that must refuse. */
int connect_as_nobody(const std::string &socket_path)
{
	if (prctl(PR_SET_KEEPCAPS, 1) != 0)
		return 10;
	if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
	    setresuid(65534, 65534, 65534) != 0)
		return 11;
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct caps[2] = {};
	if (syscall(SYS_capget, &hdr, caps) != 0)
		return 12;
	caps[0].effective |= 1u << CAP_DAC_OVERRIDE;
	if (syscall(SYS_capset, &hdr, caps) != 0)
		return 13;

	broker::UniqueFd s = raw_connect(socket_path);
	if (!s)
		return 14;
	broker::FrameReader reader;
	if (reader.read(s.get()) != 1)
		return 15;
	if (reader.frame().h.op != uint8_t(broker::Op::Hello) || reader.frame().h.status != EACCES)
		return 16;
	if (reader.read(s.get()) != -ECONNRESET)
		return 17; /* the broker must have closed the connection */
	/* The client library does not even get that far: the runtime
	 * directory is not ours. */
	if (client().connect() != EPERM)
		return 18;
	return 0;
}

} // namespace

TEST_CASE("a process of another uid is refused", "[broker][uid]")
{
	if (geteuid() != 0) {
		WARN("skipped: needs root to run a child as another uid");
		return;
	}
	Fabric f;
	REQUIRE(client().connect() == 0);
	std::string path = f.socket();
	pid_t child = fork();
	REQUIRE(child >= 0);
	if (child == 0)
		_exit(connect_as_nobody(path));
	int status = 0;
	bool exited = eventually([&] { return waitpid(child, &status, WNOHANG) == child; }, 5s);
	if (!exited) {
		kill(child, SIGKILL);
		waitpid(child, &status, 0);
	}
	REQUIRE(exited);
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);
	/* The refusal cost the broker nothing. */
	BrokerInfo info;
	REQUIRE(client().info(&info) == 0);
	CHECK(info.clients == 1);
}
