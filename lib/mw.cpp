/* SPDX-License-Identifier: MIT */
#include "mw.h"

#include "context.h"
#include "device.h"
#include "fork.h"

#include <unistd.h>

#include <atomic>
#include <new>
#include <unordered_map>
#include <vector>

namespace shmverbs {

namespace {

/* The windows of this process by (device, slot index): LOCAL_INV names a
 * window by its key, and an MR's deregistration finds those bound to it.
 * Lock order: registry, then a window's lock. Never freed (used until
 * exit); a forked child starts an empty one, as it starts new key tables
 * (its inherited windows are of inherited contexts, refused with EIO). */
struct Registry {
	std::mutex lock;
	std::unordered_map<uint64_t, Mw *> windows;
};

Registry *&registry_ptr()
{
	static Registry *r = new Registry;
	return r;
}

Registry &registry() { return *registry_ptr(); }

uint64_t registry_key(uint32_t device, uint32_t index)
{
	return uint64_t(device) << 32 | index;
}

uint32_t device_of(const Mw &mw)
{
	return Context::from(mw.ibv.context)->device->index;
}

std::atomic<uint32_t> next_handle{1};

/* Withdraws the window's key and waits for its holds (mw.lock held; an
 * application's thread, never a send queue's). */
void drain(Mw &mw)
{
	mw.keys->unpublish(mw.index);
	mw.bound_mr = 0;
	mw.drain_wait = {};
}

/* The same for a send queue: false while holds remain (the key is
 * withdrawn all the same). */
bool try_drain(Mw &mw)
{
	if (!mw.keys->try_unpublish(mw.index, mw.drain_wait))
		return false;
	mw.bound_mr = 0;
	mw.drain_wait = {};
	return true;
}

constexpr uint32_t remote_access =
	IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

/* What the HCA checks of a bind with a range (bind_mw()'s list), against
 * the MR as it is registered now (`mr`, its held key's entry). */
bool bind_allowed(const MwBind &b, const KeyEntry &mr, uint32_t mw_pdn)
{
	if (b.mr_type != MrType::User || mr.kind != KeyKind::Mr || mr.pdn != mw_pdn ||
	    !(mr.access & IBV_ACCESS_MW_BIND))
		return false;
	if (b.addr < mr.iova || b.addr - mr.iova > mr.length ||
	    b.length > mr.length - (b.addr - mr.iova))
		return false;
	return !(b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) ||
	       (mr.access & IBV_ACCESS_LOCAL_WRITE);
}

} // namespace

void fork_child::windows() { registry_ptr() = new Registry; }

Result<Mw> alloc_mw(Context &ctx, Pd &pd, int type)
{
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)
		return Err{EINVAL};
	if (ctx.device->device_attr().max_mw == 0)
		return Err{EOPNOTSUPP};
	KeyTable &keys = KeyTable::of(*ctx.device);
	uint32_t index;
	if (int err = keys.reserve(index, true))
		return Err{err};
	auto *mw = new (std::nothrow) Mw{};
	if (!mw) {
		keys.release(index, true);
		return Err{ENOMEM};
	}
	mw->pd = &pd;
	mw->keys = &keys;
	mw->index = index;
	mw->ibv.context = ctx.abi();
	mw->ibv.type = static_cast<enum ibv_mw_type>(type);
	/* Not published: unbound, the key reaches nothing yet. */
	mw->ibv.rkey = make_key(index, uint8_t(keys.variant(index) + 1));
	mw->ibv.handle = next_handle.fetch_add(1, std::memory_order_relaxed);
	pd.uses.get();
	Registry &r = registry();
	std::lock_guard guard(r.lock);
	r.windows[registry_key(ctx.device->index, index)] = mw;
	return mw;
}

int dealloc_mw(Mw &mw)
{
	/* Drained before it leaves the registry, both under its lock: until
	 * then a deregistration of its MR finds it (unbind_windows_of()), and
	 * a send queue only tries the lock (its bind or LOCAL_INV waits). */
	Registry &r = registry();
	{
		std::lock_guard registry_guard(r.lock);
		std::lock_guard guard(mw.lock);
		drain(mw);
		r.windows.erase(registry_key(device_of(mw), mw.index));
	}
	mw.keys->release(mw.index, true);
	mw.pd->uses.put();
	delete &mw;
	return 0;
}

