/* SPDX-License-Identifier: MIT */
/*
 * What the queue semantics cost: shmverbs through the public verbs API, linked
 * like an application (the drop-in libibverbs.so.1), against a plain
 * single-producer ring written here as the reference that does the same work
 * with nothing else: a WQE into a ring, the data moved, a CQE into a ring.
 *
 *   - post_send + poll_cq per WR: a loopback pair of QPs in this one process
 *     (the engine takes the same path as across processes), RC RDMA WRITE
 *     and UD SEND of 8 bytes, inline or not, signaled every 1/16/64 WRs,
 *     posted one at a time or as post lists of 16; the UD target's receives
 *     are posted (and its completions drained and checked) outside the
 *     timed part, on both sides: the ring's UD SEND takes a receive WQE
 *     (wr_id, address, length), checks the length and writes the receive
 *     completion from it, the work a receive cannot skip;
 *   - an empty poll_cq;
 *   - draining completions with ibv_poll_cq and with the ibv_cq_ex iterator
 *     (ibv_start_poll / ibv_next_poll / ibv_end_poll);
 *   - QP create + connect (RESET -> INIT -> RTR -> RTS) + destroy;
 *   - shared-memory bytes per QP: growth of the allocated blocks of this
 *     process's segment memfd (fstat st_blocks of /proc/self/fd/N ->
 *     /memfd:shmverbs-seg-0) over 64 RC QPs, and the Pss growth of the
 *     whole process (/proc/self/smaps_rollup: heap included) beside it.
 *
 * Each figure is the median of chunks that alternate shmverbs and the ring,
 * so noise spreads over both: three, or for post_send + poll_cq fifteen (a
 * chunk there lasts about a millisecond, so one hiccup of the VM moves a
 * median of three: UD SEND signaled each, 7 processes of each, ratio
 * 2.75-3.88 with three chunks, 3.03-3.18 with fifteen; the medians of the 7
 * agree, 3.09 and 3.08). One JSON line per measurement:
 *   {"group": "queue", "name", "value", "unit", "reference", "ref_value", "ratio"}
 * Needs the broker (SHMVERBS_BROKER, SHMVERBS_RUNTIME_DIR) for QP numbers.
 *
 *   queue-bench [--smoke] [--only NAME]
 * --only runs just the post_send + poll_cq case NAME (e.g.
 * post_poll_rc_write_inline_sig16_list1), for profiling one case.
 */
#include <infiniband/verbs.h>

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool smoke = false;
const char *only = nullptr; /* --only: one post/poll case by name, nothing else */
volatile uint64_t sink; /* what the drains read goes here, so it is read */

double now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

[[noreturn]] void die(const char *what, int err)
{
	std::fprintf(stderr, "queue-bench: %s: %s\n", what, std::strerror(err));
	std::exit(1);
}

void emit(const std::string &name, double value, const char *unit, const char *reference = nullptr,
	  double ref_value = 0)
{
	if (reference)
		std::printf("{\"group\": \"queue\", \"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", "
			    "\"reference\": \"%s\", \"ref_value\": %.6g, \"ratio\": %.4g}\n",
			    name.c_str(), value, unit, reference, ref_value,
			    ref_value > 0 ? value / ref_value : 0.0);
	else
		std::printf("{\"group\": \"queue\", \"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", "
			    "\"reference\": null, \"ref_value\": null, \"ratio\": null}\n",
			    name.c_str(), value, unit);
	std::fflush(stdout);
}

double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

/* ------------------------------------------------------------------------ */
/* The reference: a plain single-producer ring pair per queue.               */

struct RingWqe {
	uint64_t wr_id;
	uint64_t local_addr;
	uint64_t remote_addr;
	uint32_t length;
	uint32_t flags;
	uint8_t inline_data[32];
};
static_assert(sizeof(RingWqe) == 64, "one cache line per WQE");

struct RingCqe {
	std::atomic<uint64_t> seq; /* index + 1 once written (release) */
	uint64_t wr_id;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t src_qp;
	uint8_t opcode;
	uint8_t status;
	uint8_t pad[34];
};
static_assert(sizeof(RingCqe) == 64, "one cache line per CQE");

