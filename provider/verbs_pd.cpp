/* SPDX-License-Identifier: MIT */
/*
 * Protection domains, memory regions, memory windows, thread domains and
 * parent domains.
 *
 * Which entry point an application reaches: verbs.h turns ibv_reg_mr() and
 * ibv_reg_mr_iova() into inline wrappers that call the exported
 * ibv_reg_mr / ibv_reg_mr_iova when the access flags are a compile-time
 * constant without IBV_ACCESS_OPTIONAL_RANGE bits, and ibv_reg_mr_iova2
 * otherwise. All three end in the same registration. libibverbs strips the
 * optional bits only on kernels that cannot take them; we behave as a kernel
 * that can (Linux >= 5.9), which accepts and ignores the ones it does not
 * implement.
 *
 * ibv_advise_mr works on ODP MRs where the device offers ODP (lib/mr.h),
 * else EOPNOTSUPP, as mlx5 without ODP.
 *
 * Device memory (ibv_alloc_dm, ibv_reg_dm_mr): lib/dm.h.
 *
 * Memory windows (lib/mw.h): verbs.h's inline ibv_alloc_mw, ibv_bind_mw
 * and ibv_dealloc_mw call the context's ops, set here; under a profile
 * without windows (rxe) alloc_mw is EOPNOTSUPP, as libibverbs answers for
 * a provider without the op.
 *
 * Not offered: ibv_reg_dmabuf_mr (EOPNOTSUPP: there is no device memory to
 * import from).
 */
#include "abi.h"
#include "abi_enum.h"
#include "ops.h"

#include "dm.h"
#include "fork.h"
#include "mr.h"
#include "mw.h"
#include "pd.h"

/* verbs.h wraps these in inline helpers; we define the real entry points. */
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace shmverbs;
using namespace shmverbs::abi;

namespace {

struct ibv_mr *ctx_alloc_null_mr(struct ibv_pd *pd)
{
	Context *c = pd ? to_context(pd->context) : nullptr;
	if (!c)
		return fail_ptr<struct ibv_mr>(EINVAL);
	return guard_ptr([&]() -> struct ibv_mr * {
		Result<Mr> mr = alloc_null_mr(*c, *Pd::from(pd));
		if (mr)
			mr->ibv.pd = pd;
		return to_ptr(mr);
	});
}

/* ---- Memory windows (lib/mw.h) ---- */

struct ibv_mw *ctx_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	Context *c = pd ? to_context(pd->context) : nullptr;
	if (!c)
		return fail_ptr<struct ibv_mw>(EINVAL);
	return guard_ptr([&]() -> struct ibv_mw * {
		Result<Mw> mw = alloc_mw(*c, *Pd::from(pd), type);
		if (mw)
			mw->ibv.pd = pd;
		return to_ptr(mw);
	});
}

int ctx_dealloc_mw(struct ibv_mw *mw)
{
	if (!mw || !to_context(mw->context))
		return EINVAL;
	return guard_int([&] { return dealloc_mw(*Mw::from(mw)); });
}

/* ibv_bind_mw() of a type 1 window, after verbs.h's checks: libmlx5's own
 * (a zero-based window or MR EINVAL, a null MR ENOTSUP), then a BIND_MW WR
 * posted on the QP with the key's next variant, which the window takes
 * once the post succeeded (the bind itself completes on the CQ). */
int ctx_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	if (!qp || !mw || !mw_bind || qp->context != mw->context)
		return EINVAL;
	const struct ibv_mw_bind_info &info = mw_bind->bind_info;
	if (info.mw_access_flags & IBV_ACCESS_ZERO_BASED)
		return EINVAL;
	if (info.mr) {
		const Mr &mr = *Mr::from(info.mr);
		if (mr.type == MrType::Null)
			return ENOTSUP;
		if (mr.type == MrType::Dm) /* zero-based */
			return EINVAL;
	}
	struct ibv_send_wr wr{}, *bad = nullptr;
	wr.opcode = IBV_WR_BIND_MW;
	wr.wr_id = mw_bind->wr_id;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = info;
	if (int err = qp->context->ops.post_send(qp, &wr, &bad))
		return err;
	mw->rkey = wr.bind_mw.rkey;
	return 0;
}

struct ibv_td *ctx_alloc_td(struct ibv_context *context, struct ibv_td_init_attr *init_attr)
{
	Context *c = to_context(context);
	if (!c || !init_attr)
		return fail_ptr<struct ibv_td>(EINVAL);
	return guard_ptr([&] { return to_ptr(alloc_td(*c, *init_attr)); });
}

/* ---- Device memory (lib/dm.h) ---- */

int dm_memcpy_to(struct ibv_dm *dm, uint64_t offset, const void *from, size_t length)
{
	return guard_int([&] { return dm_copy_to(*Dm::from(dm), offset, from, length); });
}