MwBind mw_bind_of(struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info &info)
{
	MwBind b;
	b.device = Context::from(mw->context)->device->index;
	b.mw_index = key_index(mw->rkey);
	b.mw_handle = mw->handle;
	b.addr = info.addr;
	b.length = info.length;
	b.access = info.mw_access_flags;
	b.rkey = rkey;
	if (info.mr) {
		const Mr &mr = *Mr::from(info.mr);
		b.mr_key = mr.type == MrType::Null ? null_mr_key : mr.ibv.lkey;
		b.mr_type = mr.type;
	}
	return b;
}

std::optional<enum ibv_wc_status> bind_mw(const MwBind &b, uint32_t qp_pdn, uint32_t qpn)
{
	Registry &r = registry();
	std::unique_lock registry_guard(r.lock, std::try_to_lock);
	if (!registry_guard)
		return std::nullopt;
	auto it = r.windows.find(registry_key(b.device, b.mw_index));
	if (it == r.windows.end() || it->second->ibv.handle != b.mw_handle)
		return IBV_WC_MW_BIND_ERR; /* deallocated since the post */
	Mw &mw = *it->second;
	std::unique_lock guard(mw.lock, std::try_to_lock);
	if (!guard)
		return std::nullopt;
	registry_guard.unlock();
	const uint32_t pdn = mw.pd->pdn;
	const bool type2 = mw.ibv.type == IBV_MW_TYPE_2;
	if (pdn != qp_pdn)
		return IBV_WC_MW_BIND_ERR;
	/* The MR as registered now, held while the window is published over
	 * it: a deregistration or an ibv_rereg_mr withdraws the key and waits
	 * for this hold, then finds the window bound (unbind_windows_of()).
	 * Gone, or of another key since the post: the bind fails. */
	KeyRef mr;
	if (b.length) {
		mr = b.mr_key ? mw.keys->acquire(b.mr_key) : KeyRef();
		if (!mr || !bind_allowed(b, *mr, pdn))
			return IBV_WC_MW_BIND_ERR;
	}
	/* A type 2 window is bound from the free state only. */
	if (type2 && b.length && mw.keys->live_key(mw.index))
		return IBV_WC_MW_BIND_ERR;
	if (!try_drain(mw))
		return std::nullopt;
	if (!b.length)
		return IBV_WC_SUCCESS; /* unbound: mlx5's free mkey */
	KeyEntry e{};
	e.kind = KeyKind::Mw;
	e.path = mr->path;
	/* Remote access only; an ODP MR's window is reached as the MR is. */
	e.access = (b.access & remote_access) | (mr->access & IBV_ACCESS_ON_DEMAND);
	e.pdn = pdn;
	e.parent_key = b.mr_key;
	e.owner_pid = static_cast<int32_t>(getpid());
	e.bound_qpn = type2 ? qpn : 0;
	e.iova = (b.access & IBV_ACCESS_ZERO_BASED) ? 0 : b.addr;
	e.length = b.length;
	e.addr = mr->addr + (b.addr - mr->iova);
	mw.key = mw.keys->publish(mw.index, e, key_variant(b.rkey));
	mw.bound_mr = key_index(b.mr_key);
	return IBV_WC_SUCCESS;
}

std::optional<enum ibv_wc_status> local_invalidate(const Device &dev, uint32_t rkey,
						   uint32_t qp_pdn)
{
	Registry &r = registry();
	std::unique_lock registry_guard(r.lock, std::try_to_lock);
	if (!registry_guard)
		return std::nullopt;
	auto it = r.windows.find(registry_key(dev.index, key_index(rkey)));
	if (it == r.windows.end())
		return IBV_WC_LOC_QP_OP_ERR; /* an MR's key (not invalidatable), or none */
	Mw &mw = *it->second;
	std::unique_lock guard(mw.lock, std::try_to_lock);
	if (!guard)
		return std::nullopt;
	registry_guard.unlock();
	/* Bound under that key: published, or withdrawn (by an earlier try
	 * of this WR that found holds, or a peer's SEND_WITH_INV) and not
	 * drained yet. */
	if (mw.ibv.type != IBV_MW_TYPE_2 || mw.pd->pdn != qp_pdn || !mw.bound_mr || mw.key != rkey)
		return IBV_WC_LOC_QP_OP_ERR;
	if (!try_drain(mw))
		return std::nullopt;
	return IBV_WC_SUCCESS;
}

void unbind_windows_of(const Mr &mr)
{
	Registry &r = registry();
	std::lock_guard registry_guard(r.lock);
	for (auto &[key, mw] : r.windows) {
		std::lock_guard guard(mw->lock);
		if (mw->keys == mr.keys && mw->bound_mr == mr.index)
			drain(*mw);
	}
}

} // namespace shmverbs