struct RingCq {
	std::vector<RingCqe> slots;
	uint64_t prod = 0, cons = 0;
	explicit RingCq(size_t n) : slots(n) {}

	void push(uint64_t wr_id, uint32_t len, uint8_t opcode, uint8_t status = IBV_WC_SUCCESS,
		  uint32_t src_qp = 0)
	{
		RingCqe &c = slots[prod % slots.size()];
		c.wr_id = wr_id;
		c.byte_len = len;
		c.qp_num = 1;
		c.src_qp = src_qp;
		c.opcode = opcode;
		c.status = status;
		c.seq.store(prod + 1, std::memory_order_release); /* pairs with poll's acquire */
		prod++;
	}

	int poll(int n, struct ibv_wc *wc)
	{
		int got = 0;
		while (got < n) {
			RingCqe &c = slots[cons % slots.size()];
			if (c.seq.load(std::memory_order_acquire) != cons + 1)
				break;
			wc[got] = {};
			wc[got].wr_id = c.wr_id;
			wc[got].status = ibv_wc_status(c.status);
			wc[got].opcode = ibv_wc_opcode(c.opcode);
			wc[got].byte_len = c.byte_len;
			wc[got].qp_num = c.qp_num;
			wc[got].src_qp = c.src_qp;
			cons++;
			got++;
		}
		return got;
	}
};

/* A receive WQE of one SGE. */
struct RingRecv {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

/* A send queue whose "hardware" is the posting thread itself, as in
 * shmverbs: post appends the WQEs, then executes them in order. `ud` also
 * takes the receive WQE at the head of the receive ring (none posted: the
 * message is dropped, as UD does), places the 40-byte GRH area and the
 * payload if they fit, and writes the receive completion with the WQE's
 * wr_id, as a UD SEND does. */
struct RingQp {
	std::vector<RingWqe> sq;
	std::atomic<uint64_t> tail{0}, head{0};
	RingCq &cq;
	RingCq *recv_cq;
	std::vector<RingRecv> rq;
	uint64_t recv_head = 0, recv_tail = 0;
	char *target;

	RingQp(size_t depth, RingCq &c, RingCq *rc, char *t) : sq(depth), cq(c), recv_cq(rc), target(t)
	{
		if (rc)
			rq.resize(4096);
	}

	void post_recv(uint64_t addr, uint32_t length, uint32_t lkey, int n)
	{
		for (int i = 0; i < n; i++) {
			rq[recv_tail % rq.size()] = {recv_tail, addr, length, lkey};
			recv_tail++;
		}
	}

	int post_send(struct ibv_send_wr *wr, struct ibv_send_wr **bad)
	{
		for (; wr; wr = wr->next) {
			uint64_t t = tail.load(std::memory_order_relaxed);
			if (t - head.load(std::memory_order_acquire) == sq.size() || wr->num_sge != 1) {
				*bad = wr;
				return ENOMEM;
			}
			RingWqe &w = sq[t % sq.size()];
			w.wr_id = wr->wr_id;
			w.length = wr->sg_list[0].length;
			w.flags = wr->send_flags;
			w.remote_addr = wr->wr.rdma.remote_addr;
			if ((wr->send_flags & IBV_SEND_INLINE) && w.length <= sizeof(w.inline_data))
				std::memcpy(w.inline_data, reinterpret_cast<void *>(wr->sg_list[0].addr),
					    w.length);
			else
				w.local_addr = wr->sg_list[0].addr;
			tail.store(t + 1, std::memory_order_release); /* pairs with execute's acquire */
		}
		execute();
		return 0;
	}

