/* SPDX-License-Identifier: MIT */
#include "dm.h"

#include "device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace shmverbs {

namespace {

/* mlx5_ib counts MEMIC in 4 KiB pages of a 64-byte-rounded length. */
constexpr uint64_t pool_page = 4096;
constexpr uint64_t memic_granule = 64;
/* The largest log_align_req taken: a page, what the mapping gives (mlx5_ib:
 * 6 + the device's log_max_memic_addr_alignment). */
constexpr uint32_t max_log_align = 12;

std::atomic<uint32_t> next_handle{1};

/* Pages of each device's pool in use, by device index. */
struct Pool {
	std::mutex lock;
	std::map<uint32_t, uint64_t> used;
};
Pool &pool()
{
	static Pool *p = new Pool; /* never freed: DMs may outlive static destruction */
	return *p;
}

uint64_t pool_pages(const Device &dev) { return dev.profile->max_dm_size() / pool_page; }

int check_range(const Dm &dm, uint64_t offset, size_t length)
{
	if (offset > dm.length || length > dm.length - offset)
		return EFAULT;
	if ((offset | length) & 3)
		return EINVAL;
	return 0;
}

} // namespace

Result<Dm> alloc_dm(Context &ctx, const struct ibv_alloc_dm_attr &attr)
{
	const Device &dev = *ctx.device;
	const uint64_t max = dev.profile->max_dm_size();
	if (!max)
		return Err{EOPNOTSUPP};
	if (attr.comp_mask)
		return Err{EINVAL};
	if (attr.length > max || attr.length == 0 || attr.log_align_req > max_log_align)
		return Err{EINVAL};
	const uint64_t rounded = (attr.length + memic_granule - 1) / memic_granule * memic_granule;
	const uint32_t pages = uint32_t((rounded + pool_page - 1) / pool_page);
	{
		std::lock_guard guard(pool().lock);
		uint64_t &used = pool().used[dev.index];
		if (used + pages > pool_pages(dev))
			return Err{ENOMEM};
		used += pages;
	}
	auto give_back = [&] {
		std::lock_guard guard(pool().lock);
		pool().used[dev.index] -= pages;
	};
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	const size_t mapped = (attr.length + page - 1) / page * page;
	void *mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		give_back();
		return Err{ENOMEM};
	}
	auto *dm = new (std::nothrow) Dm{};
	if (!dm) {
		munmap(mem, mapped);
		give_back();
		return Err{ENOMEM};
	}
	dm->ctx = &ctx;
	dm->mem = static_cast<char *>(mem);
	dm->mapped = mapped;
	dm->length = attr.length;
	dm->pages = pages;
	dm->ibv.context = ctx.abi();
	dm->ibv.comp_mask = IBV_DM_MASK_HANDLE;
	dm->ibv.handle = next_handle.fetch_add(1, std::memory_order_relaxed);
	return dm;
}

int free_dm(Dm &dm)
{
	if (dm.uses.busy())
		return EBUSY;
	munmap(dm.mem, dm.mapped);
	{
		std::lock_guard guard(pool().lock);
		pool().used[dm.ctx->device->index] -= dm.pages;
	}
	delete &dm;
	return 0;
}

int dm_copy_to(Dm &dm, uint64_t offset, const void *from, size_t length)
{
	if (int err = check_range(dm, offset, length))
		return err;
	if (length)
		std::memcpy(dm.mem + offset, from, length);
	return 0;
}

int dm_copy_from(void *to, Dm &dm, uint64_t offset, size_t length)
{
	if (int err = check_range(dm, offset, length))
		return err;
	if (length)
		std::memcpy(to, dm.mem + offset, length);
	return 0;
}

} // namespace shmverbs
