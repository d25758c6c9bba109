/* SPDX-License-Identifier: MIT */
/*
 * Cost of the send engine per work request, against the floor: one thread
 * posts an 8-byte inline RDMA WRITE (signaled) on an RC QP connected to a
 * second QP of the same process and polls its completion, N times; then the
 * same number of entries go through a plain single-producer ring (a 64-byte
 * entry written, published with a release store, consumed with an acquire
 * load), the least any post + poll can do. Prints ns per operation and the
 * ratio; run under `valgrind --tool=callgrind` for instruction counts.
 *
 *   SHMVERBS_BROKER=build/daemon/shmverbsd SHMVERBS_RUNTIME_DIR=$(mktemp -d) \
 *     build/bench/post-poll-bench [iterations]
 */
#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct Side {
	struct ibv_cq *cq = nullptr;
	struct ibv_qp *qp = nullptr;
};

bool fail(const char *what)
{
	std::fprintf(stderr, "post-poll-bench: %s failed\n", what);
	return false;
}

bool up(struct ibv_qp *qp, uint32_t dest, uint16_t lid)
{
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

double ns_since(std::chrono::steady_clock::time_point t0, long n)
{
	auto d = std::chrono::steady_clock::now() - t0;
	return double(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) / double(n);
}

/* The floor: a single-producer single-consumer ring of 64-byte entries. */
struct alignas(64) Entry {
	uint64_t words[8];
};

double plain_ring(long n)
{
	constexpr uint32_t size = 256;
	static Entry ring[size];
	alignas(64) static std::atomic<uint64_t> prod{0};
	alignas(64) static std::atomic<uint64_t> cons{0};
	uint64_t sum = 0;
	auto t0 = std::chrono::steady_clock::now();
	for (long i = 0; i < n; i++) {
		uint64_t p = prod.load(std::memory_order_relaxed);
		Entry &e = ring[p % size];
		e.words[0] = uint64_t(i);
		e.words[1] = 8;
		prod.store(p + 1, std::memory_order_release);
		uint64_t c = cons.load(std::memory_order_relaxed);
		if (c != prod.load(std::memory_order_acquire)) {
			sum += ring[c % size].words[0];
			cons.store(c + 1, std::memory_order_release);
		}
	}
	double ns = ns_since(t0, n);
	if (sum == 1)
		std::printf("\n");
	return ns;
}

} // namespace

int main(int argc, char **argv)
{
	long n = argc > 1 ? std::atol(argv[1]) : 200000;
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || !num)
		return fail("ibv_get_device_list"), 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		return fail("ibv_open_device"), 1;
	struct ibv_port_attr pa{};
	if (ibv_query_port(ctx, 1, &pa))
		return fail("ibv_query_port"), 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	std::vector<char> buf(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf.data(), buf.size(),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!pd || !mr)
		return fail("ibv_alloc_pd/ibv_reg_mr"), 1;
	Side s[2];
	for (Side &x : s) {
		x.cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
		struct ibv_qp_init_attr ia{};
		ia.send_cq = ia.recv_cq = x.cq;
		ia.qp_type = IBV_QPT_RC;
		ia.cap.max_send_wr = 128;
		ia.cap.max_recv_wr = 16;
		ia.cap.max_send_sge = 1;
		ia.cap.max_recv_sge = 1;
		ia.cap.max_inline_data = 64;
		x.qp = x.cq ? ibv_create_qp(pd, &ia) : nullptr;
		if (!x.qp)
			return fail("ibv_create_cq/ibv_create_qp"), 1;
	}
	if (!up(s[0].qp, s[1].qp->qp_num, pa.lid) || !up(s[1].qp, s[0].qp->qp_num, pa.lid))
		return fail("ibv_modify_qp"), 1;

	uint64_t value = 0;
	struct ibv_sge sge = {uint64_t(uintptr_t(&value)), 8, 0};
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = uint64_t(uintptr_t(buf.data() + 64));
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_wc wc;
	auto run = [&](long count) {
		for (long i = 0; i < count; i++) {
			wr.wr_id = uint64_t(i);
			value = uint64_t(i);
			if (ibv_post_send(s[0].qp, &wr, &bad))
				return fail("ibv_post_send");
			int got;
			while ((got = ibv_poll_cq(s[0].cq, 1, &wc)) == 0) {
			}
			if (got < 0 || wc.status != IBV_WC_SUCCESS)
				return fail("ibv_poll_cq");
		}
		return true;
	};
	if (!run(1000))
		return 1;
	auto t0 = std::chrono::steady_clock::now();
	if (!run(n))
		return 1;
	double engine = ns_since(t0, n);
	double floor = plain_ring(n);
	std::printf("post_send+poll_cq (8 B inline RDMA WRITE, one process): %.1f ns per WR\n", engine);
	std::printf("plain single-producer ring push+pop (64 B entry):       %.1f ns per entry\n", floor);
	std::printf("ratio: %.1fx\n", engine / floor);

	for (Side &x : s) {
		ibv_destroy_qp(x.qp);
		ibv_destroy_cq(x.cq);
	}
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
