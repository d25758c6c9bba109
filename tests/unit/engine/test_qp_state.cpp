/* SPDX-License-Identifier: MIT */
/*
 * The QP state machine as a table test. The expected table below is written
 * out row by row from the IB specification's "QP attributes per transition"
 * tables as Linux's ib_modify_qp_is_ok() enforces them, in a notation of its
 * own (attribute names in strings), independent of lib/qp_state.cpp. Every
 * transition x QP type x mask case is generated from it: required attributes
 * present, each one missing, each optional one added, each illegal one added.
 */
#include "qp_state.h"

#include <catch2/catch.hpp>

#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace shmverbs;

namespace {

const std::map<std::string, uint32_t> attr_bits = {
	{"STATE", IBV_QP_STATE},
	{"CUR", IBV_QP_CUR_STATE},
	{"SQD_NOTIFY", IBV_QP_EN_SQD_ASYNC_NOTIFY},
	{"ACCESS", IBV_QP_ACCESS_FLAGS},
	{"PKEY", IBV_QP_PKEY_INDEX},
	{"PORT", IBV_QP_PORT},
	{"QKEY", IBV_QP_QKEY},
	{"AV", IBV_QP_AV},
	{"MTU", IBV_QP_PATH_MTU},
	{"TIMEOUT", IBV_QP_TIMEOUT},
	{"RETRY", IBV_QP_RETRY_CNT},
	{"RNR_RETRY", IBV_QP_RNR_RETRY},
	{"RQ_PSN", IBV_QP_RQ_PSN},
	{"RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC},
	{"ALT_PATH", IBV_QP_ALT_PATH},
	{"MIN_RNR", IBV_QP_MIN_RNR_TIMER},
	{"SQ_PSN", IBV_QP_SQ_PSN},
	{"DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC},
	{"MIG", IBV_QP_PATH_MIG_STATE},
	{"CAP", IBV_QP_CAP},
	{"DQPN", IBV_QP_DEST_QPN},
};

uint32_t bits(const std::string &names)
{
	std::istringstream in(names);
	std::string word;
	uint32_t m = 0;
	while (in >> word)
		m |= attr_bits.at(word);
	return m;
}

std::string names_of(uint32_t mask)
{
	std::string s;
	for (const auto &[name, bit] : attr_bits)
		if (mask & bit)
			s += (s.empty() ? "" : "|") + name;
	return s.empty() ? "0" : s;
}

struct Row {
	enum ibv_qp_state from, to;
	enum ibv_qp_type type;
	const char *required;
	const char *optional;
};

constexpr enum ibv_qp_type RC = IBV_QPT_RC, UC = IBV_QPT_UC, UD = IBV_QPT_UD,
			   XS = IBV_QPT_XRC_SEND, XR = IBV_QPT_XRC_RECV;
constexpr enum ibv_qp_state RESET = IBV_QPS_RESET, INIT = IBV_QPS_INIT, RTR = IBV_QPS_RTR,
			    RTS = IBV_QPS_RTS, SQD = IBV_QPS_SQD, SQE = IBV_QPS_SQE,
			    ERR = IBV_QPS_ERR;

/* Every legal (from, to, type) with its required and optional attributes;
 * anything absent is illegal. */
std::vector<Row> expected_rows()
{
	std::vector<Row> rows = {
		{RESET, INIT, RC, "PKEY PORT ACCESS", ""},
		{RESET, INIT, UC, "PKEY PORT ACCESS", ""},
		{RESET, INIT, UD, "PKEY PORT QKEY", ""},
		{RESET, INIT, XS, "PKEY PORT ACCESS", ""},
		{RESET, INIT, XR, "PKEY PORT ACCESS", ""},

		{INIT, INIT, RC, "", "PKEY PORT ACCESS"},
		{INIT, INIT, UC, "", "PKEY PORT ACCESS"},
		{INIT, INIT, UD, "", "PKEY PORT QKEY"},
		{INIT, INIT, XS, "", "PKEY PORT ACCESS"},
		{INIT, INIT, XR, "", "PKEY PORT ACCESS"},

		{INIT, RTR, RC, "AV MTU DQPN RQ_PSN DEST_RD_ATOMIC MIN_RNR", "ALT_PATH ACCESS PKEY"},
		{INIT, RTR, UC, "AV MTU DQPN RQ_PSN", "ALT_PATH ACCESS PKEY"},
		{INIT, RTR, UD, "", "PKEY QKEY"},
		{INIT, RTR, XS, "AV MTU DQPN RQ_PSN", "ALT_PATH ACCESS PKEY"},
		{INIT, RTR, XR, "AV MTU DQPN RQ_PSN DEST_RD_ATOMIC MIN_RNR", "ALT_PATH ACCESS PKEY"},

		{RTR, RTS, RC, "TIMEOUT RETRY RNR_RETRY SQ_PSN RD_ATOMIC",
		 "CUR ALT_PATH ACCESS MIN_RNR MIG"},
		{RTR, RTS, UC, "SQ_PSN", "CUR ALT_PATH ACCESS MIG"},
		{RTR, RTS, UD, "SQ_PSN", "CUR QKEY"},
		{RTR, RTS, XS, "TIMEOUT RETRY RNR_RETRY SQ_PSN RD_ATOMIC", "CUR ALT_PATH ACCESS MIG"},
		{RTR, RTS, XR, "TIMEOUT SQ_PSN", "CUR ALT_PATH ACCESS MIN_RNR MIG"},

		{RTS, SQD, RC, "", "SQD_NOTIFY"},
		{RTS, SQD, UC, "", "SQD_NOTIFY"},
		{RTS, SQD, UD, "", "SQD_NOTIFY"},
		{RTS, SQD, XS, "", "SQD_NOTIFY"},
		{RTS, SQD, XR, "", "SQD_NOTIFY"},

		{SQD, SQD, RC, "",
		 "PORT AV TIMEOUT RETRY RNR_RETRY RD_ATOMIC DEST_RD_ATOMIC ALT_PATH ACCESS PKEY "
		 "MIN_RNR MIG"},
		{SQD, SQD, UC, "", "AV ALT_PATH ACCESS PKEY MIG"},
		{SQD, SQD, UD, "", "PKEY QKEY"},
		{SQD, SQD, XS, "",
		 "PORT AV TIMEOUT RETRY RNR_RETRY RD_ATOMIC ALT_PATH ACCESS PKEY MIG"},
		{SQD, SQD, XR, "", "PORT AV TIMEOUT DEST_RD_ATOMIC ALT_PATH ACCESS PKEY MIN_RNR MIG"},

		{SQE, RTS, RC, "", ""},
		{SQE, RTS, UC, "", "CUR ACCESS"},
		{SQE, RTS, UD, "", "CUR QKEY"},
		{SQE, RTS, XS, "", ""},
		{SQE, RTS, XR, "", ""},
	};
	/* RTS -> RTS and SQD -> RTS share their attribute sets. */
	for (enum ibv_qp_state from : {RTS, SQD}) {
		rows.push_back({from, RTS, RC, "", "CUR ACCESS ALT_PATH MIG MIN_RNR"});
		rows.push_back({from, RTS, UC, "", "CUR ACCESS ALT_PATH MIG"});
		rows.push_back({from, RTS, UD, "", "CUR QKEY"});
		rows.push_back({from, RTS, XS, "", "CUR ACCESS ALT_PATH MIG"});
		rows.push_back({from, RTS, XR, "", "CUR ACCESS ALT_PATH MIG MIN_RNR"});
	}
	/* Every state may go to RESET, every state but RESET to ERR, with
	 * nothing but the state. */
	for (enum ibv_qp_state from : {RESET, INIT, RTR, RTS, SQD, SQE, ERR})
		for (enum ibv_qp_type t : {RC, UC, UD, XS, XR}) {
			rows.push_back({from, RESET, t, "", ""});
			if (from != RESET)
				rows.push_back({from, ERR, t, "", ""});
		}
	return rows;
}

const Row *find_row(const std::vector<Row> &rows, enum ibv_qp_state from, enum ibv_qp_state to,
		    enum ibv_qp_type type)
{
	for (const Row &r : rows)
		if (r.from == from && r.to == to && r.type == type)
			return &r;
	return nullptr;
}

std::string describe(enum ibv_qp_state from, enum ibv_qp_state to, enum ibv_qp_type type,
		     uint32_t mask)
{
	std::ostringstream s;
	s << qp_state_name(from) << "->" << qp_state_name(to) << " type " << int(type)
	  << " mask " << names_of(mask);
	return s.str();
}

/* Every attribute bit ibv_modify_qp() defines. */
constexpr uint32_t all_bits = (1u << 21) - 1;

} // namespace

TEST_CASE("state machine: every transition x QP type x mask", "[qp][state]")
{
	const std::vector<Row> rows = expected_rows();
	size_t cases = 0;
	for (enum ibv_qp_state from : {RESET, INIT, RTR, RTS, SQD, SQE, ERR}) {
		for (enum ibv_qp_state to : {RESET, INIT, RTR, RTS, SQD, SQE, ERR}) {
			for (enum ibv_qp_type type : {RC, UC, UD, XS, XR}) {
				const Row *row = find_row(rows, from, to, type);
				if (!row) {
					/* Illegal whatever the mask. */
					for (uint32_t m : {uint32_t(IBV_QP_STATE), all_bits}) {
						INFO(describe(from, to, type, m));
						CHECK_FALSE(qp_transition_allowed(from, to, type, m));
						cases++;
					}
					continue;
				}
				const uint32_t req = bits(row->required) | IBV_QP_STATE;
				const uint32_t opt = bits(row->optional);

				auto expect = [&](uint32_t m, bool ok) {
					INFO(describe(from, to, type, m));
					CHECK(qp_transition_allowed(from, to, type, m) == ok);
					cases++;
				};
				expect(req, true);
				expect(req | opt, true);
				for (uint32_t bit = 1; bit <= all_bits; bit <<= 1) {
					if (bit == IBV_QP_STATE)
						continue;
					if (req & bit)
						expect(req & ~bit, false); /* required one missing */
					else if (opt & bit)
						expect(req | bit, true); /* optional one added */
					else
						expect(req | bit, false); /* illegal one added */
				}
			}
		}
	}
	CHECK(cases > 1000);
}

TEST_CASE("state machine: RESET cannot go to ERR, only be initialised", "[qp][state]")
{
	for (enum ibv_qp_type type : {RC, UC, UD, XS, XR}) {
		CHECK_FALSE(qp_transition_allowed(RESET, ERR, type, IBV_QP_STATE));
		CHECK(qp_transition_allowed(RESET, RESET, type, IBV_QP_STATE));
		CHECK(qp_transition_allowed(ERR, RESET, type, IBV_QP_STATE));
		CHECK(qp_transition_allowed(SQE, ERR, type, IBV_QP_STATE));
	}
}

TEST_CASE("state machine: CUR_STATE only where the current state may be unknown",
	  "[qp][state]")
{
	/* UD RTS -> RTS lists CUR as optional; so does every -> RTS row. */
	CHECK(qp_transition_allowed(RTS, RTS, UD, IBV_QP_STATE | IBV_QP_CUR_STATE));
	CHECK(qp_transition_allowed(SQE, RTS, UC, IBV_QP_STATE | IBV_QP_CUR_STATE));
	/* Never from RESET, INIT or ERR, and never into ERR or RESET. */
	CHECK_FALSE(qp_transition_allowed(INIT, INIT, RC, IBV_QP_STATE | IBV_QP_CUR_STATE));
	CHECK_FALSE(qp_transition_allowed(RTS, ERR, RC, IBV_QP_STATE | IBV_QP_CUR_STATE));
	CHECK_FALSE(qp_transition_allowed(RTS, RESET, RC, IBV_QP_STATE | IBV_QP_CUR_STATE));
}

TEST_CASE("state machine: modify without IBV_QP_STATE stays in the state", "[qp][state]")
{
	/* The caller passes next == cur; the mask then has no STATE bit. */
	CHECK(qp_transition_allowed(RTS, RTS, RC, IBV_QP_MIN_RNR_TIMER));
	CHECK(qp_transition_allowed(INIT, INIT, RC, 0));
	CHECK(qp_transition_allowed(RESET, RESET, RC, 0));
	CHECK_FALSE(qp_transition_allowed(RESET, RESET, RC, IBV_QP_PORT));
	CHECK_FALSE(qp_transition_allowed(RTR, RTR, RC, 0));
}

TEST_CASE("state machine: unknown types and states are never legal", "[qp][state]")
{
	CHECK_FALSE(qp_transition_allowed(RESET, INIT, IBV_QPT_RAW_PACKET,
					  IBV_QP_STATE | IBV_QP_PORT));
	CHECK_FALSE(qp_transition_allowed(RESET, INIT, IBV_QPT_DRIVER,
					  IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
						  IBV_QP_ACCESS_FLAGS));
	CHECK_FALSE(qp_transition_allowed(RESET, static_cast<enum ibv_qp_state>(7), RC,
					  IBV_QP_STATE));
	CHECK_FALSE(qp_state_is_valid(IBV_QPS_UNKNOWN));
	CHECK(qp_state_is_valid(IBV_QPS_SQE));
}

TEST_CASE("attributes an XRC QP type has no use for are dropped", "[qp][state]")
{
	CHECK(qp_ignored_attrs(XS) == (IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
	CHECK(qp_ignored_attrs(XR) ==
	      (IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY));
	for (enum ibv_qp_type t : {RC, UC, UD})
		CHECK(qp_ignored_attrs(t) == 0);
}
