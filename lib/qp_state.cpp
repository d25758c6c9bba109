/* SPDX-License-Identifier: MIT */
#include "qp_state.h"

#include <array>

namespace shmverbs {

namespace {

/* The QP types the table covers, in a dense index. */
enum TypeIndex { T_RC, T_UC, T_UD, T_XRC_SEND, T_XRC_RECV, NUM_TYPES };

int type_index(enum ibv_qp_type type)
{
	switch (type) {
	case IBV_QPT_RC:
		return T_RC;
	case IBV_QPT_UC:
		return T_UC;
	case IBV_QPT_UD:
		return T_UD;
	case IBV_QPT_XRC_SEND:
		return T_XRC_SEND;
	case IBV_QPT_XRC_RECV:
		return T_XRC_RECV;
	default:
		return -1;
	}
}

constexpr int num_states = IBV_QPS_ERR + 1;

struct Params {
	uint32_t required = 0;
	uint32_t optional = 0;
};

struct Transition {
	bool valid = false;
	std::array<Params, NUM_TYPES> params{};
};

using Table = std::array<std::array<Transition, num_states>, num_states>;

/* Shorthands for the attribute bits, so each row below reads like the
 * specification's tables. */
constexpr uint32_t PKEY = IBV_QP_PKEY_INDEX, PORT = IBV_QP_PORT, QKEY = IBV_QP_QKEY,
		   ACCESS = IBV_QP_ACCESS_FLAGS, AV = IBV_QP_AV, MTU = IBV_QP_PATH_MTU,
		   DQPN = IBV_QP_DEST_QPN, RQ_PSN = IBV_QP_RQ_PSN, SQ_PSN = IBV_QP_SQ_PSN,
		   DEST_RD = IBV_QP_MAX_DEST_RD_ATOMIC, RD = IBV_QP_MAX_QP_RD_ATOMIC,
		   RNR_TIMER = IBV_QP_MIN_RNR_TIMER, TIMEOUT = IBV_QP_TIMEOUT,
		   RETRY = IBV_QP_RETRY_CNT, RNR_RETRY = IBV_QP_RNR_RETRY, ALT = IBV_QP_ALT_PATH,
		   MIG = IBV_QP_PATH_MIG_STATE, CUR = IBV_QP_CUR_STATE,
		   SQD_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY;

Table build_table()
{
	Table t{};
	auto allow = [&t](enum ibv_qp_state from, enum ibv_qp_state to) -> Transition & {
		Transition &tr = t[from][to];
		tr.valid = true;
		return tr;
	};
	/* Gives several QP types the same required/optional attributes. */
	auto set = [](Transition &tr, std::initializer_list<int> types, uint32_t req,
		      uint32_t opt) {
		for (int i : types)
			tr.params[i] = Params{req, opt};
	};

	/* Leaving any state for RESET or ERR needs nothing, except that a QP
	 * in RESET can only be initialised (or stay where it is). */
	for (int s = IBV_QPS_RESET; s <= IBV_QPS_ERR; s++) {
		allow(static_cast<enum ibv_qp_state>(s), IBV_QPS_RESET);
		if (s != IBV_QPS_RESET)
			allow(static_cast<enum ibv_qp_state>(s), IBV_QPS_ERR);
	}

	/* RESET -> INIT: bind to a port and a P_Key; the access rights or,
	 * for datagrams, the Q_Key. */
	Transition &rst_init = allow(IBV_QPS_RESET, IBV_QPS_INIT);
	set(rst_init, {T_RC, T_UC, T_XRC_SEND, T_XRC_RECV}, PKEY | PORT | ACCESS, 0);
	set(rst_init, {T_UD}, PKEY | PORT | QKEY, 0);

	/* INIT -> INIT: the same attributes, all optional. */
	Transition &init_init = allow(IBV_QPS_INIT, IBV_QPS_INIT);
	set(init_init, {T_RC, T_UC, T_XRC_SEND, T_XRC_RECV}, 0, PKEY | PORT | ACCESS);
	set(init_init, {T_UD}, 0, PKEY | QKEY | PORT);

	/* INIT -> RTR: connected types learn their peer; those that respond
	 * to RDMA reads/atomics (RC, XRC target) also their responder
	 * resources and RNR timer. */
	Transition &init_rtr = allow(IBV_QPS_INIT, IBV_QPS_RTR);
	set(init_rtr, {T_UC, T_XRC_SEND}, AV | MTU | DQPN | RQ_PSN, ALT | ACCESS | PKEY);
	set(init_rtr, {T_RC, T_XRC_RECV}, AV | MTU | DQPN | RQ_PSN | DEST_RD | RNR_TIMER,
	    ALT | ACCESS | PKEY);
	set(init_rtr, {T_UD}, 0, PKEY | QKEY);

	/* RTR -> RTS: the send side's PSN; reliable requesters also their
	 * retry behaviour and initiator depth. */
	Transition &rtr_rts = allow(IBV_QPS_RTR, IBV_QPS_RTS);
	set(rtr_rts, {T_UD}, SQ_PSN, CUR | QKEY);
	set(rtr_rts, {T_UC}, SQ_PSN, CUR | ALT | ACCESS | MIG);
	set(rtr_rts, {T_RC}, TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | RD,
	    CUR | ALT | ACCESS | RNR_TIMER | MIG);
	set(rtr_rts, {T_XRC_SEND}, TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | RD,
	    CUR | ALT | ACCESS | MIG);
	set(rtr_rts, {T_XRC_RECV}, TIMEOUT | SQ_PSN, CUR | ALT | ACCESS | RNR_TIMER | MIG);

	/* RTS -> RTS and SQD -> RTS: only what may change on a live QP. */
	for (enum ibv_qp_state from : {IBV_QPS_RTS, IBV_QPS_SQD}) {
		Transition &to_rts = allow(from, IBV_QPS_RTS);
		set(to_rts, {T_UD}, 0, CUR | QKEY);
		set(to_rts, {T_UC, T_XRC_SEND}, 0, CUR | ACCESS | ALT | MIG);
		set(to_rts, {T_RC, T_XRC_RECV}, 0, CUR | ACCESS | ALT | MIG | RNR_TIMER);
	}

	/* RTS -> SQD: drain the send queue, optionally with an event. */
	Transition &rts_sqd = allow(IBV_QPS_RTS, IBV_QPS_SQD);
	set(rts_sqd, {T_RC, T_UC, T_UD, T_XRC_SEND, T_XRC_RECV}, 0, SQD_NOTIFY);

	/* SQD -> SQD: a drained QP may be re-pathed. */
	Transition &sqd_sqd = allow(IBV_QPS_SQD, IBV_QPS_SQD);
	set(sqd_sqd, {T_UD}, 0, PKEY | QKEY);
	set(sqd_sqd, {T_UC}, 0, AV | ALT | ACCESS | PKEY | MIG);
	set(sqd_sqd, {T_RC}, 0,
	    PORT | AV | TIMEOUT | RETRY | RNR_RETRY | RD | DEST_RD | ALT | ACCESS | PKEY |
		    RNR_TIMER | MIG);
	set(sqd_sqd, {T_XRC_SEND}, 0,
	    PORT | AV | TIMEOUT | RETRY | RNR_RETRY | RD | ALT | ACCESS | PKEY | MIG);
	set(sqd_sqd, {T_XRC_RECV}, 0,
	    PORT | AV | TIMEOUT | DEST_RD | ALT | ACCESS | PKEY | RNR_TIMER | MIG);

	/* SQE -> RTS: recover an unreliable QP after a send error. Reliable
	 * types never enter SQE; the row is valid for them with no attribute. */
	Transition &sqe_rts = allow(IBV_QPS_SQE, IBV_QPS_RTS);
	set(sqe_rts, {T_UD}, 0, CUR | QKEY);
	set(sqe_rts, {T_UC}, 0, CUR | ACCESS);

	return t;
}

const Table &table()
{
	static const Table t = build_table();
	return t;
}

} // namespace

bool qp_state_is_valid(int state)
{
	return state >= IBV_QPS_RESET && state <= IBV_QPS_ERR;
}

bool qp_transition_allowed(enum ibv_qp_state cur, enum ibv_qp_state next,
			   enum ibv_qp_type type, uint32_t mask)
{
	int t = type_index(type);
	if (t < 0 || !qp_state_is_valid(cur) || !qp_state_is_valid(next))
		return false;

