/* SPDX-License-Identifier: MIT */
/*
 * Scale measurements (issue 4), written as an application: <infiniband/verbs.h>
 * and the drop-in libibverbs only. The client is this process; the server is
 * this binary re-executed (fork + exec) with `--serve FD`, FD being its end
 * of a socketpair over which the two exchange QP numbers, LIDs, addresses
 * and rkeys. Every wait is bounded (--timeout), the server dies with the
 * client (PR_SET_PDEATHSIG), and each run prints one JSON object of raw
 * figures on stdout; bench/scale.py repeats runs and judges them.
 *
 *   scale_bench connect --qps N [--rounds R] [--events 1]
 *       N RC QPs each side; every round the client SENDs on every QP, the
 *       server checks each message (QP, round, payload) and answers on the
 *       same QP, the client checks the answers. Every completion checked.
 *       --events 1: both sides wait for receives on a completion channel.
 *   scale_bench bw --qps N --msg BYTES --total BYTES
 *       RDMA WRITEs of BYTES, round-robin over N QPs, all signaled, all
 *       completions checked; the target is passive. Prints GB/s and bytes
 *       per client CPU-second.
 *   scale_bench mem --qps N
 *       One process: bytes the shared segment's memfd allocates for N more
 *       QPs (one CQ each), fresh and after every ring went round once, and
 *       what their queues need (lib/shm_layout.h).
 *   scale_bench work --rounds R [--batch B] [--msg BYTES] [--events 1] [--barrier DIR]
 *       A fixed request/answer workload on one QP: R rounds of B WRITEs and
 *       a SEND, answered by a SEND after the server checked the data. Both
 *       sides spin on their CQs, or with --events 1 sleep on a channel.
 *   Any mode: --nofile N sets RLIMIT_NOFILE's soft limit of both processes,
 *   --timeout S bounds the run (default 60 s).
 */
#include <infiniband/verbs.h>

#include "shm_layout.h" /* sizes of the shared rings, for the memory budget */

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <ctime>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
	std::string mode;
	uint32_t qps = 1;
	uint32_t rounds = 1;
	uint32_t batch = 4;
	uint32_t events = 0; /* connect: receive CQs with a channel, waited on */
	uint64_t msg = 64 * 1024;
	uint64_t total = 256ull << 20;
	double timeout_s = 60;
	std::string barrier; /* work: a directory, see run_work() */
	uint64_t nofile = 0; /* RLIMIT_NOFILE soft limit for both processes */
	int serve_fd = -1; /* >= 0: this process is the server */
};

Clock::time_point deadline;
const char *role = "client";

[[noreturn]] void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	std::fprintf(stderr, "scale_bench %s: ", role);
	std::vfprintf(stderr, fmt, ap);
	std::fputc('\n', stderr);
	va_end(ap);
	std::_Exit(2);
}

void check_deadline(const char *what)
{
	if (Clock::now() > deadline)
		die("timed out: %s", what);
}

double seconds_since(Clock::time_point t)
{
	return std::chrono::duration<double>(Clock::now() - t).count();
}

/* ---- The control channel (socketpair) ---- */

void write_all(int fd, const void *p, size_t n)
{
	auto *c = static_cast<const char *>(p);
	while (n) {
		ssize_t w = ::write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("control write: %s", std::strerror(errno));
		c += w;
		n -= size_t(w);
	}
}