	void execute()
	{
		uint64_t h = head.load(std::memory_order_relaxed);
		while (h != tail.load(std::memory_order_acquire)) {
			const RingWqe &w = sq[h % sq.size()];
			const void *src = (w.flags & IBV_SEND_INLINE) ? static_cast<const void *>(w.inline_data)
								       : reinterpret_cast<const void *>(w.local_addr);
			if (recv_cq) {
				if (recv_head != recv_tail) {
					const RingRecv &r = rq[recv_head++ % rq.size()];
					const uint32_t len = w.length + 40;
					const bool fits = len <= r.length;
					if (fits)
						std::memcpy(reinterpret_cast<char *>(r.addr) + 40, src, w.length);
					recv_cq->push(r.wr_id, len, IBV_WC_RECV,
						      fits ? IBV_WC_SUCCESS : IBV_WC_LOC_LEN_ERR, 1);
				}
			} else {
				std::memcpy(target + (w.remote_addr & 63), src, w.length);
			}
			if (w.flags & IBV_SEND_SIGNALED)
				cq.push(w.wr_id, w.length, recv_cq ? IBV_WC_SEND : IBV_WC_RDMA_WRITE);
			head.store(++h, std::memory_order_release);
		}
	}
};

/* ------------------------------------------------------------------------ */
/* shmverbs objects through the public API.                                  */

struct Dev {
	struct ibv_context *ctx = nullptr;
	struct ibv_pd *pd = nullptr;
	uint16_t lid = 0;
	std::vector<char> buf = std::vector<char>(1 << 16);
	struct ibv_mr *mr = nullptr;

	Dev()
	{
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);
		if (!list || n == 0)
			die("no device", errno ? errno : ENODEV);
		ctx = ibv_open_device(list[0]);
		ibv_free_device_list(list);
		if (!ctx)
			die("ibv_open_device", errno);
		pd = ibv_alloc_pd(ctx);
		if (!pd)
			die("ibv_alloc_pd", errno);
		struct ibv_port_attr pa{};
		if (int e = ibv_query_port(ctx, 1, &pa))
			die("ibv_query_port", e);
		lid = pa.lid;
		mr = ibv_reg_mr(pd, buf.data(), buf.size(),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!mr)
			die("ibv_reg_mr", errno);
	}

	uint64_t addr(size_t off) { return uint64_t(uintptr_t(buf.data() + off)); }

	struct ibv_cq *cq(int cqe)
	{
		struct ibv_cq *c = ibv_create_cq(ctx, cqe, nullptr, nullptr, 0);
		if (!c)
			die("ibv_create_cq", errno);
		return c;
	}

	struct ibv_qp *qp(enum ibv_qp_type type, struct ibv_cq *scq, struct ibv_cq *rcq, uint32_t depth,
			  uint32_t rdepth)
	{
		struct ibv_qp_init_attr a{};
		a.send_cq = scq;
		a.recv_cq = rcq;
		a.qp_type = type;
		a.cap.max_send_wr = depth;
		a.cap.max_recv_wr = rdepth;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		a.cap.max_inline_data = 64;
		struct ibv_qp *q = ibv_create_qp(pd, &a);
		if (!q)
			die("ibv_create_qp", errno);
		return q;
	}

