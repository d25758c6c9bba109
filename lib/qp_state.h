/* SPDX-License-Identifier: MIT */
/*
 * The QP state machine of the InfiniBand specification (chapter 11, "Modify
 * QP") as Linux's ib_core enforces it for every driver: for each transition
 * and QP type, the attributes ibv_modify_qp() must name (required) and may
 * name (optional). Pure logic, no object: lib/qp.cpp applies it, the unit
 * tests check it against a table of their own.
 */
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace shmverbs {

/* Every attribute bit ibv_modify_qp() knows, IBV_QP_STATE .. IBV_QP_DEST_QPN. */
constexpr uint32_t qp_attr_standard_bits = (1u << 21) - 1;

/* True when a transition is legal for the QP type with exactly these attribute
 * bits: every required attribute present, nothing beyond required + optional
 * (+ IBV_QP_STATE), and IBV_QP_CUR_STATE only from RTR, RTS, SQD or SQE.
 * `mask` without IBV_QP_STATE means cur -> cur (next must equal cur). Types
 * other than RC, UC, UD, XRC_SEND and XRC_RECV are never accepted. */
bool qp_transition_allowed(enum ibv_qp_state cur, enum ibv_qp_state next,
			   enum ibv_qp_type type, uint32_t mask);

/* Attributes the kernel drops from the mask before checking it, because the
 * QP type has no use for them (an XRC initiator has no responder resources,
 * an XRC target sends nothing): naming them is accepted and has no effect. */
uint32_t qp_ignored_attrs(enum ibv_qp_type type);

/* The states the specification defines (RESET .. ERR). */
bool qp_state_is_valid(int state);

const char *qp_state_name(enum ibv_qp_state state);

} // namespace shmverbs
