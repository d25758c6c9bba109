/* SPDX-License-Identifier: MIT */
#include "fork.h"
#include "log.h"
#include "memshare.h"

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace shmverbs {

namespace {

struct Span {
	uintptr_t start, end;
};

size_t base_page_size()
{
	long ps = sysconf(_SC_PAGESIZE);
	return ps > 0 ? static_cast<size_t>(ps) : 4096;
}

/* KernelPageSize of the mapping holding addr, from /proc/self/smaps; the base
 * page size when it cannot be read. */
size_t smaps_page_size_of(const void *addr)
{
	size_t result = base_page_size();
	FILE *f = std::fopen("/proc/self/smaps", "re");
	if (!f)
		return result;
	auto want = reinterpret_cast<uintptr_t>(addr);
	char line[512];
	bool in_mapping = false;
	while (std::fgets(line, sizeof(line), f)) {
		uintptr_t lo, hi;
		if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 &&
		    std::strchr(line, ' ')) {
			/* A mapping header: "lo-hi perms offset dev inode path". */
			in_mapping = want >= lo && want < hi;
			continue;
		}
		unsigned long kb;
		if (in_mapping && std::sscanf(line, "KernelPageSize: %lu kB", &kb) == 1) {
			result = kb * 1024;
			break;
		}
	}
	std::fclose(f);
	return result;
}

} // namespace

namespace {

std::atomic<uint32_t> generation{0};

void on_fork_child()
{
	generation.fetch_add(1, std::memory_order_relaxed);
	fork_child::segments();
	fork_child::key_tables();
	fork_child::windows();
	fork_child::progress();
	fork_child::remote_memory();
	fork_child::mr_memory();
	fork_child::contexts();
	fork_child::copy_helper();
}

} // namespace

void install_fork_child_handler()
{
	static std::once_flag once;
	std::call_once(once, [] {
		/* After memshare's: until its child handler has run, registered
		 * pages (heap pages among them) are still the parent's. */
		memshare::install_fork_handlers();
		pthread_atfork(nullptr, nullptr, on_fork_child);
	});
}

uint32_t fork_generation() { return generation.load(std::memory_order_relaxed); }

bool env_flag(const char *name)
{
	const char *v = std::getenv(name);
	return v && std::strcmp(v, "0") != 0;
}

ForkRanges::ForkRanges(Advise advise, PageSizeOf page_size_of)
	: advise_(advise), page_size_of_(page_size_of)
{
}

int ForkRanges::init(bool huge_pages)
{
	std::lock_guard guard(lock_);
	if (huge_pages)
		huge_pages_ = true; /* like rdma-core, sticky even when already initialised */
	if (initialized_)
		return 0;
	if (too_late_)
		return EINVAL;

	page_size_ = base_page_size();
	/* Probe that the kernel knows both advices, on a page of our own. */
	void *probe = nullptr;
	if (posix_memalign(&probe, page_size_, page_size_))
		return ENOMEM;
	size_t probe_len = page_size_;
	void *probe_page = probe;
	if (huge_pages_) {
		probe_len = page_size_of_(probe);
		probe_page = reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(probe) &
						      ~(uintptr_t(probe_len) - 1));
	}
	bool ok = advise_(probe_page, probe_len, MADV_DONTFORK) == 0 &&
		  advise_(probe_page, probe_len, MADV_DOFORK) == 0;
	std::free(probe);
	if (!ok)
		return ENOSYS;
	initialized_ = true;
	return 0;
}

bool ForkRanges::initialized() const
{
	std::lock_guard guard(lock_);
	return initialized_;
}

void ForkRanges::page_bounds(void *base, size_t size, uintptr_t &start, uintptr_t &end) const
{
	size_t ps = huge_pages_ ? page_size_of_(base) : page_size_;
	auto b = reinterpret_cast<uintptr_t>(base);
	start = b & ~(uintptr_t(ps) - 1);
	/* Saturate instead of wrapping for a range that ends at the top. */
	uintptr_t last = b + size - 1 < b ? UINTPTR_MAX : b + size - 1;
	uintptr_t aligned_last = last | (uintptr_t(ps) - 1);
	end = aligned_last == UINTPTR_MAX ? UINTPTR_MAX : aligned_last + 1;
}

void ForkRanges::split_at(uintptr_t addr)
{
	auto it = segments_.upper_bound(addr);
	if (it == segments_.begin())
		return;
	--it;
	if (it->first < addr && addr < it->second.end) {
		segments_[addr] = Segment{it->second.end, it->second.count};
		it->second.end = addr;
	}
}

void ForkRanges::merge_around(uintptr_t start, uintptr_t end)
{
	auto it = segments_.lower_bound(start);
	if (it != segments_.begin())
		--it;
	while (it != segments_.end() && it->first <= end) {
		auto next = std::next(it);
		if (next != segments_.end() && it->second.end == next->first &&
		    it->second.count == next->second.count) {
			it->second.end = next->second.end;
			segments_.erase(next);
			continue;
		}
		it = next;
	}
}