int dm_memcpy_from(void *to, struct ibv_dm *dm, uint64_t offset, size_t length)
{
	return guard_int([&] { return dm_copy_from(to, *Dm::from(dm), offset, length); });
}

struct ibv_dm *ctx_alloc_dm(struct ibv_context *context, struct ibv_alloc_dm_attr *attr)
{
	Context *c = to_context(context);
	if (!c || !attr)
		return fail_ptr<struct ibv_dm>(EINVAL);
	return guard_ptr([&]() -> struct ibv_dm * {
		Result<Dm> dm = alloc_dm(*c, *attr);
		if (dm) {
			dm->ibv.memcpy_to_dm = dm_memcpy_to;
			dm->ibv.memcpy_from_dm = dm_memcpy_from;
		}
		return to_ptr(dm);
	});
}

/* The errno too, as libibverbs' execute_ioctl() sets it to what the
 * command returns (ibv_free_dm, ibv_advise_mr: perror() after a failure). */
int with_errno(int err)
{
	if (err)
		errno = err;
	return err;
}

int ctx_free_dm(struct ibv_dm *dm)
{
	if (!dm || !to_context(dm->context))
		return with_errno(EINVAL);
	return with_errno(guard_int([&] { return free_dm(*Dm::from(dm)); }));
}

struct ibv_mr *ctx_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t offset, size_t length,
			     unsigned int access)
{
	Context *c = pd ? to_context(pd->context) : nullptr;
	if (!c || !dm || dm->context != pd->context)
		return fail_ptr<struct ibv_mr>(EINVAL);
	return guard_ptr([&]() -> struct ibv_mr * {
		Result<Mr> mr = reg_dm_mr(*c, *Pd::from(pd), *Dm::from(dm), offset, length, access);
		if (!mr)
			return fail_ptr<struct ibv_mr>(mr.error());
		mr->ibv.pd = pd;
		mr->ibv.addr = nullptr; /* zero-based: libibverbs leaves it NULL */
		mr->ibv.length = length;
		return mr->abi();
	});
}

int ctx_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		  struct ibv_sge *sg_list, uint32_t num_sge)
{
	Context *c = pd ? to_context(pd->context) : nullptr;
	if (!c)
		return with_errno(EINVAL);
	return with_errno(guard_int(
		[&] { return advise_mr(*c, *Pd::from(pd), advice, flags, sg_list, num_sge); }));
}

int ctx_dealloc_td(struct ibv_td *td)
{
	if (!td || !to_context(td->context))
		return EINVAL;
	return guard_int([&] { return dealloc_td(*Td::from(td)); });
}

struct ibv_pd *ctx_alloc_parent_domain(struct ibv_context *context,
				       struct ibv_parent_domain_init_attr *attr)
{
	Context *c = to_context(context);
	if (!c || !attr || !attr->pd)
		return fail_ptr<struct ibv_pd>(EINVAL);
	/* The PD (and TD) must be objects of this context: a parent domain
	 * carries its PD's handle, which means nothing in another one. */
	if (attr->pd->context != context || (attr->td && attr->td->context != context))
		return fail_ptr<struct ibv_pd>(EINVAL);
	return guard_ptr([&] { return to_ptr(alloc_parent_domain(*c, *attr)); });
}

/* The common tail of ibv_reg_mr, ibv_reg_mr_iova and ibv_reg_mr_iova2 for
 * a PD of ours; fills the fields libibverbs fills after the provider. As
 * libibverbs, the range is marked DONTFORK first (a no-op unless
 * ibv_fork_init() or RDMAV_FORK_SAFE) and unmarked if registration fails. */
struct ibv_mr *register_mr(Context &c, struct ibv_pd *pd, void *addr, size_t length,
			   uint64_t iova, unsigned int access)
{
	const bool odp = access & IBV_ACCESS_ON_DEMAND;
	if (!odp && process_fork_ranges().dontfork(addr, length))
		return nullptr; /* errno from madvise */
	return guard_ptr([&]() -> struct ibv_mr * {
		Result<Mr> mr = reg_mr(c, *Pd::from(pd), addr, length, iova, access);
		if (!mr) {
			if (!odp)
				process_fork_ranges().dofork(addr, length);
			return fail_ptr<struct ibv_mr>(mr.error());
		}
		mr->ibv.pd = pd;
		mr->ibv.addr = addr;
		mr->ibv.length = length;
		return mr->abi();
	});
}

} // namespace

