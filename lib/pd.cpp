/* SPDX-License-Identifier: MIT */
#include "pd.h"

#include <new>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Pd> && offsetof(Pd, ibv) == 0);
static_assert(std::is_standard_layout_v<Td> && offsetof(Td, ibv) == 0);
static_assert(std::is_standard_layout_v<ParentDomain> && offsetof(ParentDomain, pd) == 0,
	      "a parent domain is handed out as an ibv_pd and told apart by pd.wrapped");

namespace {
std::atomic<uint32_t> next_pdn{1};
}

Result<Pd> alloc_pd(Context &ctx)
{
	auto *pd = new (std::nothrow) Pd{};
	if (!pd)
		return Err{ENOMEM};
	pd->ibv.context = ctx.abi();
	pd->pdn = next_pdn.fetch_add(1, std::memory_order_relaxed);
	pd->ibv.handle = pd->pdn;
	return pd;
}

int dealloc_pd(Pd &pd)
{
	if (pd.uses.busy())
		return EBUSY;
	delete &pd;
	return 0;
}

Result<Td> alloc_td(Context &ctx, const struct ibv_td_init_attr &init_attr)
{
	if (init_attr.comp_mask)
		return Err{EINVAL};
	auto *td = new (std::nothrow) Td{};
	if (!td)
		return Err{ENOMEM};
	td->ibv.context = ctx.abi();
	return td;
}

int dealloc_td(Td &td)
{
	if (td.uses.busy())
		return EBUSY;
	delete &td;
	return 0;
}

Result<ParentDomain> alloc_parent_domain(Context &ctx,
					 const struct ibv_parent_domain_init_attr &attr)
{
	constexpr uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
				   IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	if (!attr.pd || (attr.comp_mask & ~known))
		return Err{EINVAL};

	auto *pdom = new (std::nothrow) ParentDomain{};
	if (!pdom)
		return Err{ENOMEM};
	Pd *pd = Pd::from(attr.pd);
	pd->uses.get();
	pdom->pd.wrapped = pd;
	pdom->pd.pdn = pd->pdn;
	pdom->pd.ibv.context = ctx.abi();
	pdom->pd.ibv.handle = pd->ibv.handle;
	if (attr.td) {
		pdom->td = Td::from(attr.td);
		pdom->td->uses.get();
	}
	if (attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		pdom->alloc = attr.alloc;
		pdom->free = attr.free;
	}
	if (attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		pdom->pd_context = attr.pd_context;
	return pdom;
}

int dealloc_parent_domain(ParentDomain &pdom)
{
	if (pdom.pd.uses.busy())
		return EBUSY;
	pdom.pd.wrapped->uses.put();
	if (pdom.td)
		pdom.td->uses.put();
	delete &pdom;
	return 0;
}

} // namespace shmverbs