void read_all(int fd, void *p, size_t n)
{
	auto *c = static_cast<char *>(p);
	while (n) {
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
		struct pollfd pfd = {fd, POLLIN, 0};
		int r = ::poll(&pfd, 1, int(std::max<int64_t>(left.count(), 0)));
		if (r == 0)
			die("timed out on the control channel");
		if (r < 0 && errno == EINTR)
			continue;
		ssize_t got = ::read(fd, c, n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			die("control channel closed");
		c += got;
		n -= size_t(got);
	}
}

template <typename T>
void send_vec(int fd, const std::vector<T> &v)
{
	uint64_t n = v.size();
	write_all(fd, &n, sizeof(n));
	write_all(fd, v.data(), n * sizeof(T));
}

template <typename T>
std::vector<T> recv_vec(int fd)
{
	uint64_t n = 0;
	read_all(fd, &n, sizeof(n));
	if (n > (1u << 24))
		die("control: bad vector size");
	std::vector<T> v(n);
	read_all(fd, v.data(), n * sizeof(T));
	return v;
}

void sync_byte(int fd, bool first)
{
	char b = 'k';
	if (first) {
		write_all(fd, &b, 1);
		read_all(fd, &b, 1);
	} else {
		read_all(fd, &b, 1);
		write_all(fd, &b, 1);
	}
}

/* ---- Verbs setup ---- */

struct Endpoint {
	uint16_t lid;
	uint32_t rkey;
	uint64_t addr;
};

struct Side {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	struct ibv_cq *send_cq = nullptr;
	struct ibv_cq *recv_cq = nullptr;
	struct ibv_comp_channel *channel = nullptr; /* of recv_cq, if any */
	std::vector<struct ibv_qp *> qps;
	std::vector<char> buf;
	struct ibv_mr *mr = nullptr;
	uint16_t lid = 0;

	void open()
	{
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);
		if (!list || n < 1)
			die("no device");
		ctx = ibv_open_device(list[0]);
		ibv_free_device_list(list);
		if (!ctx)
			die("ibv_open_device: %s", std::strerror(errno));
		pd = ibv_alloc_pd(ctx);
		struct ibv_port_attr pa{};
		if (!pd || ibv_query_port(ctx, 1, &pa))
			die("pd/port");
		lid = pa.lid;
	}

	void make_buffer(size_t bytes)
	{
		buf.assign(bytes, 0);
		mr = ibv_reg_mr(pd, buf.data(), buf.size(),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!mr)
			die("ibv_reg_mr: %s", std::strerror(errno));
	}

	void make_qps(uint32_t n, uint32_t send_wr, uint32_t recv_wr, int send_cqe, int recv_cqe)
	{
		send_cq = ibv_create_cq(ctx, send_cqe, nullptr, nullptr, 0);
		recv_cq = ibv_create_cq(ctx, recv_cqe, nullptr, channel, 0);
		if (!send_cq || !recv_cq)
			die("ibv_create_cq(%d, %d): %s", send_cqe, recv_cqe, std::strerror(errno));
		for (uint32_t i = 0; i < n; i++) {
			struct ibv_qp_init_attr a{};
			a.send_cq = send_cq;
			a.recv_cq = recv_cq;
			a.qp_type = IBV_QPT_RC;
			a.cap.max_send_wr = send_wr;
			a.cap.max_recv_wr = recv_wr;
			a.cap.max_send_sge = 1;
			a.cap.max_recv_sge = 1;
			struct ibv_qp *qp = ibv_create_qp(pd, &a);
			if (!qp)
				die("ibv_create_qp #%u: %s", i, std::strerror(errno));
			qps.push_back(qp);
		}
	}

	std::vector<uint32_t> qpns() const
	{
		std::vector<uint32_t> v;
		for (auto *qp : qps)
			v.push_back(qp->qp_num);
		return v;
	}

	Endpoint endpoint() const
	{
		return {lid, mr ? mr->rkey : 0, uint64_t(uintptr_t(buf.data()))};
	}

	/* RESET -> INIT (receives may be posted from here on). */
	void init()
	{
		for (size_t i = 0; i < qps.size(); i++) {
			struct ibv_qp_attr a{};
			a.qp_state = IBV_QPS_INIT;
			a.port_num = 1;
			a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
			if (ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						   IBV_QP_ACCESS_FLAGS))
				die("INIT #%zu", i);
		}
	}

	/* INIT -> RTR -> RTS toward the peer's QPs, one by one. */
	void connect(const std::vector<uint32_t> &peer_qpns, uint16_t peer_lid)
	{
		if (peer_qpns.size() != qps.size())
			die("peer has %zu QPs, we %zu", peer_qpns.size(), qps.size());
		for (size_t i = 0; i < qps.size(); i++) {
			struct ibv_qp_attr a{};
			a.qp_state = IBV_QPS_RTR;
			a.path_mtu = IBV_MTU_4096;
			a.dest_qp_num = peer_qpns[i];
			a.ah_attr.dlid = peer_lid;
			a.ah_attr.port_num = 1;
			a.max_dest_rd_atomic = 1;
			a.min_rnr_timer = 12;
			if (ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
				die("RTR #%zu", i);
			a = {};
			a.qp_state = IBV_QPS_RTS;
			a.timeout = 14;
			a.retry_cnt = 7;
			a.rnr_retry = 7;
			a.max_rd_atomic = 1;
			if (ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
						   IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						   IBV_QP_MAX_QP_RD_ATOMIC))
				die("RTS #%zu", i);
		}
	}

	void close()
	{
		for (auto *qp : qps)
			if (ibv_destroy_qp(qp))
				die("ibv_destroy_qp");
		qps.clear();
		if (mr && ibv_dereg_mr(mr))
			die("ibv_dereg_mr");
		if ((send_cq && ibv_destroy_cq(send_cq)) || (recv_cq && ibv_destroy_cq(recv_cq)))
			die("ibv_destroy_cq");
		if (channel && ibv_destroy_comp_channel(channel))
			die("ibv_destroy_comp_channel");
		if (ibv_dealloc_pd(pd) || ibv_close_device(ctx))
			die("pd/device");
	}
};