void ForkRanges::add(uintptr_t start, uintptr_t end, int delta)
{
	split_at(start);
	split_at(end);
	uintptr_t pos = start;
	auto it = segments_.lower_bound(start);
	while (pos < end) {
		uintptr_t next_start = (it == segments_.end() || it->first >= end) ? end : it->first;
		if (pos < next_start) {
			/* A hole: uncovered pages. Only an increment covers them. */
			if (delta > 0)
				segments_[pos] = Segment{next_start, uint32_t(delta)};
			pos = next_start;
			continue;
		}
		/* it starts at pos and, after the splits, ends by end. */
		pos = it->second.end;
		if (delta < 0 && it->second.count <= uint32_t(-delta)) {
			it = segments_.erase(it);
		} else {
			it->second.count += delta;
			++it;
		}
	}
	merge_around(start, end);
}

int ForkRanges::dontfork(void *base, size_t size)
{
	std::lock_guard guard(lock_);
	if (!initialized_) {
		too_late_ = true;
		return 0;
	}
	if (!base || !size)
		return 0;
	uintptr_t start, end;
	page_bounds(base, size, start, end);

	/* Only pages no registration covers yet need the advice. */
	std::vector<Span> holes;
	uintptr_t pos = start;
	for (auto it = segments_.upper_bound(start); pos < end;) {
		if (it != segments_.begin() && std::prev(it)->second.end > pos) {
			pos = std::prev(it)->second.end;
			continue;
		}
		uintptr_t hole_end = (it == segments_.end() || it->first >= end) ? end : it->first;
		if (pos < hole_end)
			holes.push_back({pos, hole_end});
		if (it == segments_.end() || it->first >= end)
			break;
		pos = it->second.end;
		++it;
	}
	for (size_t i = 0; i < holes.size(); i++) {
		if (advise_(reinterpret_cast<void *>(holes[i].start), holes[i].end - holes[i].start,
			    MADV_DONTFORK) == 0)
			continue;
		/* Undo what this call advised, the failed span included: madvise
		 * applies to the mapped part of a range before it reports the
		 * unmapped rest. The counts are untouched. */
		int err = errno;
		for (size_t j = 0; j <= i; j++)
			advise_(reinterpret_cast<void *>(holes[j].start),
				holes[j].end - holes[j].start, MADV_DOFORK);
		errno = err;
		return -1;
	}
	add(start, end, +1);
	return 0;
}

int ForkRanges::dofork(void *base, size_t size)
{
	std::lock_guard guard(lock_);
	if (!initialized_) {
		too_late_ = true;
		return 0;
	}
	if (!base || !size)
		return 0;
	uintptr_t start, end;
	page_bounds(base, size, start, end);
	size_t ps = huge_pages_ ? page_size_of_(base) : page_size_;

	/* Pages whose last registration goes away get their fork back. A
	 * failure is not reported (as in rdma-core): the pages are retried one
	 * by one, and the counts drop regardless. */
	split_at(start);
	split_at(end);
	for (auto it = segments_.lower_bound(start); it != segments_.end() && it->first < end; ++it) {
		if (it->second.count != 1)
			continue;
		void *addr = reinterpret_cast<void *>(it->first);
		size_t len = it->second.end - it->first;
		if (advise_(addr, len, MADV_DOFORK) != 0 && len > ps)
			for (uintptr_t p = it->first; p < it->second.end; p += ps)
				advise_(reinterpret_cast<void *>(p), ps, MADV_DOFORK);
	}
	add(start, end, -1);
	return 0;
}

uint32_t ForkRanges::count_at(uintptr_t addr) const
{
	std::lock_guard guard(lock_);
	auto it = segments_.upper_bound(addr);
	if (it == segments_.begin())
		return 0;
	--it;
	return addr < it->second.end ? it->second.count : 0;
}

size_t ForkRanges::segments() const
{
	std::lock_guard guard(lock_);
	return segments_.size();
}

void ForkRanges::queue_created()
{
	std::lock_guard guard(lock_);
	if (!initialized_)
		too_late_ = true;
}

ForkRanges &process_fork_ranges()
{
	/* Never destroyed: MRs may be deregistered from other destructors. */
	static ForkRanges *ranges = new ForkRanges(::madvise, smaps_page_size_of);
	return *ranges;
}

void apply_fork_env()
{
	static std::once_flag once;
	std::call_once(once, [] {
		if (!env_flag("RDMAV_FORK_SAFE") && !env_flag("IBV_FORK_SAFE"))
			return;
		if (process_fork_ranges().init(std::getenv("RDMAV_HUGEPAGES_SAFE") != nullptr))
			log_error("fork()-safety requested but init failed");
	});
}

} // namespace shmverbs
