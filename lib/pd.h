/* SPDX-License-Identifier: MIT */
/*
 * Protection domains. Every object that names a PD (MR, MW, QP, SRQ, AH)
 * holds a use on it, so ibv_dealloc_pd() fails with EBUSY while any of them
 * exists, as the kernel's uverbs does.
 */
#pragma once

#include "context.h"

#include <infiniband/verbs.h>

#include <atomic>

namespace shmverbs {

/* Objects that others may depend on count their users; destroying one that is
 * still in use fails with EBUSY. */
struct UseCount {
	std::atomic<uint32_t> users{0};

	void get() { users.fetch_add(1, std::memory_order_relaxed); }
	void put() { users.fetch_sub(1, std::memory_order_release); }
	bool busy() const { return users.load(std::memory_order_acquire) != 0; }
};

struct Pd {
	struct ibv_pd ibv; /* first: ibv_pd* <-> Pd* */
	UseCount uses;
	uint32_t pdn;

	struct ibv_pd *abi() { return &ibv; }
	static Pd *from(struct ibv_pd *pd) { return reinterpret_cast<Pd *>(pd); }
};

Result<Pd> alloc_pd(Context &ctx);
int dealloc_pd(Pd &pd);

} // namespace shmverbs
