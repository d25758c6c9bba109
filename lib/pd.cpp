/* SPDX-License-Identifier: MIT */
#include "pd.h"

#include <new>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Pd> && offsetof(Pd, ibv) == 0);

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

} // namespace shmverbs