void post_recv(struct ibv_qp *qp, uint64_t wr_id, const Side &s, uint64_t off, uint32_t len)
{
	struct ibv_sge sg = {uint64_t(uintptr_t(s.buf.data() + off)), len, s.mr->lkey};
	struct ibv_recv_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	if (int e = ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv: %s", std::strerror(e));
}

void post_send(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, const Side &s,
	       uint64_t off, uint32_t len, bool signaled, const Endpoint *remote = nullptr,
	       uint64_t remote_off = 0)
{
	struct ibv_sge sg = {uint64_t(uintptr_t(s.buf.data() + off)), len, s.mr->lkey};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sg;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	if (remote) {
		wr.wr.rdma.remote_addr = remote->addr + remote_off;
		wr.wr.rdma.rkey = remote->rkey;
	}
	if (int e = ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send: %s", std::strerror(e));
}

/* Blocks until the channel reports a completion event (bounded). */
void wait_event(struct ibv_comp_channel *ch, const char *what)
{
	auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
	struct pollfd pfd = {ch->fd, POLLIN, 0};
	if (::poll(&pfd, 1, int(std::max<int64_t>(left.count(), 0))) != 1)
		die("timed out waiting for a completion event: %s", what);
	struct ibv_cq *cq;
	void *cq_ctx;
	if (ibv_get_cq_event(ch, &cq, &cq_ctx))
		die("ibv_get_cq_event");
	ibv_ack_cq_events(cq, 1);
}

/* Swaps QP numbers and endpoints with the peer over the control socket; the
 * client speaks first. */
void exchange(int ctl, bool server, Side &s, std::vector<uint32_t> &peer, Endpoint &pe)
{
	Endpoint me = s.endpoint();
	if (!server) {
		send_vec(ctl, s.qpns());
		write_all(ctl, &me, sizeof(me));
	}
	peer = recv_vec<uint32_t>(ctl);
	read_all(ctl, &pe, sizeof(pe));
	if (server) {
		send_vec(ctl, s.qpns());
		write_all(ctl, &me, sizeof(me));
	}
}

/* Polls exactly one completion, bounded; fails on an error status. With a
 * channel, sleeps on it instead of spinning (armed, then polled again, so
 * that no completion is missed). */
struct ibv_wc poll_one(struct ibv_cq *cq, const char *what,
		       struct ibv_comp_channel *channel = nullptr)
{
	struct ibv_wc wc{};
	for (uint64_t spins = 0;; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		if (n == 1)
			break;
		if (channel) {
			if (ibv_req_notify_cq(cq, 0))
				die("ibv_req_notify_cq");
			n = ibv_poll_cq(cq, 1, &wc);
			if (n == 1)
				break;
			wait_event(channel, what);
			continue;
		}
		if ((spins & 1023) == 1023)
			check_deadline(what);
	}
	if (wc.status != IBV_WC_SUCCESS)
		die("%s: completion status %s (wr_id %" PRIu64 ")", what,
		    ibv_wc_status_str(wc.status), wc.wr_id);
	return wc;
}

/* ---- connect: N QPs, traffic on every one, every completion checked ---- */

constexpr uint32_t msg_magic = 0x5343414c; /* "SCAL" */
constexpr uint32_t small_msg = 64;

struct Message {
	uint32_t magic, index, round, direction;
	uint32_t fill[12];
};
static_assert(sizeof(Message) == small_msg);

Message make_message(uint32_t index, uint32_t round, uint32_t direction)
{
	Message m{msg_magic, index, round, direction, {}};
	for (uint32_t i = 0; i < 12; i++)
		m.fill[i] = index * 2654435761u ^ round * 40503u ^ (direction << 16) ^ i;
	return m;
}

/* The buffer holds, per QP, a receive slot and a send slot. */
uint64_t recv_slot(uint32_t i) { return uint64_t(i) * 2 * small_msg; }
uint64_t send_slot(uint32_t i) { return recv_slot(i) + small_msg; }

/* Receives one message per QP, checking QP, index, round and contents. */
void receive_round(Side &s, uint32_t round, uint32_t direction)
{
	std::vector<bool> seen(s.qps.size());
	for (size_t k = 0; k < s.qps.size(); k++) {
		struct ibv_wc wc = poll_one(s.recv_cq, "receive", s.channel);
		uint64_t i = wc.wr_id;
		if (i >= s.qps.size() || seen[i])
			die("unexpected receive wr_id %" PRIu64, i);
		seen[i] = true;
		if (wc.opcode != IBV_WC_RECV || wc.byte_len != small_msg ||
		    wc.qp_num != s.qps[i]->qp_num)
			die("receive #%" PRIu64 ": opcode %d, %u bytes, qp %u (want %u)", i, wc.opcode,
			    wc.byte_len, wc.qp_num, s.qps[i]->qp_num);
		Message want = make_message(uint32_t(i), round, direction);
		if (std::memcmp(s.buf.data() + recv_slot(uint32_t(i)), &want, sizeof(want)))
			die("receive #%" PRIu64 " round %u: wrong payload", i, round);
		post_recv(s.qps[i], i, s, recv_slot(uint32_t(i)), small_msg);
	}
}

void send_round(Side &s, uint32_t round, uint32_t direction)
{
	for (uint32_t i = 0; i < s.qps.size(); i++) {
		Message m = make_message(i, round, direction);
		std::memcpy(s.buf.data() + send_slot(i), &m, sizeof(m));
		post_send(s.qps[i], IBV_WR_SEND, i, s, send_slot(i), small_msg, true);
	}
	std::vector<bool> seen(s.qps.size());
	for (size_t k = 0; k < s.qps.size(); k++) {
		struct ibv_wc wc = poll_one(s.send_cq, "send");
		if (wc.wr_id >= s.qps.size() || seen[wc.wr_id] || wc.opcode != IBV_WC_SEND ||
		    wc.qp_num != s.qps[wc.wr_id]->qp_num)
			die("unexpected send completion wr_id %" PRIu64, wc.wr_id);
		seen[wc.wr_id] = true;
	}
}

int open_fd_count()
{
	int n = 0;
	if (DIR *d = opendir("/proc/self/fd")) {
		while (readdir(d))
			n++;
		closedir(d);
	}
	return n - 3; /* ".", "..", the directory's own fd */
}

void run_connect(const Options &o, int ctl, bool server)
{
	Side s;
	auto t0 = Clock::now();
	s.open();
	if (o.events && !(s.channel = ibv_create_comp_channel(s.ctx)))
		die("ibv_create_comp_channel");
	s.make_buffer(size_t(o.qps) * 2 * small_msg);
	/* One outstanding send and receive per QP and round. */
	s.make_qps(o.qps, 4, 4, int(o.qps), int(o.qps));
	double create_s = seconds_since(t0);

	auto t1 = Clock::now();
	s.init();
	for (uint32_t i = 0; i < o.qps; i++)
		post_recv(s.qps[i], i, s, recv_slot(i), small_msg);
	std::vector<uint32_t> peer;
	Endpoint pe{};
	exchange(ctl, server, s, peer, pe);
	s.connect(peer, pe.lid);
	sync_byte(ctl, !server); /* both sides in RTS with receives posted */
	double connect_s = seconds_since(t1);

	auto t2 = Clock::now();
	for (uint32_t r = 0; r < o.rounds; r++) {
		if (server) {
			receive_round(s, r, 0);
			send_round(s, r, 1);
		} else {
			send_round(s, r, 0);
			receive_round(s, r, 1);
		}
	}
	double traffic_s = seconds_since(t2);
	int fds = open_fd_count();
	sync_byte(ctl, !server); /* no QP is destroyed while the peer still talks */

	auto t3 = Clock::now();
	s.close();
	double destroy_s = seconds_since(t3);
	if (!server)
		std::printf("{\"mode\": \"connect\", \"qps\": %u, \"rounds\": %u, \"messages\": %" PRIu64
			    ", \"create_s\": %.6f, \"connect_s\": %.6f, \"traffic_s\": %.6f, "
			    "\"destroy_s\": %.6f, \"fds\": %d}\n",
			    o.qps, o.rounds, uint64_t(o.qps) * o.rounds * 2, create_s, connect_s,
			    traffic_s, destroy_s, fds);
}

/* ---- bw: RDMA WRITE bandwidth over N QPs ---- */

void run_bw(const Options &o, int ctl, bool server)
{
	Side s;
	s.open();
	/* Source and destination: one message-sized buffer each side, the
	 * same for every QP, so the measurement compares the engine's cost per
	 * QP rather than cache footprints. */
	s.make_buffer(o.msg);
	constexpr uint32_t per_qp_depth = 16;
	uint32_t window = std::max<uint32_t>(per_qp_depth, std::min<uint32_t>(o.qps * 2, 256));
	s.make_qps(o.qps, per_qp_depth, 1, int(window), 1);
	std::vector<uint32_t> peer;
	Endpoint pe{};
	exchange(ctl, server, s, peer, pe);
	s.init();
	s.connect(peer, pe.lid);
	sync_byte(ctl, !server);
	if (server) {
		sync_byte(ctl, false); /* passive: wait for the client's end */
		s.close();
		return;
	}
	std::memset(s.buf.data(), 0x5a, s.buf.size());
	uint64_t count = o.total / o.msg;
	std::vector<uint32_t> outstanding(o.qps);
	uint64_t in_flight = 0, completed = 0;
	auto reap = [&](int max) {
		struct ibv_wc wc[32];
		int n = ibv_poll_cq(s.send_cq, std::min(max, 32), wc);
		if (n < 0)
			die("ibv_poll_cq");
		for (int k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_RDMA_WRITE ||
			    wc[k].byte_len != o.msg || wc[k].wr_id >= o.qps ||
			    wc[k].qp_num != s.qps[wc[k].wr_id]->qp_num ||
			    !outstanding[wc[k].wr_id])
				die("bad write completion: %s", ibv_wc_status_str(wc[k].status));
			outstanding[wc[k].wr_id]--;
			in_flight--;
			completed++;
		}
		return n;
	};
	/* Warm-up, not timed: the first WRITE on each QP resolves its target
	 * through the broker (counted in the connect figures instead). */
	uint64_t spins = 0;
	for (uint32_t q = 0; q < o.qps; q++) {
		post_send(s.qps[q], IBV_WR_RDMA_WRITE, q, s, 0, uint32_t(o.msg), true, &pe, 0);
		outstanding[q]++;
		in_flight++;
		while (in_flight) {
			if (!reap(32) && (++spins & 1023) == 0)
				check_deadline("warm-up completions");
		}
	}
	completed = 0;
	auto cpu_now = [] {
		struct timespec ts;
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
		return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
	};
	double cpu0 = cpu_now();
	auto t0 = Clock::now();
	for (uint64_t k = 0; k < count; k++) {
		uint32_t q = uint32_t(k % o.qps);
		while (in_flight >= window || outstanding[q] >= per_qp_depth) {
			if (!reap(32) && (++spins & 1023) == 0)
				check_deadline("write completions");
		}
		post_send(s.qps[q], IBV_WR_RDMA_WRITE, q, s, 0, uint32_t(o.msg), true, &pe, 0);
		outstanding[q]++;
		in_flight++;
	}
	while (in_flight) {
		if (!reap(32) && (++spins & 1023) == 0)
			check_deadline("write completions");
	}
	double secs = seconds_since(t0);
	double cpu = cpu_now() - cpu0;
	if (completed != count)
		die("completed %" PRIu64 " of %" PRIu64, completed, count);
	sync_byte(ctl, true);
	s.close();
	std::printf("{\"mode\": \"bw\", \"qps\": %u, \"msg\": %" PRIu64 ", \"bytes\": %" PRIu64
		    ", \"seconds\": %.6f, \"gbps\": %.4f, \"cpu_seconds\": %.6f, \"gb_per_cpu_s\": %.4f}\n",
		    o.qps, o.msg, count * o.msg, secs, double(count * o.msg) / secs / 1e9, cpu,
		    double(count * o.msg) / cpu / 1e9);
}

/* ---- mem: shared memory per QP ---- */

/* Allocated bytes of this process's shmverbs segment memfds (each file
 * once: the library may hold a second descriptor of one). */
uint64_t segment_bytes()
{
	uint64_t total = 0;
	std::vector<ino_t> seen;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		die("/proc/self/fd");
	while (struct dirent *e = readdir(d)) {
		char path[300], target[256];
		std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		struct stat st;
		if (std::strstr(target, "memfd:shmverbs-seg-") && stat(path, &st) == 0 &&
		    std::find(seen.begin(), seen.end(), st.st_ino) == seen.end()) {
			seen.push_back(st.st_ino);
			total += uint64_t(st.st_blocks) * 512;
		}
	}
	closedir(d);
	return total;
}

void run_mem(const Options &o)
{
	Side s;
	s.open();
	/* Typical sizes: 64 send and receive WRs, one SGE, a CQ of 128. */
	constexpr uint32_t wr = 64;
	constexpr int cqe = 128;
	std::vector<struct ibv_cq *> cqs;
	std::vector<struct ibv_qp *> qps;
	struct ibv_qp_init_attr granted{};
	auto make_one = [&]() {
		struct ibv_cq *cq = ibv_create_cq(s.ctx, cqe, nullptr, nullptr, 0);
		if (!cq)
			die("ibv_create_cq: %s", std::strerror(errno));
		struct ibv_qp_init_attr a{};
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = wr;
		a.cap.max_recv_wr = wr;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		struct ibv_qp *qp = ibv_create_qp(s.pd, &a);
		if (!qp)
			die("ibv_create_qp #%zu: %s", qps.size(), std::strerror(errno));
		granted = a;
		cqs.push_back(cq);
		qps.push_back(qp);
	};
	s.make_buffer(small_msg); /* its key table lives in the segment too */
	make_one(); /* the segment exists from here on */
	uint64_t before = segment_bytes();
	for (uint32_t i = 0; i < o.qps; i++)
		make_one();
	uint64_t fresh = segment_bytes();
	/* Pages are allocated when touched: run every ring once round (each
	 * QP connected to itself, SENDs until its CQ ring and RQ lapped), so
	 * that the figure is what a QP in use costs. */
	std::vector<struct ibv_qp *> mine(qps.begin() + 1, qps.end());
	std::swap(s.qps, mine);
	s.init();
	s.connect(s.qpns(), s.lid);
	std::swap(s.qps, mine);
	uint32_t laps = uint32_t(cqs.back()->cqe + 1) / 2 / wr + 1;
	for (size_t i = 1; i < qps.size(); i++) {
		for (uint32_t lap = 0; lap < laps; lap++) {
			for (uint32_t k = 0; k < wr; k++)
				post_recv(qps[i], k, s, 0, small_msg);
			for (uint32_t k = 0; k < wr; k++) {
				post_send(qps[i], IBV_WR_SEND, k, s, 0, small_msg, true);
				poll_one(cqs[i], "lap: send or receive");
				poll_one(cqs[i], "lap: send or receive");
			}
		}
	}
	uint64_t after = segment_bytes();
	/* What the queues need in shared memory, at the sizes granted: the
	 * receive ring's slots and the CQ ring's slots (the send queue is
	 * private memory of the initiator: nothing shared). */
	auto pow2 = [](uint64_t v) { uint64_t p = 1; while (p < v) p <<= 1; return p; };
	uint64_t rq_slots = pow2(std::max(granted.cap.max_recv_wr, 1u)) *
		(sizeof(shmverbs::shm::RecvWqe) +
		 sizeof(shmverbs::shm::RecvSge) * std::max(granted.cap.max_recv_sge, 1u));
	uint64_t cq_slots = pow2(uint64_t(cqs.back()->cqe) + 1) * sizeof(shmverbs::shm::CqEntry);
	double per_qp = double(after - before) / o.qps;
	std::printf("{\"mode\": \"mem\", \"qps\": %u, \"segment_before\": %" PRIu64
		    ", \"segment_fresh\": %" PRIu64 ", \"per_qp_fresh\": %.1f"
		    ", \"segment_after\": %" PRIu64 ", \"per_qp\": %.1f, \"queues\": %" PRIu64
		    ", \"rq_slots\": %" PRIu64 ", \"cq_slots\": %" PRIu64 ", \"max_recv_wr\": %u"
		    ", \"cqe\": %d}\n",
		    o.qps, before, fresh, double(fresh - before) / o.qps, after, per_qp,
		    rq_slots + cq_slots, rq_slots, cq_slots,
		    granted.cap.max_recv_wr, cqs.back()->cqe);
	for (auto *qp : qps)
		ibv_destroy_qp(qp);
	for (auto *cq : cqs)
		ibv_destroy_cq(cq);
	ibv_dereg_mr(s.mr);
	ibv_dealloc_pd(s.pd);
	ibv_close_device(s.ctx);
}

/* ---- work: a fixed request/answer workload on one QP ---- */

void run_work(const Options &o, int ctl, bool server)
{
	Side s;
	s.open();
	/* [0, batch*msg): the WRITE area; then two 64-byte message slots. */
	uint64_t area = uint64_t(o.batch) * o.msg;
	if (o.events && !(s.channel = ibv_create_comp_channel(s.ctx)))
		die("ibv_create_comp_channel");
	s.make_buffer(area + 2 * small_msg);
	s.make_qps(1, o.batch + 2, 4, int(o.batch) + 4, 4);
	std::vector<uint32_t> peer;
	Endpoint pe{};
	exchange(ctl, server, s, peer, pe);
	struct ibv_qp *qp = s.qps[0];
	s.init();
	post_recv(qp, 0, s, area, small_msg);
	s.connect(peer, pe.lid);
	sync_byte(ctl, !server);
	/* Pairs run at once start together: each client, once connected,
	 * creates BARRIER/ready.<pid> and waits (sleeping) for BARRIER/go. */
	if (!server && !o.barrier.empty()) {
		std::string ready = o.barrier + "/ready." + std::to_string(getpid());
		int fd = ::open(ready.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
		if (fd < 0)
			die("%s: %s", ready.c_str(), std::strerror(errno));
		::close(fd);
		std::string go = o.barrier + "/go";
		while (::access(go.c_str(), F_OK) != 0) {
			check_deadline("the start barrier");
			std::this_thread::sleep_for(std::chrono::microseconds(200));
		}
	}
	auto t0 = Clock::now();
	for (uint32_t r = 1; r <= o.rounds; r++) {
		if (server) {
			struct ibv_wc wc = poll_one(s.recv_cq, "request", s.channel);
			uint32_t got;
			std::memcpy(&got, s.buf.data() + area, sizeof(got));
			if (wc.byte_len != small_msg || got != r)
				die("request %u: got %u", r, got);
			for (uint32_t b = 0; b < o.batch; b++) {
				uint32_t v;
				std::memcpy(&v, s.buf.data() + b * o.msg, sizeof(v));
				if (v != r)
					die("round %u: WRITE %u not placed before the SEND", r, b);
			}
			post_recv(qp, 0, s, area, small_msg);
			std::memcpy(s.buf.data() + area + small_msg, &r, sizeof(r));
			post_send(qp, IBV_WR_SEND, 1, s, area + small_msg, small_msg, true);
			poll_one(s.send_cq, "answer sent");
		} else {
			for (uint32_t b = 0; b < o.batch; b++) {
				std::memcpy(s.buf.data() + b * o.msg, &r, sizeof(r));
				post_send(qp, IBV_WR_RDMA_WRITE, 2, s, b * o.msg, uint32_t(o.msg), false,
					  &pe, b * o.msg);
			}
			std::memcpy(s.buf.data() + area + small_msg, &r, sizeof(r));
			post_send(qp, IBV_WR_SEND, 1, s, area + small_msg, small_msg, true);
			poll_one(s.send_cq, "request sent");
			struct ibv_wc wc = poll_one(s.recv_cq, "answer", s.channel);
			uint32_t got;
			std::memcpy(&got, s.buf.data() + area, sizeof(got));
			if (wc.byte_len != small_msg || got != r)
				die("answer %u: got %u", r, got);
			post_recv(qp, 0, s, area, small_msg);
		}
	}
	auto t1 = Clock::now();
	sync_byte(ctl, !server);
	s.close();
	auto mono = [](Clock::time_point t) {
		return std::chrono::duration<double>(t.time_since_epoch()).count();
	};
	if (!server)
		std::printf("{\"mode\": \"work\", \"rounds\": %u, \"batch\": %u, \"msg\": %" PRIu64
			    ", \"seconds\": %.6f, \"start\": %.6f, \"end\": %.6f}\n",
			    o.rounds, o.batch, o.msg, mono(t1) - mono(t0), mono(t0), mono(t1));
}

/* ---- main ---- */

uint64_t parse_size(const char *s)
{
	char *end = nullptr;
	uint64_t v = std::strtoull(s, &end, 0);
	switch (end && *end ? *end : 0) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	default: return v;
	}
}

Options parse(int argc, char **argv)
{
	Options o;
	if (argc < 2)
		die("usage: scale_bench connect|bw|mem|work [--qps N] [--rounds R] [--batch B] "
		    "[--msg BYTES] [--total BYTES] [--timeout S]");
	o.mode = argv[1];
	for (int i = 2; i < argc; i++) {
		std::string a = argv[i];
		if (i + 1 >= argc)
			die("%s needs a value", a.c_str());
		const char *v = argv[++i];
		if (a == "--qps") o.qps = uint32_t(parse_size(v));
		else if (a == "--rounds") o.rounds = uint32_t(parse_size(v));
		else if (a == "--batch") o.batch = uint32_t(parse_size(v));
		else if (a == "--events") o.events = uint32_t(parse_size(v));
		else if (a == "--msg") o.msg = parse_size(v);
		else if (a == "--total") o.total = parse_size(v);
		else if (a == "--timeout") o.timeout_s = std::strtod(v, nullptr);
		else if (a == "--barrier") o.barrier = v;
		else if (a == "--nofile") o.nofile = parse_size(v);
		else if (a == "--serve") o.serve_fd = std::atoi(v);
		else die("unknown option %s", a.c_str());
	}
	if (!o.qps || !o.rounds || !o.batch || o.msg < 64 || o.msg > (1u << 30))
		die("bad sizes");
	return o;
}

/* Starts the server: this binary again, with --serve and its socket. */
pid_t spawn_server(int argc, char **argv, int fd)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", std::strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		std::vector<std::string> args(argv, argv + argc);
		args.push_back("--serve");
		args.push_back(std::to_string(fd));
		std::vector<char *> cargs;
		for (auto &a : args)
			cargs.push_back(a.data());
		cargs.push_back(nullptr);
		execv("/proc/self/exe", cargs.data());
		std::_Exit(127);
	}
	return pid;
}

