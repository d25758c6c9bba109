/* SPDX-License-Identifier: MIT */
/*
 * Shared by the CQ, SRQ and XRCD tests: an opened emulated device, and the
 * engine hooks that stand in for the data path until it exists.
 */
#pragma once

#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <poll.h>

#include <cstdint>

extern "C" {
/* Delivers a work completion to one of our CQs as the data path will. */
int shmverbs_inject_completion(struct ibv_cq *cq, const struct ibv_wc *wc, int solicited);
/* Tells an SRQ how many receive WQEs remain posted (SRQ limit events). */
int shmverbs_inject_srq_posted(struct ibv_srq *srq, uint32_t posted);
}

namespace cqsrq_test {

using Device = shmv_test::OpenDevice;

inline struct ibv_wc make_wc(uint64_t wr_id, enum ibv_wc_status status = IBV_WC_SUCCESS)
{
	struct ibv_wc wc{};
	wc.wr_id = wr_id;
	wc.status = status;
	wc.opcode = IBV_WC_RECV;
	wc.byte_len = 64;
	wc.qp_num = 0x1234;
	return wc;
}

/* Whether fd becomes readable within timeout_ms. */
inline bool readable(int fd, int timeout_ms)
{
	struct pollfd p = {fd, POLLIN, 0};
	return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

} // namespace cqsrq_test
