/* SPDX-License-Identifier: MIT */
/*
 * The verbs steps the multi-process tests repeat: a QP's RESET -> INIT ->
 * RTR -> RTS walk toward a peer, and a bounded wait for a completion. No
 * Catch2 here: the stress workers (procs.h) use it too.
 */
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace shmv_test {

/* The attributes of the RESET -> INIT -> RTR -> RTS walk that vary between
 * tests; the rest is fixed (port 1, PKey index 0, path MTU 1024, PSN 0). */
struct QpPath {
	unsigned access = 0;        /* INIT qp_access_flags (not UD) */
	uint32_t qkey = 0x11111111; /* UD */
	uint8_t min_rnr_timer = 1;
	uint8_t max_rd_atomic = 1; /* RTR max_dest_rd_atomic and RTS max_rd_atomic */
	uint8_t timeout = 10;      /* 4 ms */
	uint8_t retry_cnt = 3;
	uint8_t rnr_retry = 7;
	uint8_t sl = 0; /* RTR ah_attr.sl (not UD) */
	bool global = false; /* RTR ah_attr with a GRH to port 1's GID 0 (not UD) */
};

/* RESET -> INIT on port 1: an errno, 0 on success. */
inline int qp_to_init(struct ibv_qp *qp, enum ibv_qp_type type, const QpPath &p = QpPath())
{
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (type == IBV_QPT_UD) {
		a.qkey = p.qkey;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = p.access;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	return ibv_modify_qp(qp, &a, mask);
}

/*
 * INIT -> RTR -> RTS toward QP `dest` at `dlid` (UD: no peer; XRC_RECV
 * stops at RTR). Each type gets exactly the attributes the state table
 * requires of it, so that this works on a device that checks the masks.
 */
inline int qp_init_to_rts(struct ibv_qp *qp, enum ibv_qp_type type, uint32_t dest, uint16_t dlid,
			  const QpPath &p = QpPath())
{
	const bool reliable = type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND ||
			      type == IBV_QPT_XRC_RECV;
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTR;
	int mask = IBV_QP_STATE;
	if (type != IBV_QPT_UD) {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dest;
		a.ah_attr.dlid = dlid;
		a.ah_attr.sl = p.sl;
		a.ah_attr.port_num = 1;
		if (p.global) {
			a.ah_attr.is_global = 1;
			a.ah_attr.grh.hop_limit = 1;
			if (int e = ibv_query_gid(qp->context, 1, 0, &a.ah_attr.grh.dgid))
				return e;
		}
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (reliable) {
			a.max_dest_rd_atomic = p.max_rd_atomic;
			a.min_rnr_timer = p.min_rnr_timer;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	if (int e = ibv_modify_qp(qp, &a, mask))
		return e;
	if (type == IBV_QPT_XRC_RECV)
		return 0;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (reliable) {
		a.timeout = p.timeout;
		a.retry_cnt = p.retry_cnt;
		a.rnr_retry = p.rnr_retry;
		a.max_rd_atomic = p.max_rd_atomic;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			IBV_QP_MAX_QP_RD_ATOMIC;
	}
	return ibv_modify_qp(qp, &a, mask);
}

/* RESET -> RTS (qp_to_init, then qp_init_to_rts). */
inline int qp_to_rts(struct ibv_qp *qp, enum ibv_qp_type type, uint32_t dest, uint16_t dlid,
		     const QpPath &p = QpPath())
{
	if (int e = qp_to_init(qp, type, p))
		return e;
	return qp_init_to_rts(qp, type, dest, dlid, p);
}

/* One receive WR of the one SGE `sge`: ibv_post_recv()'s errno. */
inline int post_recv_sge(struct ibv_qp *qp, struct ibv_sge sge, uint64_t wr_id)
{
	struct ibv_recv_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

/* `wr` (its opcode, wr_id and remote or UD part) posted signaled with the
 * one SGE `sge`: ibv_post_send()'s errno. */
inline int post_send_sge(struct ibv_qp *qp, struct ibv_send_wr wr, struct ibv_sge sge)
{
	struct ibv_send_wr *bad = nullptr;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.next = nullptr;
	return ibv_post_send(qp, &wr, &bad);
}

/* Polls `cq` for one completion for up to `ms`: 1, a negative poll error,
 * or 0 when none came. */
inline int poll_one(struct ibv_cq *cq, struct ibv_wc &wc, int ms = 10000,
		    std::chrono::microseconds nap = std::chrono::microseconds(100))
{
	auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
	while (std::chrono::steady_clock::now() < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n)
			return n;
		std::this_thread::sleep_for(nap);
	}
	return 0;
}

/* One completion within `ms`. */
inline bool wait_wc(struct ibv_cq *cq, struct ibv_wc &wc, int ms = 10000)
{
	return poll_one(cq, wc, ms) == 1;
}

} // namespace shmv_test