int wait_server(pid_t pid)
{
	for (;;) {
		int status = 0;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (Clock::now() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			die("server did not exit");
		}
		usleep(1000);
	}
}

} // namespace

int main(int argc, char **argv)
{
	Options o = parse(argc, argv);
	if (o.nofile) {
		/* As many programs run: the common default soft limit is 1024. */
		struct rlimit rl;
		getrlimit(RLIMIT_NOFILE, &rl);
		rl.rlim_cur = std::min<rlim_t>(o.nofile, rl.rlim_max);
		if (setrlimit(RLIMIT_NOFILE, &rl))
			die("setrlimit: %s", std::strerror(errno));
	}
	deadline = Clock::now() + std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
	if (o.mode == "mem") {
		run_mem(o);
		return 0;
	}
	void (*run)(const Options &, int, bool) = nullptr;
	if (o.mode == "connect")
		run = run_connect;
	else if (o.mode == "bw")
		run = run_bw;
	else if (o.mode == "work")
		run = run_work;
	else
		die("unknown mode %s", o.mode.c_str());

	if (o.serve_fd >= 0) {
		role = "server";
		if (getppid() == 1)
			return 2; /* the client is already gone */
		run(o, o.serve_fd, true);
		return 0;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair: %s", std::strerror(errno));
	fcntl(sv[0], F_SETFD, FD_CLOEXEC);
	pid_t server = spawn_server(argc, argv, sv[1]);
	::close(sv[1]);
	run(o, sv[0], false);
	::close(sv[0]);
	if (int rc = wait_server(server))
		die("server exited with %d", rc);
	return 0;
}
