/* SPDX-License-Identifier: MIT */
#include "remote_memory.h"

#include "fork.h"

#include "bounce.h"
#include "cma.h"
#include "copy.h"
#include "memshare.h"
#include "mr_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace shmverbs {

namespace {

/*
 * The OFD lock that serialises atomics on Cma memory, across processes. OFD
 * locks of one open file description do not exclude each other, so threads
 * of this process are serialised by a striped mutex first.
 */
class AtomicLock {
public:
	AtomicLock(const PeerSegment &peer, uint64_t addr) : fd_(peer.lock_fd), addr_(addr)
	{
		mutex_ = &stripes()[(addr >> 3) % stripes().size()];
		mutex_->lock();
		struct flock fl{};
		fl.l_type = F_WRLCK;
		fl.l_whence = SEEK_SET;
		/* Byte ranges name target addresses: the 8 bytes of the
		 * word (off_t holds any user-space address). */
		fl.l_start = off_t(addr_ & uint64_t(INT64_MAX));
		fl.l_len = 8;
		locked_ = fd_ >= 0 && fcntl(fd_, F_OFD_SETLKW, &fl) == 0;
	}
	~AtomicLock()
	{
		if (locked_) {
			struct flock fl{};
			fl.l_type = F_UNLCK;
			fl.l_whence = SEEK_SET;
			fl.l_start = off_t(addr_ & uint64_t(INT64_MAX));
			fl.l_len = 8;
			fcntl(fd_, F_OFD_SETLK, &fl);
		}
		mutex_->unlock();
	}

private:
	static std::array<std::mutex, 64> &stripes()
	{
		static std::array<std::mutex, 64> s;
		return s;
	}
	int fd_;
	uint64_t addr_;
	bool locked_ = false;
	std::mutex *mutex_;
};

uint64_t apply(AtomicOp op, uint64_t old, uint64_t a, uint64_t b)
{
	if (op == AtomicOp::FetchAdd)
		return old + a;
	return old == a ? b : old;
}

/* The atomic as one CPU instruction on a word of our own memory; the old
 * value. */
uint64_t cpu_atomic(uint64_t addr, AtomicOp op, uint64_t a, uint64_t b)
{
	std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t *>(addr));
	if (op == AtomicOp::FetchAdd)
		return word.fetch_add(a);
	uint64_t expected = a;
	word.compare_exchange_strong(expected, b);
	return expected;
}

/* This process's own memory. */
class DirectMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		  int count) override
	{
		gather(reinterpret_cast<char *>(addr), local, count);
		return 0;
	}
	int read(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		 int count) override
	{
		scatter(local, count, reinterpret_cast<const char *>(addr));
		return 0;
	}
	int atomic(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		if (mr.path == MemPath::Cma) {
			/* Remote initiators take the lock on this memory: so
			 * must we, or we would not be atomic against them. */
			std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t *>(addr));
			AtomicLock guard(peer, addr);
			*old = word.load();
			word.store(apply(op, *old, a, b));
			return 0;
		}
		*old = cpu_atomic(addr, op, a, b);
		return 0;
	}
};

/* This process's own ODP memory (lib/mr.h): its pages may be absent, so
 * every copy is made by the kernel and a hole is EFAULT. Atomics follow the
 * MR's path as DirectMemory's do: under the OFD lock for Cma memory, CPU
 * atomics (after faulting the page in writable) for Bounce memory, whose
 * helper uses CPU atomics. */
class OwnOdpMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		  int count) override
	{
		for (int i = 0; i < count; i++) {
			if (memshare::copy_checked(reinterpret_cast<void *>(addr), local[i].iov_base,
						   local[i].iov_len))
				return EFAULT;
			addr += local[i].iov_len;
		}
		return 0;
	}
	int read(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		 int count) override
	{
		for (int i = 0; i < count; i++) {
			if (memshare::copy_checked(local[i].iov_base, reinterpret_cast<void *>(addr),
						   local[i].iov_len))
				return EFAULT;
			addr += local[i].iov_len;
		}
		return 0;
	}
	int atomic(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		auto *word = reinterpret_cast<uint64_t *>(addr);
		if (mr.path == MemPath::Cma) {
			AtomicLock guard(peer, addr);
			if (memshare::copy_checked(old, word, 8))
				return EFAULT;
			const uint64_t value = apply(op, *old, a, b);
			return memshare::copy_checked(word, &value, 8) ? EFAULT : 0;
		}
		if (memshare::fault_in_word(addr))
			return EFAULT;
		*old = cpu_atomic(addr, op, a, b);
		return 0;
	}
};

/* Another process's memory through Cross Memory Attach. */
class CmaMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &peer, const KeyEntry &, uint64_t addr,
		  const struct iovec *local, int count) override
	{
		return transfer(peer, addr, local, count, true);
	}
	int read(const PeerSegment &peer, const KeyEntry &, uint64_t addr,
		 const struct iovec *local, int count) override
	{
		return transfer(peer, addr, local, count, false);
	}
	int atomic(const PeerSegment &peer, const KeyEntry &, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		AtomicLock guard(peer, addr);
		struct iovec v = {old, 8};
		if (int err = transfer(peer, addr, &v, 1, false))
			return err;
		uint64_t value = apply(op, *old, a, b);
		struct iovec w = {&value, 8};
		return transfer(peer, addr, &w, 1, true);
	}

