/* SPDX-License-Identifier: MIT */
#include "remote_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

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

/* This process's own memory. */
class DirectMemory final : public RemoteMemory {
public:
	int write(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		  int count) override
	{
		char *to = reinterpret_cast<char *>(addr);
		for (int i = 0; i < count; i++) {
			std::memcpy(to, local[i].iov_base, local[i].iov_len);
			to += local[i].iov_len;
		}
		return 0;
	}
	int read(const PeerSegment &, const KeyEntry &, uint64_t addr, const struct iovec *local,
		 int count) override
	{
		const char *from = reinterpret_cast<const char *>(addr);
		for (int i = 0; i < count; i++) {
			std::memcpy(local[i].iov_base, from, local[i].iov_len);
			from += local[i].iov_len;
		}
		return 0;
	}
	int atomic(const PeerSegment &peer, const KeyEntry &mr, uint64_t addr, AtomicOp op,
		   uint64_t a, uint64_t b, uint64_t *old) override
	{
		std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t *>(addr));
		if (mr.path == MemPath::Cma || force_cma()) {
			/* Remote initiators take the lock on this memory: so
			 * must we, or we would not be atomic against them. */
			AtomicLock guard(peer, addr);
			*old = word.load();
			word.store(apply(op, *old, a, b));
			return 0;
		}
		if (op == AtomicOp::FetchAdd) {
			*old = word.fetch_add(a);
		} else {
			uint64_t expected = a;
			word.compare_exchange_strong(expected, b);
			*old = expected;
		}
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
		size_t total = 0;
		for (int i = 0; i < count; i++)
			total += local[i].iov_len;
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

DirectMemory direct;
CmaMemory cma;
std::atomic<RemoteMemory *> paths[2] = {&cma, nullptr};

} // namespace

bool force_cma()
{
	static const bool forced = [] {
		const char *s = std::getenv("SHMVERBS_FORCE_CMA");
		return s && *s == '1';
	}();
	return forced;
}

void register_remote_memory(MemPath path, RemoteMemory *impl)
{
	if (size_t(path) < 2)
		paths[size_t(path)].store(impl, std::memory_order_release);
}

RemoteMemory &remote_memory_for(const PeerSegment &peer, const KeyEntry &mr)
{
	if (peer.local)
		return direct;
	if (!force_cma() && size_t(mr.path) < 2)
		if (RemoteMemory *impl = paths[size_t(mr.path)].load(std::memory_order_acquire))
			return *impl;
	return cma;
}

} // namespace shmverbs
