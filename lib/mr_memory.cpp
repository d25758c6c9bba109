/* SPDX-License-Identifier: MIT */
#include "mr_memory.h"

#include "bounce.h"
#include "cma.h"
#include "fork.h"
#include "log.h"
#include "memshare.h"
#include "segment.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>

namespace shmverbs {

namespace {

/* Live Bounce registrations: start -> (end, access), several per start. */
struct BounceRanges {
	std::shared_mutex lock;
	std::multimap<uint64_t, std::pair<uint64_t, uint32_t>> ranges;
};

BounceRanges *&bounce_ranges_ptr()
{
	static BounceRanges *r = new BounceRanges; /* never freed: the helper may run at exit */
	return r;
}
BounceRanges &bounce_ranges() { return *bounce_ranges_ptr(); }

memshare::BounceServer::Access validate_bounce(void *, uint64_t addr, uint64_t len, bool write)
{
	using Access = memshare::BounceServer::Access;
	bool odp = false;
	if (!bounce_range_allowed(addr, len, write, &odp))
		return Access::refused;
	return odp ? Access::by_kernel : Access::allowed;
}

/* The process's bounce server, made on the first Bounce MR and kept for the
 * life of the process (peers may hold its fd). */
std::mutex bounce_server_lock;
memshare::BounceServer *bounce_server = nullptr;

int ensure_bounce_server()
{
	std::lock_guard guard(bounce_server_lock);
	if (bounce_server)
		return 0;
	auto server = memshare::BounceServer::create(16, 64 * 1024, validate_bounce, nullptr);
	if (!server)
		return server.error();
	/* Result<T> hands over an owned pointer: ours for the life of the process. */
	memshare::BounceServer *s = server.get();
	if (int err = Segment::attach_process_fd(kBounceSlot, s->fd())) {
		log_error("cannot publish the bounce file: %s", std::strerror(err));
		delete s;
		return err;
	}
	bounce_server = s;
	return 0;
}

std::mutex memory_file_lock;
bool memory_file_published = false;
int memory_file_error = 0;

int publish_memory_file()
{
	std::lock_guard guard(memory_file_lock);
	if (!memory_file_published) {
		memory_file_published = true;
		int fd = memshare::memory_file_fd();
		memory_file_error = fd < 0 ? errno : Segment::attach_process_fd(kMemoryFileSlot, fd);
		if (memory_file_error)
			log_error("cannot publish the memory file: %s",
				  std::strerror(memory_file_error));
	}
	return memory_file_error;
}

} // namespace

/* The parent's bounce server thread is not in the child, and its memory
 * file is the parent's: both are made again on first use (lib/fork.h). */
void fork_child::mr_memory()
{
	new (&bounce_server_lock) std::mutex;
	bounce_server = nullptr;
	new (&memory_file_lock) std::mutex;
	memory_file_published = false;
	memory_file_error = 0;
	bounce_ranges_ptr() = new BounceRanges;
}

namespace {

/* A page switch makes a new mapping, which loses MADV_DONTFORK: advise again
 * the pages that ibv_dontfork_range() protects (only after ibv_fork_init). */
void readvise_dontfork(uint64_t addr, uint64_t length)
{
	ForkRanges &fr = process_fork_ranges();
	if (!fr.initialized())
		return;
	const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
	uint64_t s = addr & ~(page - 1), e = (addr + (length ? length : 1) + page - 1) & ~(page - 1);
	uint64_t run = 0;
	for (uint64_t p = s; p <= e; p += page) {
		bool covered = p < e && fr.count_at(p) > 0;
		if (covered && !run)
			run = p;
		if (!covered && run) {
			madvise(reinterpret_cast<void *>(run), p - run, MADV_DONTFORK);
			run = 0;
		}
	}
}

/* Access bits with which a peer can reach the range at all. */
constexpr uint32_t reachable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			       IBV_ACCESS_MW_BIND;

MemPath fallback_path()
{
	memshare::Policy p = memshare::policy();
	bool cma = (p == memshare::Policy::automatic || p == memshare::Policy::cma) &&
		   memshare::cma_available();
	return cma ? MemPath::Cma : MemPath::Bounce;
}

MemPath attach_bounce(uint64_t addr, uint64_t length, uint32_t access)
{
	if (ensure_bounce_server() != 0)
		return MemPath::Cma; /* the last resort; CMA may still work */
	BounceRanges &r = bounce_ranges();
	std::unique_lock guard(r.lock);
	r.ranges.emplace(addr, std::make_pair(addr + length, access));
	return MemPath::Bounce;
}

} // namespace

MemPath mr_memory_attach(uint64_t addr, uint64_t length, uint32_t access)
{
	if (!(access & reachable))
		return MemPath::Cma; /* no peer ever touches it: nothing to set up */
	MemPath path;
	if (is_odp(access)) {
		/* Never switched to the memory file: reached by address at
		 * the time of each access (lib/mr.h, on-demand paging). */
		path = fallback_path();
		return path == MemPath::Bounce ? attach_bounce(addr, length, access) : path;
	}
	switch (memshare::share(reinterpret_cast<void *>(addr), size_t(length))) {
	case memshare::Path::shared:
		if (publish_memory_file() != 0) {
			memshare::unshare(reinterpret_cast<void *>(addr), size_t(length));
			path = fallback_path();
		} else {
			path = MemPath::Shared;
		}
		readvise_dontfork(addr, length);
		break;
	case memshare::Path::cma:
		path = MemPath::Cma;
		break;
	default:
		path = MemPath::Bounce;
		break;
	}
	if (path == MemPath::Bounce)
		path = attach_bounce(addr, length, access);
	log_debug("MR [%#llx, +%llu) reached by %s", (unsigned long long)addr,
		  (unsigned long long)length,
		  path == MemPath::Shared ? "shared" : path == MemPath::Cma ? "cma" : "bounce");
	return path;
}

void mr_memory_detach(uint64_t addr, uint64_t length, uint32_t access, MemPath path)
{
	if (!(access & reachable))
		return;
	if (path == MemPath::Shared) {
		memshare::unshare(reinterpret_cast<void *>(addr), size_t(length));
		readvise_dontfork(addr, length);
	} else if (path == MemPath::Bounce) {
		BounceRanges &r = bounce_ranges();
		std::unique_lock guard(r.lock);
		auto [lo, hi] = r.ranges.equal_range(addr);
		for (auto it = lo; it != hi; ++it) {
			if (it->second.first == addr + length && it->second.second == access) {
				r.ranges.erase(it);
				break;
			}
		}
	}
}

bool bounce_range_allowed(uint64_t addr, uint64_t len, bool write, bool *odp)
{
	if (addr + len < addr)
		return false;
	const uint32_t need = write ? IBV_ACCESS_LOCAL_WRITE : IBV_ACCESS_REMOTE_READ;
	BounceRanges &r = bounce_ranges();
	std::shared_lock guard(r.lock);
	for (auto it = r.ranges.upper_bound(addr); it != r.ranges.begin();) {
		--it;
		if (addr + len <= it->second.first && (it->second.second & need) == need) {
			if (odp)
				*odp = is_odp(it->second.second);
			return true;
		}
	}
	return false;
}

} // namespace shmverbs