private:
	static int transfer(const PeerSegment &peer, uint64_t addr, const struct iovec *local,
			    int count, bool to_peer)
	{
		const size_t total = iov_bytes(local, count);
		size_t done = 0;
		while (done < total) {
			/* Skip what was done in the local iovecs. */
			struct iovec l[64];
			int n = 0;
			size_t skip = done;
			for (int i = 0; i < count && n < 64; i++) {
				if (skip >= local[i].iov_len) {
					skip -= local[i].iov_len;
					continue;
				}
				l[n].iov_base = static_cast<char *>(local[i].iov_base) + skip;
				l[n].iov_len = local[i].iov_len - skip;
				skip = 0;
				n++;
			}
			struct iovec r = {reinterpret_cast<void *>(addr + done), total - done};
			ssize_t got = to_peer ? process_vm_writev(peer.pid, l, n, &r, 1, 0)
					      : process_vm_readv(peer.pid, l, n, &r, 1, 0);
			if (got < 0)
				return errno == ESRCH ? ESRCH : EFAULT;
			if (got == 0)
				return EFAULT;
			done += size_t(got);
		}
		return 0;
	}
};

/*
 * What an initiator keeps about one peer process (one (pid, segment)): its
 * memory file and the windows onto it, its bounce client. Operations hold a
 * shared_ptr, so forget_peer_memory() never pulls a mapping from under them.
 */
struct PeerFiles {
	struct Window {
		uint64_t lo, hi; /* target addresses covered */
		memshare::PeerWindow map;
	};
	static constexpr size_t max_windows = 64;

	std::mutex lock;
	int mem_fd = -1;
	std::vector<std::shared_ptr<Window>> windows; /* most recently used first */
	std::shared_ptr<memshare::BounceClient> bounce;

	~PeerFiles()
	{
		windows.clear();
		if (mem_fd >= 0) {
			memshare::forget_peer(mem_fd);
			::close(mem_fd);
		}
	}
};

/* Never destroyed: the progress and broker threads may use it during exit. */
struct PeerTable {
	std::mutex lock;
	std::map<std::pair<pid_t, uint64_t>, std::shared_ptr<PeerFiles>> files;
};
PeerTable *&peer_table_ptr()
{
	static PeerTable *t = new PeerTable;
	return t;
}
PeerTable &peer_table() { return *peer_table_ptr(); }

std::shared_ptr<PeerFiles> files_of(const PeerSegment &peer)
{
	PeerTable &t = peer_table();
	std::lock_guard guard(t.lock);
	auto &f = t.files[{peer.pid, peer.handle}];
	if (!f)
		f = std::make_shared<PeerFiles>();
	return f;
}

/* One of the owner's process-wide fds, through a live object of its segment. */
int fetch_process_fd(const PeerSegment &peer, uint32_t slot, int &fd)
{
	uint64_t via = peer.via.load(std::memory_order_relaxed);
	if (!via)
		return ENOENT;
	pid_t owner = 0;
	if (int err = BrokerClient::instance().fetch_fd(unpack_object(via), slot, &fd, &owner))
		return err;
	if (owner != peer.pid) { /* the number moved to another process meanwhile */
		::close(fd);
		fd = -1;
		return ESRCH;
	}
	return 0;
}

/* The error an operation reports for a failure of the peer's side: ESRCH
 * gone, ETIMEDOUT no answer in time (stopped, or its helper stuck), EFAULT
 * its memory refused. */
int peer_error(const PeerSegment &peer, int err)
{
	if (err == EPIPE || err == ESRCH || !peer.alive())
		return ESRCH;
	return err == ETIMEDOUT ? ETIMEDOUT : EFAULT;
}

/* Another process's memory file, through windows of it. */
class SharedMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
		  const struct iovec *local, int count) override
	{
		std::shared_ptr<PeerFiles::Window> w;
		if (int err = window(peer, mr, w))
			return err;
		gather(static_cast<char *>(w->map.at(addr)), local, count);
		return 0;
	}
	int read(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr,
		 const struct iovec *local, int count) override
	{
		std::shared_ptr<PeerFiles::Window> w;
		if (int err = window(peer, mr, w))
			return err;
		scatter(local, count, static_cast<const char *>(w->map.at(addr)));
		return 0;
	}
	int atomic(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		std::shared_ptr<PeerFiles::Window> w;
		if (int err = window(peer, mr, w))
			return err;
		/* The target's physical page: atomic against every CPU atomic
		 * on it, in any process. */
		std::atomic_ref<uint64_t> word(*static_cast<uint64_t *>(w->map.at(addr)));
		if (op == AtomicOp::FetchAdd) {
			*old = word.fetch_add(a);
		} else {
			uint64_t expected = a;
			word.compare_exchange_strong(expected, b);
			*old = expected;
		}
		return 0;
	}

	/* A window covering the whole MR (cached per peer, LRU-bounded). */
	static int window(const PeerSegment &peer, const KeyEntry &mr,
			  std::shared_ptr<PeerFiles::Window> &out)
	{
		std::shared_ptr<PeerFiles> f = files_of(peer);
		const uint64_t lo = mr.addr, hi = mr.addr + (mr.length ? mr.length : 1);
		std::lock_guard guard(f->lock);
		for (size_t i = 0; i < f->windows.size(); i++) {
			if (f->windows[i]->lo <= lo && hi <= f->windows[i]->hi) {
				if (i)
					std::swap(f->windows[i], f->windows[0]);
				out = f->windows[0];
				return 0;
			}
		}
		if (f->mem_fd < 0)
			if (int err = fetch_process_fd(peer, kMemoryFileSlot, f->mem_fd))
				return peer_error(peer, err);
		auto w = std::make_shared<PeerFiles::Window>();
		w->lo = lo;
		w->hi = hi;
		if (memshare::map_peer(f->mem_fd, lo, size_t(hi - lo), w->map) != 0)
			return EFAULT;
		if (f->windows.size() >= PeerFiles::max_windows)
			f->windows.pop_back();
		f->windows.insert(f->windows.begin(), w);
		out = std::move(w);
		return 0;
	}
};