	/* RESET -> INIT -> RTR -> RTS toward dest (UD: no peer). */
	void up(struct ibv_qp *q, uint32_t dest)
	{
		struct ibv_qp_attr a{};
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (q->qp_type == IBV_QPT_UD) {
			a.qkey = 0x11111111;
			mask |= IBV_QP_QKEY;
		} else {
			a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
			mask |= IBV_QP_ACCESS_FLAGS;
		}
		if (int e = ibv_modify_qp(q, &a, mask))
			die("modify to INIT", e);
		a = {};
		a.qp_state = IBV_QPS_RTR;
		mask = IBV_QP_STATE;
		if (q->qp_type == IBV_QPT_RC) {
			a.path_mtu = IBV_MTU_4096;
			a.dest_qp_num = dest;
			a.ah_attr.dlid = lid;
			a.ah_attr.port_num = 1;
			a.max_dest_rd_atomic = 1;
			a.min_rnr_timer = 1;
			mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
		if (int e = ibv_modify_qp(q, &a, mask))
			die("modify to RTR", e);
		a = {};
		a.qp_state = IBV_QPS_RTS;
		mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		if (q->qp_type == IBV_QPT_RC) {
			a.timeout = 14;
			a.retry_cnt = 7;
			a.rnr_retry = 7;
			a.max_rd_atomic = 1;
			mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		}
		if (int e = ibv_modify_qp(q, &a, mask))
			die("modify to RTS", e);
	}

	void post_recvs(struct ibv_qp *q, int n)
	{
		if (n <= 0)
			return;
		const size_t count = size_t(n);
		std::vector<struct ibv_sge> sg(count, {addr(4096), 64, mr->lkey});
		std::vector<struct ibv_recv_wr> wr(count);
		for (int i = 0; i < n; i++) {
			wr[size_t(i)].sg_list = &sg[size_t(i)];
			wr[size_t(i)].num_sge = 1;
			wr[size_t(i)].next = i + 1 < n ? &wr[size_t(i) + 1] : nullptr;
		}
		struct ibv_recv_wr *bad = nullptr;
		if (int e = ibv_post_recv(q, wr.data(), &bad))
			die("ibv_post_recv", e);
	}
};

/* Polls until `want` completions came, bounded (a lost completion is a bug,
 * not a figure). */
template <typename Poll>
void reap(Poll poll, int want)
{
	struct ibv_wc wc[16];
	unsigned long spins = 0;
	while (want > 0) {
		int n = poll(std::min(want, 16), wc);
		if (n < 0)
			die("poll_cq", EIO);
		for (int i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				std::fprintf(stderr, "queue-bench: completion %s\n", ibv_wc_status_str(wc[i].status));
				std::exit(1);
			}
		want -= n;
		if (n == 0 && ++spins > 2000000000ul)
			die("completion never came", ETIMEDOUT);
	}
}

/* Takes every receive completion there is (untimed); any in error is a bug
 * of the case, not a figure. */
template <typename Poll>
void drain_receives(Poll poll)
{
	struct ibv_wc wc[16];
	int n;
	while ((n = poll(16, wc)) > 0)
		for (int i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV ||
			    wc[i].byte_len != 48) {
				std::fprintf(stderr, "queue-bench: receive completion %s, %u bytes\n",
					     ibv_wc_status_str(wc[i].status), wc[i].byte_len);
				std::exit(1);
			}
	if (n < 0)
		die("poll_cq", EIO);
}

struct PostPollCase {
	bool ud;
	bool inl;
	int signal_every;
	int list;
};

/* One chunk of `count` WRs: post in lists of c.list, poll each signaled
 * completion right after the list that carries it. Returns ns per WR, only
 * the posting and polling of the sender counted. */
template <typename Post, typename Poll, typename Refill>
double post_poll_chunk(const PostPollCase &c, int count, Post post, Poll poll, Refill refill,
		       std::vector<struct ibv_send_wr> &wrs)
{
	double timed = 0;
	const int round = c.ud ? 1024 : count; /* UD: receives posted per round */
	int done = 0;
	while (done < count) {
		int this_round = std::min(round, count - done);
		refill(this_round);
		double t0 = now_ns();
		for (int i = 0; i < this_round; i += c.list) {
			int k = std::min(c.list, this_round - i);
			int signaled = 0;
			for (int j = 0; j < k; j++) {
				struct ibv_send_wr &w = wrs[size_t(j)];
				w.wr_id = uint64_t(done + i + j);
				bool sig = (done + i + j + 1) % c.signal_every == 0;
				w.send_flags = (c.inl ? IBV_SEND_INLINE : 0) | (sig ? IBV_SEND_SIGNALED : 0);
				w.next = j + 1 < k ? &wrs[size_t(j) + 1] : nullptr;
				signaled += sig;
			}
			struct ibv_send_wr *bad = nullptr;
			if (int e = post(wrs.data(), &bad))
				die("post_send", e);
			if (signaled)
				reap(poll, signaled);
		}
		timed += now_ns() - t0;
		done += this_round;
	}
	return timed / count;
}

void bench_post_poll(Dev &d)
{
	static const PostPollCase cases[] = {
		{false, true, 1, 1},   {false, true, 16, 1},   {false, true, 64, 1},
		{false, false, 1, 1},  {false, false, 16, 1},  {false, false, 64, 1},
		{false, true, 16, 16}, {false, false, 16, 16}, {false, true, 64, 16},
		{true, true, 1, 1},    {true, true, 16, 1},    {true, true, 64, 1},
		{true, false, 16, 1},  {true, true, 16, 16},
	};
	const int count = smoke ? 256 : 16384, chunks = smoke ? 3 : 15;
	for (const PostPollCase &c : cases) {
		char name[96];
		std::snprintf(name, sizeof(name), "post_poll_%s_%s_sig%d_list%d", c.ud ? "ud_send" : "rc_write",
			      c.inl ? "inline" : "sge", c.signal_every, c.list);
		if (only && std::strcmp(name, only) != 0)
			continue;
		enum ibv_qp_type type = c.ud ? IBV_QPT_UD : IBV_QPT_RC;
		struct ibv_cq *scq = d.cq(4096), *rcq = d.cq(4096);
		struct ibv_qp *a = d.qp(type, scq, scq, 128, 16);
		struct ibv_qp *b = d.qp(type, rcq, rcq, 16, c.ud ? 1024 : 16);
		d.up(a, b->qp_num);
		d.up(b, a->qp_num);
		struct ibv_ah *ah = nullptr;
		if (c.ud) {
			struct ibv_ah_attr aa{};
			aa.dlid = d.lid;
			aa.port_num = 1;
			ah = ibv_create_ah(d.pd, &aa);
			if (!ah)
				die("ibv_create_ah", errno);
		}
		struct ibv_sge sge = {d.addr(0), 8, d.mr->lkey};
		std::vector<struct ibv_send_wr> wrs(16);
		for (struct ibv_send_wr &w : wrs) {
			w = {};
			w.sg_list = &sge;
			w.num_sge = 1;
			if (c.ud) {
				w.opcode = IBV_WR_SEND;
				w.wr.ud.ah = ah;
				w.wr.ud.remote_qpn = b->qp_num;
				w.wr.ud.remote_qkey = 0x11111111;
			} else {
				w.opcode = IBV_WR_RDMA_WRITE;
				w.wr.rdma.remote_addr = d.addr(8192);
				w.wr.rdma.rkey = d.mr->rkey;
			}
		}
		RingCq ring_cq(4096), ring_rcq(4096);
		RingQp ring(128, ring_cq, c.ud ? &ring_rcq : nullptr, d.buf.data() + 8192);

		auto verbs_post = [&](struct ibv_send_wr *w, struct ibv_send_wr **bad) {
			return ibv_post_send(a, w, bad);
		};
		auto verbs_poll = [&](int n, struct ibv_wc *wc) { return ibv_poll_cq(scq, n, wc); };
		auto verbs_refill = [&](int n) {
			if (!c.ud)
				return;
			drain_receives([&](int k, struct ibv_wc *wc) { return ibv_poll_cq(rcq, k, wc); });
			d.post_recvs(b, n);
		};
		auto ring_post = [&](struct ibv_send_wr *w, struct ibv_send_wr **bad) {
			return ring.post_send(w, bad);
		};
		auto ring_poll = [&](int n, struct ibv_wc *wc) { return ring_cq.poll(n, wc); };
		auto ring_refill = [&](int n) {
			if (!c.ud)
				return;
			drain_receives([&](int k, struct ibv_wc *wc) { return ring_rcq.poll(k, wc); });
			ring.post_recv(d.addr(4096), 64, d.mr->lkey, n);
		};

		std::vector<double> v, r;
		for (int k = 0; k < chunks; k++) {
			v.push_back(post_poll_chunk(c, count, verbs_post, verbs_poll, verbs_refill, wrs));
			r.push_back(post_poll_chunk(c, count, ring_post, ring_poll, ring_refill, wrs));
		}
		emit(name, median(v), "ns/WR", "plain ring", median(r));

		verbs_refill(0);
		if (ah)
			ibv_destroy_ah(ah);
		ibv_destroy_qp(a);
		ibv_destroy_qp(b);
		ibv_destroy_cq(scq);
		ibv_destroy_cq(rcq);
	}
}

void bench_empty_poll(Dev &d)
{
	const int count = smoke ? 1000 : 1000000;
	struct ibv_cq *cq = d.cq(256);
	RingCq ring_cq(256);
	struct ibv_wc wc;
	double v[3], r[3];
	for (int k = 0; k < 3; k++) {
		double t0 = now_ns();
		for (int i = 0; i < count; i++)
			if (ibv_poll_cq(cq, 1, &wc) != 0)
				die("empty CQ gave a completion", EIO);
		v[k] = (now_ns() - t0) / count;
		t0 = now_ns();
		for (int i = 0; i < count; i++)
			if (ring_cq.poll(1, &wc) != 0)
				die("empty ring gave a completion", EIO);
		r[k] = (now_ns() - t0) / count;
	}
	emit("poll_cq_empty", median({v[0], v[1], v[2]}), "ns", "plain ring", median({r[0], r[1], r[2]}));
	ibv_destroy_cq(cq);
}

/* Drains `n` completions, 16 at a time, with ibv_poll_cq. */
double drain_poll_cq(struct ibv_cq *cq, int n)
{
	uint64_t sum = 0;
	double t0 = now_ns();
	reap([&](int k, struct ibv_wc *w) {
		int got = ibv_poll_cq(cq, k, w);
		for (int i = 0; i < got; i++)
			sum += w[i].wr_id + w[i].byte_len;
		return got;
	}, n);
	double t = now_ns() - t0;
	sink = sum;
	return t;
}

/* Drains `n` completions with the ibv_cq_ex iterator, reading what
 * ibv_poll_cq would have filled in. */
double drain_cq_ex(struct ibv_cq_ex *cq, int n)
{
	struct ibv_poll_cq_attr attr{};
	uint64_t sum = 0;
	double t0 = now_ns();
	unsigned long spins = 0;
	while (n > 0) {
		int e = ibv_start_poll(cq, &attr);
		if (e == ENOENT) {
			if (++spins > 2000000000ul)
				die("cq_ex completion never came", ETIMEDOUT);
			continue;
		}
		if (e)
			die("ibv_start_poll", e);
		do {
			if (cq->status != IBV_WC_SUCCESS)
				die("cq_ex completion status", EIO);
			sum += cq->wr_id + ibv_wc_read_byte_len(cq) + ibv_wc_read_opcode(cq) +
			       ibv_wc_read_qp_num(cq);
			n--;
		} while (n > 0 && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	double t = now_ns() - t0;
	sink = sum;
	return t;
}

void bench_cq_ex(Dev &d)
{
	const int per_fill = 64, fills = smoke ? 4 : 400;
	struct ibv_cq_init_attr_ex ca{};
	ca.cqe = 256;
	ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(d.ctx, &ca);
	if (!cqx)
		die("ibv_create_cq_ex", errno);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	struct ibv_cq *tcq = d.cq(16);
	struct ibv_qp *a = d.qp(IBV_QPT_RC, cq, cq, 128, 16), *b = d.qp(IBV_QPT_RC, tcq, tcq, 16, 16);
	d.up(a, b->qp_num);
	d.up(b, a->qp_num);
	struct ibv_sge sge = {d.addr(0), 8, d.mr->lkey};
	struct ibv_send_wr w{};
	w.sg_list = &sge;
	w.num_sge = 1;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	w.wr.rdma.remote_addr = d.addr(8192);
	w.wr.rdma.rkey = d.mr->rkey;
	auto fill = [&] {
		for (int i = 0; i < per_fill; i++) {
			struct ibv_send_wr *bad = nullptr;
			w.wr_id = uint64_t(i);
			if (int e = ibv_post_send(a, &w, &bad))
				die("post_send (fill)", e);
		}
	};
	RingCq ring_cq(256);
	double v[3], x[3], r[3];
	for (int k = 0; k < 3; k++) {
		double tv = 0, tx = 0, tr = 0;
		for (int f = 0; f < fills; f++) {
			fill();
			tv += drain_poll_cq(cq, per_fill);
			fill();
			tx += drain_cq_ex(cqx, per_fill);
			for (int i = 0; i < per_fill; i++)
				ring_cq.push(uint64_t(i), 8, IBV_WC_RDMA_WRITE);
			double t0 = now_ns();
			reap([&](int n, struct ibv_wc *wc) { return ring_cq.poll(n, wc); }, per_fill);
			tr += now_ns() - t0;
		}
		v[k] = tv / (fills * per_fill);
		x[k] = tx / (fills * per_fill);
		r[k] = tr / (fills * per_fill);
	}
	double ring = median({r[0], r[1], r[2]});
	emit("drain_poll_cq", median({v[0], v[1], v[2]}), "ns/CQE", "plain ring", ring);
	emit("drain_cq_ex", median({x[0], x[1], x[2]}), "ns/CQE", "plain ring", ring);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_destroy_cq(tcq);
}

void bench_qp_lifecycle(Dev &d)
{
	const int count = smoke ? 5 : 200;
	struct ibv_cq *cq = d.cq(256);
	struct ibv_qp *peer = d.qp(IBV_QPT_RC, cq, cq, 16, 16);
	double t_create = 0, t_connect = 0, t_destroy = 0;
	for (int i = 0; i < count; i++) {
		double t0 = now_ns();
		struct ibv_qp *q = d.qp(IBV_QPT_RC, cq, cq, 128, 128);
		double t1 = now_ns();
		d.up(q, peer->qp_num);
		double t2 = now_ns();
		if (int e = ibv_destroy_qp(q))
			die("ibv_destroy_qp", e);
		double t3 = now_ns();
		t_create += t1 - t0;
		t_connect += t2 - t1;
		t_destroy += t3 - t2;
	}
	emit("qp_create", t_create / count / 1000, "us");
	emit("qp_connect_rts", t_connect / count / 1000, "us");
	emit("qp_destroy", t_destroy / count / 1000, "us");
	emit("qp_create_connect_destroy", (t_create + t_connect + t_destroy) / count / 1000, "us");
	ibv_destroy_qp(peer);
	ibv_destroy_cq(cq);
}

/* Allocated bytes of this process's shmverbs segment (the memfd named
 * shmverbs-seg-*), from st_blocks: only touched pages count. */
long long segment_bytes()
{
	long long total = -1;
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	while (struct dirent *e = readdir(dir)) {
		char path[300], link[256];
		std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (!std::strstr(link, "memfd:shmverbs-seg-"))
			continue;
		struct stat st;
		if (stat(path, &st) == 0)
			total = std::max(total, 0LL) + (long long)st.st_blocks * 512;
	}
	closedir(dir);
	return total;
}

long long pss_bytes()
{
	FILE *f = std::fopen("/proc/self/smaps_rollup", "r");
	if (!f)
		return -1;
	char line[256];
	long long kb = -1;
	while (std::fgets(line, sizeof(line), f))
		if (std::sscanf(line, "Pss: %lld kB", &kb) == 1)
			break;
	std::fclose(f);
	return kb * 1024;
}

void bench_bytes_per_qp(Dev &d)
{
	const int count = 64;
	struct ibv_cq *cq = d.cq(256);
	struct ibv_qp *peer = d.qp(IBV_QPT_RC, cq, cq, 16, 16); /* the segment exists from here */
	long long seg0 = segment_bytes(), pss0 = pss_bytes();
	std::vector<struct ibv_qp *> qps;
	for (int i = 0; i < count; i++) {
		qps.push_back(d.qp(IBV_QPT_RC, cq, cq, 128, 128));
		d.up(qps.back(), peer->qp_num);
	}
	long long seg1 = segment_bytes(), pss1 = pss_bytes();
	if (seg0 >= 0 && seg1 >= 0)
		emit("shm_bytes_per_qp_segment_blocks", double(seg1 - seg0) / count, "B");
	if (pss0 >= 0 && pss1 >= 0)
		emit("process_pss_bytes_per_qp", double(pss1 - pss0) / count, "B");
	for (struct ibv_qp *q : qps)
		ibv_destroy_qp(q);
	ibv_destroy_qp(peer);
	ibv_destroy_cq(cq);
}

} // namespace

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (std::strcmp(argv[i], "--smoke") == 0)
			smoke = true;
		else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc)
			only = argv[++i];
		else {
			std::fprintf(stderr, "usage: %s [--smoke] [--only NAME]\n", argv[0]);
			return 2;
		}
	}
	Dev d;
	if (only) {
		bench_post_poll(d);
	} else {
		bench_bytes_per_qp(d); /* first: later cases leave freed areas behind */
		bench_post_poll(d);
		bench_empty_poll(d);
		bench_cq_ex(d);
		bench_qp_lifecycle(d);
	}
	ibv_dereg_mr(d.mr);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
	return 0;
}
