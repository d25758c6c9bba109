/* SPDX-License-Identifier: MIT */
/*
 * Protection domains, thread domains and parent domains. Every object that
 * names a PD (MR, MW, QP, SRQ, and an AH where the kernel keeps one) holds a
 * use on it, so ibv_dealloc_pd() fails with EBUSY while any of them exists,
 * as the kernel's uverbs does.
 *
 * A parent domain (ibv_alloc_parent_domain) is an ibv_pd that wraps a PD and
 * optionally a thread domain, as in libmlx5: it carries its PD's handle, and
 * every object created on it belongs to that PD. Pd::from() therefore always
 * yields the protection domain proper; ParentDomain::from() tells the two
 * kinds apart where it matters (dealloc, CQs created with a parent domain).
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
	/* nullptr for a PD; in a parent domain, the PD it wraps. */
	Pd *wrapped;

	struct ibv_pd *abi() { return &ibv; }
	/* The protection domain an ibv_pd stands for: the PD itself, or the PD
	 * a parent domain wraps. Objects take their use on this one. */
	static Pd *from(struct ibv_pd *pd)
	{
		Pd *p = reinterpret_cast<Pd *>(pd);
		return p->wrapped ? p->wrapped : p;
	}
};

/* A thread domain: libmlx5 gives it a dedicated doorbell; here it is only an
 * object that parent domains reference. */
struct Td {
	struct ibv_td ibv; /* first: ibv_td* <-> Td* */
	UseCount uses;     /* parent domains naming this TD */

	struct ibv_td *abi() { return &ibv; }
	static Td *from(struct ibv_td *td) { return reinterpret_cast<Td *>(td); }
};

struct ParentDomain {
	/* first: its ibv is the ibv_pd handed out, with the wrapped PD's handle;
	 * pd.wrapped is never nullptr; pd.uses counts the CQs and QPs created
	 * with this parent domain (the objects that pin it in libmlx5). */
	Pd pd;
	Td *td; /* holds a use, or nullptr */
	/* IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS / _PD_CONTEXT, else nullptr. */
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		       uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
	void *pd_context;

	struct ibv_pd *abi() { return &pd.ibv; }
	/* The parent domain behind an ibv_pd, or nullptr for a plain PD. */
	static ParentDomain *from(struct ibv_pd *pd)
	{
		return reinterpret_cast<Pd *>(pd)->wrapped ? reinterpret_cast<ParentDomain *>(pd)
							   : nullptr;
	}
};

Result<Pd> alloc_pd(Context &ctx);
/* A plain PD: EBUSY while any object (or parent domain) uses it. */
int dealloc_pd(Pd &pd);

/* init_attr->comp_mask must be 0 (EINVAL otherwise), as in libmlx5. */
Result<Td> alloc_td(Context &ctx, const struct ibv_td_init_attr &init_attr);
/* EBUSY while a parent domain names it. */
int dealloc_td(Td &td);

/* attr.pd and attr.td must already be known to be ours; attr.pd may itself be a
 * parent domain, in which case the new one wraps the same PD. */
Result<ParentDomain> alloc_parent_domain(Context &ctx,
					 const struct ibv_parent_domain_init_attr &attr);
/* EBUSY while a CQ or QP created with it exists. */
int dealloc_parent_domain(ParentDomain &pdom);

} // namespace shmverbs
