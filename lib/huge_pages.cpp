/* SPDX-License-Identifier: MIT */
#include "huge_pages.h"

#include "context.h"
#include "pd.h"
#include "profile.h"

#include <sys/ipc.h>
#include <sys/shm.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

namespace shmverbs {

AllocType queue_alloc_type(const char *component, const char *legacy_key)
{
	AllocType type = AllocType::Anon;
	if (legacy_key) {
		const char *v = std::getenv(legacy_key);
		if (v && !std::strcmp(v, "y"))
			type = AllocType::Huge;
	}
	char name[64];
	std::snprintf(name, sizeof(name), "%s_ALLOC_TYPE", component);
	const char *v = std::getenv(name);
	if (!v)
		return type;
	/* libmlx5 compares without case and ignores an unknown value. */
	if (!strcasecmp(v, "HUGE"))
		return AllocType::Huge;
	if (!strcasecmp(v, "PREFER_HUGE") || !strcasecmp(v, "ALL"))
		return AllocType::PreferHuge;
	if (!strcasecmp(v, "ANON") || !strcasecmp(v, "CONTIG") || !strcasecmp(v, "PREFER_CONTIG"))
		return AllocType::Anon;
	return type;
}

HugeChunks::~HugeChunks()
{
	for (Region &r : regions_)
		shmdt(r.addr);
}

int HugeChunks::take(size_t bytes, Lease &out)
{
	out = {};
	const size_t n = (bytes + chunk_bytes - 1) / chunk_bytes;
	if (!n)
		return 0;
	std::lock_guard guard(lock_);
	/* First fit, in the regions the context already has. */
	for (Region &r : regions_) {
		for (size_t first = 0; first + n <= r.used.size(); first++) {
			auto begin = r.used.begin() + ptrdiff_t(first);
			auto taken = std::find(begin, begin + ptrdiff_t(n), true);
			if (taken != begin + ptrdiff_t(n)) {
				first = size_t(taken - r.used.begin());
				continue;
			}
			std::fill(begin, begin + ptrdiff_t(n), true);
			out = {r.addr, uint32_t(first), uint32_t(n)};
			return 0;
		}
	}
	/* A new region of whole huge pages. Removed at once: it lives as
	 * long as this attachment (and a fork child's copy of it). */
	const size_t len = (n * chunk_bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
	const int id = shmget(IPC_PRIVATE, len, SHM_HUGETLB | SHM_R | SHM_W);
	if (id < 0)
		return errno;
	void *addr = shmat(id, nullptr, 0);
	const int err = addr == reinterpret_cast<void *>(-1) ? errno : 0;
	shmctl(id, IPC_RMID, nullptr);
	if (err)
		return err;
	Region &r = regions_.emplace_back(Region{addr, std::vector<bool>(len / chunk_bytes)});
	std::fill(r.used.begin(), r.used.begin() + ptrdiff_t(n), true);
	out = {addr, 0, uint32_t(n)};
	return 0;
}

void HugeChunks::give_back(Lease &lease)
{
	if (!lease.region)
		return;
	std::lock_guard guard(lock_);
	auto r = std::find_if(regions_.begin(), regions_.end(),
			      [&](const Region &x) { return x.addr == lease.region; });
	if (r != regions_.end()) {
		std::fill(r->used.begin() + lease.first, r->used.begin() + lease.first + lease.count,
			  false);
		if (std::find(r->used.begin(), r->used.end(), true) == r->used.end()) {
			shmdt(r->addr);
			regions_.erase(r);
		}
	}
	lease = {};
}

int HugeChunks::take_for(AllocType type, size_t bytes, Lease &out)
{
	out = {};
	if (type == AllocType::Anon)
		return 0;
	const int err = take(bytes, out);
	return type == AllocType::Huge ? err : 0;
}

int take_queue_huge_pages(Context &ctx, const ParentDomain *parent, const char *component,
			  const char *legacy_key, size_t bytes, HugeChunks::Lease &out)
{
	out = {};
	if (ctx.device->profile != &Profile::get(ProfileKind::Mlx5))
		return 0;
	if (parent && parent->alloc && parent->free)
		return 0;
	return ctx.huge_chunks.take_for(queue_alloc_type(component, legacy_key), bytes, out);
}

} // namespace shmverbs
