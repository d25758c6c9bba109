/* SPDX-License-Identifier: MIT */
/*
 * The ibv_qp_ex posting API (ibv_wr_start() & co.) of QPs created with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.
 */
#pragma once

#include <infiniband/verbs.h>

namespace shmverbs {

/* Fills the wr_* entry points of a new QP: the builders and setters of its
 * QP type, whatever send_ops_flags asked for (libmlx5 installs every one the
 * type supports; send_ops_flags only had to be a subset of them). */
void install_qp_ex_ops(struct ibv_qp_ex &q);

} // namespace shmverbs