	/* The current state may only be asserted where the spec lets an
	 * application be unsure of it (after an asynchronous SQD/SQE). */
	if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
	    cur != IBV_QPS_SQD && cur != IBV_QPS_SQE)
		return false;

	const Transition &tr = table()[cur][next];
	if (!tr.valid)
		return false;
	const Params &p = tr.params[t];
	if ((mask & p.required) != p.required)
		return false;
	return (mask & ~(p.required | p.optional | IBV_QP_STATE)) == 0;
}

uint32_t qp_ignored_attrs(enum ibv_qp_type type)
{
	switch (type) {
	case IBV_QPT_XRC_SEND:
		return IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	case IBV_QPT_XRC_RECV:
		return IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
	default:
		return 0;
	}
}

const char *qp_state_name(enum ibv_qp_state state)
{
	switch (state) {
	case IBV_QPS_RESET:
		return "RESET";
	case IBV_QPS_INIT:
		return "INIT";
	case IBV_QPS_RTR:
		return "RTR";
	case IBV_QPS_RTS:
		return "RTS";
	case IBV_QPS_SQD:
		return "SQD";
	case IBV_QPS_SQE:
		return "SQE";
	case IBV_QPS_ERR:
		return "ERR";
	default:
		return "UNKNOWN";
	}
}

} // namespace shmverbs