namespace shmverbs::abi {

void install_pd_ops(struct verbs_context &v)
{
	v.alloc_null_mr = ctx_alloc_null_mr;
	v.context.ops.alloc_mw = ctx_alloc_mw;
	v.context.ops.dealloc_mw = ctx_dealloc_mw;
	v.context.ops.bind_mw = ctx_bind_mw;
	v.advise_mr = ctx_advise_mr;
	v.alloc_dm = ctx_alloc_dm;
	v.free_dm = ctx_free_dm;
	v.reg_dm_mr = ctx_reg_dm_mr;
	v.alloc_td = ctx_alloc_td;
	v.dealloc_td = ctx_dealloc_td;
	v.alloc_parent_domain = ctx_alloc_parent_domain;
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

/* Deallocates a PD or a parent domain (both are ibv_pd to the application). */
SHMV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	if (!to_context(pd->context))
		SHMV_FORWARD_INT(ibv_dealloc_pd, "IBVERBS_1.1", pd);
	if (ParentDomain *pdom = ParentDomain::from(pd))
		return guard_int([&] { return dealloc_parent_domain(*pdom); });
	return guard_int([&] { return dealloc_pd(*Pd::from(pd)); });
}

SHMV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					    uint64_t iova, unsigned int access)
{
	if (!pd)
		return fail_ptr<struct ibv_mr>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_reg_mr_iova2, "IBVERBS_1.8", pd, addr, length, iova, access);
	return register_mr(*c, pd, addr, length, iova, access);
}

SHMV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	if (!pd)
		return fail_ptr<struct ibv_mr>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_reg_mr, "IBVERBS_1.1", pd, addr, length, access);
	return register_mr(*c, pd, addr, length, reinterpret_cast<uintptr_t>(addr),
			   static_cast<unsigned int>(access));
}

SHMV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					   uint64_t iova, int access)
{
	if (!pd)
		return fail_ptr<struct ibv_mr>(EINVAL);
	Context *c = to_context(pd->context);
	if (!c)
		SHMV_FORWARD_PTR(ibv_reg_mr_iova, "IBVERBS_1.7", pd, addr, length, iova, access);
	return register_mr(*c, pd, addr, length, iova, static_cast<unsigned int>(access));
}

SHMV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					     uint64_t iova, int fd, int access)
{
	if (!pd)
		return fail_ptr<struct ibv_mr>(EINVAL);
	if (!to_context(pd->context))
		SHMV_FORWARD_PTR(ibv_reg_dmabuf_mr, "IBVERBS_1.12", pd, offset, length, iova, fd,
				 access);
	return fail_ptr<struct ibv_mr>(EOPNOTSUPP);
}

/*
 * Returns 0 or one of IBV_REREG_MR_ERR_* with errno set, as libibverbs:
 * _INPUT for what libibverbs itself refuses (the MR is untouched), _CMD for
 * what the kernel refuses; the fork-protection results as libibverbs (they
 * only occur after ibv_fork_init(), when an madvise fails).
 */
SHMV_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
			     size_t length, int access)
{
	if (!mr) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	Context *c = to_context(mr->context);
	if (!c) {
		if (auto fp = SHMV_NEXT(ibv_rereg_mr, "IBVERBS_1.1"))
			return fp(mr, flags, pd, addr, length, access);
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	Mr *m = Mr::from(mr);
	/* libibverbs refuses a null MR (IBV_MR_TYPE_NULL_MR) itself; a DM
	 * MR is an IBV_MR_TYPE_MR to it (cmd_dm.c), which the kernel
	 * refuses (ib_uverbs_rereg_mr: mr->dm). */
	if (m->type == MrType::Null || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	/* The kernel looks the new PD up by handle in this context. */
	Pd *new_pd = nullptr;
	if ((flags & IBV_REREG_MR_CHANGE_PD) && pd && pd->context == mr->context)
		new_pd = Pd::from(pd);
	const bool new_range = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
	if (new_range && process_fork_ranges().dontfork(addr, length))
		return IBV_REREG_MR_ERR_DONT_FORK_NEW;
	void *old_addr = mr->addr;
	size_t old_length = mr->length;
	int err = guard_int([&] {
		return rereg_mr(*m, flags, new_pd, addr, length, static_cast<uint32_t>(access));
	});
	if (err) {
		if (new_range && process_fork_ranges().dofork(addr, length)) {
			errno = err;
			return IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW;
		}
		errno = err;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (new_range) {
		mr->addr = addr;
		mr->length = length;
		if (process_fork_ranges().dofork(old_addr, old_length))
			return IBV_REREG_MR_ERR_DO_FORK_OLD;
	}
	return 0;
}

SHMV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	if (!to_context(mr->context))
		SHMV_FORWARD_INT(ibv_dereg_mr, "IBVERBS_1.1", mr);
	/* As libibverbs: the range it knows (the ABI fields) goes back to
	 * normal fork behaviour once the registration is gone. */
	void *addr = mr->addr;
	size_t length = mr->length;
	const bool user = Mr::from(mr)->type == MrType::User;
	int err = guard_int([&] { return dereg_mr(*Mr::from(mr)); });
	if (!err && user)
		process_fork_ranges().dofork(addr, length);
	return err;
}