/* Another process's memory through its bounce server. */
class BounceMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &peer, const KeyEntry &, uint64_t addr,
		  const struct iovec *local, int count) override
	{
		std::shared_ptr<memshare::BounceClient> c;
		if (int err = client(peer, c))
			return err;
		for (int i = 0; i < count; i++) {
			if (int err = memshare::bounce_write(*c, addr, local[i].iov_base, local[i].iov_len,
							     peer.owner_alive_word()))
				return peer_error(peer, err);
			addr += local[i].iov_len;
		}
		return 0;
	}
	int read(const PeerSegment &peer, const KeyEntry &, uint64_t addr,
		 const struct iovec *local, int count) override
	{
		std::shared_ptr<memshare::BounceClient> c;
		if (int err = client(peer, c))
			return err;
		for (int i = 0; i < count; i++) {
			if (int err = memshare::bounce_read(*c, local[i].iov_base, addr, local[i].iov_len,
							    peer.owner_alive_word()))
				return peer_error(peer, err);
			addr += local[i].iov_len;
		}
		return 0;
	}
	int atomic(const PeerSegment &peer, const KeyEntry &, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		std::shared_ptr<memshare::BounceClient> c;
		if (int err = client(peer, c))
			return err;
		int err = op == AtomicOp::FetchAdd
				  ? memshare::bounce_atomic(*c, memshare::BounceOp::fetch_add, addr, a, 0, old,
							    peer.owner_alive_word())
				  : memshare::bounce_atomic(*c, memshare::BounceOp::cmp_swap, addr, b, a, old,
							    peer.owner_alive_word());
		return err ? peer_error(peer, err) : 0;
	}

private:
	static int client(const PeerSegment &peer, std::shared_ptr<memshare::BounceClient> &out)
	{
		std::shared_ptr<PeerFiles> f = files_of(peer);
		std::lock_guard guard(f->lock);
		if (!f->bounce) {
			int fd = -1;
			if (int err = fetch_process_fd(peer, kBounceSlot, fd))
				return peer_error(peer, err);
			auto c = memshare::BounceClient::attach(fd);
			::close(fd);
			if (!c)
				return EFAULT;
			f->bounce.reset(c.get());
		}
		out = f->bounce;
		return 0;
	}
};

DirectMemory direct;
OwnOdpMemory own_odp;
CmaMemory cma;
SharedMemory shared;
BounceMemory bounce;

} // namespace

void forget_peer_memory(pid_t pid)
{
	std::vector<std::shared_ptr<PeerFiles>> dropped; /* released outside the lock */
	PeerTable &t = peer_table();
	std::lock_guard guard(t.lock);
	for (auto it = t.files.begin(); it != t.files.end();) {
		if (it->first.first == pid) {
			dropped.push_back(std::move(it->second));
			it = t.files.erase(it);
		} else {
			++it;
		}
	}
}

int shared_window(const PeerSegment &peer, const KeyEntry &mr, SharedWindow &out)
{
	std::shared_ptr<PeerFiles::Window> w;
	if (int err = SharedMemory::window(peer, mr, w))
		return err;
	out.pid = peer.pid;
	out.segment = peer.handle;
	out.lo = w->lo;
	out.hi = w->hi;
	out.delta = reinterpret_cast<uint64_t>(w->map.at(w->lo)) - w->lo;
	out.hold = std::move(w);
	return 0;
}

/* The child's peers are looked up afresh (lib/fork.h). */
void fork_child::remote_memory() { peer_table_ptr() = new PeerTable; }

RemoteMemory &remote_memory_for(const PeerSegment &peer, const KeyEntry &mr)
{
	if (peer.local)
		return is_odp(mr.access) ? static_cast<RemoteMemory &>(own_odp) : direct;
	switch (mr.path) {
	case MemPath::Shared: return shared;
	case MemPath::Bounce: return bounce;
	default: return cma;
	}
}

} // namespace shmverbs
