/* SPDX-License-Identifier: MIT */
/*
 * Address handles: ibv_create_ah, ibv_destroy_ah, ibv_init_ah_from_wc,
 * ibv_create_ah_from_wc. All four are exported functions in rdma-core 44
 * (none goes through the context's ops), so there is no ops overlay here.
 */
#include "abi.h"

#include "ah.h"
#include "pd.h"

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

struct ibv_ah *create_ah_on(Context &c, struct ibv_pd *pd, const struct ibv_ah_attr &attr)
{
	return guard_ptr([&]() -> struct ibv_ah * {
		Result<Ah> ah = create_ah(c, *Pd::from(pd), attr);
		if (ah)
			ah->ibv.pd = pd;
		return to_ptr(ah);
	});
}

} // namespace

SHMV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	if (!pd || !attr)
		return fail_ptr<struct ibv_ah>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_ah, "IBVERBS_1.1", pd, attr);
	return create_ah_on(*c, pd, *attr);
}

SHMV_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	if (!ah)
		return EINVAL;
	if (!to_context(ah->context))
		SHMV_FORWARD_INT(ibv_destroy_ah, "IBVERBS_1.1", ah);
	return guard_int([&] { return destroy_ah(*Ah::from(ah)); });
}

/* Returns 0, or -1 with errno set (libibverbs' convention for this verb). */
SHMV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
				    struct ibv_wc *wc, struct ibv_grh *grh,
				    struct ibv_ah_attr *ah_attr)
{
	if (!context || !wc || !ah_attr) {
		errno = EINVAL;
		return -1;
	}
	Context *c = to_context(context);
	if (!c) {
		if (auto fp = SHMV_NEXT(ibv_init_ah_from_wc, "IBVERBS_1.1"))
			return fp(context, port_num, wc, grh, ah_attr);
		errno = EINVAL;
		return -1;
	}
	int err = guard_int([&] { return init_ah_from_wc(*c, port_num, *wc, grh, *ah_attr); });
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

SHMV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
						 struct ibv_grh *grh, uint8_t port_num)
{
	if (!pd || !wc)
		return fail_ptr<struct ibv_ah>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_create_ah_from_wc, "IBVERBS_1.1", pd, wc, grh, port_num);
	struct ibv_ah_attr attr;
	int err = guard_int([&] { return init_ah_from_wc(*c, port_num, *wc, grh, attr); });
	if (err)
		return fail_ptr<struct ibv_ah>(err);
	return create_ah_on(*c, pd, attr);
}
