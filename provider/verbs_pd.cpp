/* SPDX-License-Identifier: MIT */
/*
 * Protection domains, memory regions, memory windows, thread domains and
 * parent domains.
 */
#include "abi.h"
#include "ops.h"

#include "pd.h"

using namespace shmverbs;
using namespace shmverbs::abi;

namespace shmverbs::abi {

void install_pd_ops(struct verbs_context &)
{
}

} // namespace shmverbs::abi

SHMV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	if (!context)
		return fail_ptr<struct ibv_pd>(EINVAL);
	Context *c = to_context(context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_alloc_pd, "IBVERBS_1.1", context);
	return guard_ptr([&] { return to_ptr(alloc_pd(*c)); });
}

SHMV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	if (!to_context(pd->context))
		SHMV_FORWARD_INT(ibv_dealloc_pd, "IBVERBS_1.1", pd);
	return dealloc_pd(*Pd::from(pd));
}
