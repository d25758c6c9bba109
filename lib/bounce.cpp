/* SPDX-License-Identifier: MIT */
#include "bounce.h"
#include "cma.h"
#include "log.h"
#include "tsan.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace shmverbs::memshare {

namespace {

/* Shared (not PRIVATE) futexes: the words live in a file mapped by several
 * processes. */
void futex_wait(std::atomic<uint32_t> *w, uint32_t val, long ns)
{
	struct timespec ts = {ns / 1000000000, ns % 1000000000};
	syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAIT, val, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t> *w, int n)
{
	syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

/*
 * The helper's loads and stores into the owner's registered memory stand for
 * a device's DMA: they are ordered with the application's own accesses by
 * the peer that asked for them (the application tells its peer in its own
 * way that a buffer is ready; the peer's request reaches this thread
 * through the bounce file), which ThreadSanitizer cannot follow from one
 * process to another: it reported each such copy as a race with the
 * application's thread. As a device's DMA would be, they are kept out of
 * its view (reads, writes, and the atomics of fetch-and-add and
 * compare-and-swap); the helper's own state stays in it.
 */
using AsDeviceAccess = TsanIgnoreAll;

uint64_t now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

bool process_gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

constexpr long kPollNs = 20 * 1000 * 1000; /* re-check for death/stop this often */

/* An access to pages that may be absent (Access::by_kernel, ODP memory):
 * a read or write is a copy the kernel makes (`copied`); an atomic's page is
 * faulted in writable first, so that the CPU atomic cannot fault. A hole is
 * EFAULT. */
int by_kernel(BounceOp op, uint64_t addr, char *data, uint64_t len, bool &copied)
{
	[[maybe_unused]] AsDeviceAccess as_device;
	void *target = reinterpret_cast<void *>(addr);
	copied = op == BounceOp::write || op == BounceOp::read;
	if (op == BounceOp::write)
		return copy_checked(target, data, len) ? EFAULT : 0;
	if (op == BounceOp::read)
		return copy_checked(data, target, len) ? EFAULT : 0;
	return fault_in_word(addr);
}

} // namespace

/* ---- BounceServer ---- */

Result<BounceServer> BounceServer::create(uint32_t nslots, uint32_t slot_size, Validate validate,
					  void *ctx)
{
	if (nslots < 1 || nslots > 1024 || slot_size < 64 || slot_size > (1u << 20) ||
	    slot_size % 64)
		return Err{EINVAL};
	size_t size = bounce_file_size(nslots, slot_size);
	int fd = memfd_create("shmverbs-bounce", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return Err{errno};
	void *p = MAP_FAILED;
	if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
	    (p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		int err = errno;
		close(fd);
		return Err{err};
	}
	auto *s = new BounceServer;
	s->fd_ = fd;
	s->base_ = static_cast<char *>(p);
	s->size_ = size;
	s->nslots_ = nslots;
	s->slot_size_ = slot_size;
	s->validate_ = validate;
	s->ctx_ = ctx;
	auto *h = reinterpret_cast<BounceHeader *>(s->base_);
	h->version = kBounceVersion;
	h->nslots = nslots;
	h->slot_size = slot_size;
	h->owner_pid = getpid();
	/* Publish the magic last: a peer that sees it sees the geometry. */
	std::atomic_ref<uint64_t>(h->magic).store(kBounceMagic, std::memory_order_release);
	s->helper_ = std::thread([s] { s->run(); });
	return s;
}

BounceServer::~BounceServer()
{
	if (helper_.joinable()) {
		stop_.store(true);
		auto *h = reinterpret_cast<BounceHeader *>(base_);
		h->doorbell.fetch_add(1, std::memory_order_release);
		futex_wake(&h->doorbell, 1);
		helper_.join();
	}
	if (base_)
		munmap(base_, size_);
	if (fd_ >= 0)
		close(fd_);
}

/* The helper: serve every requested slot, then sleep on the doorbell. It
 * re-reads the doorbell before scanning, so a request rung after the scan
 * makes the futex wait return at once (no lost wake-up). */
void BounceServer::run()
{
	auto *h = reinterpret_cast<BounceHeader *>(base_);
	while (!stop_.load(std::memory_order_acquire)) {
		uint32_t bell = h->doorbell.load(std::memory_order_acquire);
		bool any = false;
		for (uint32_t i = 0; i < nslots_; i++) {
			auto *slot = reinterpret_cast<BounceSlot *>(
				base_ + sizeof(BounceHeader) + size_t{i} * (sizeof(BounceSlot) + slot_size_));
			uint32_t want = kPhaseRequest;
			/* acquire: pairs with the initiator's release store of
			 * kPhaseRequest, so the request fields are visible. */
			if (slot->phase.compare_exchange_strong(want, kPhaseBusy,
								std::memory_order_acquire)) {
				execute(slot);
				served_.fetch_add(1, std::memory_order_relaxed);
				/* release: the initiator reads status/result/data
				 * (and served()) after seeing kPhaseDone. */
				slot->phase.store(kPhaseDone, std::memory_order_release);
				futex_wake(&slot->phase, 1);
				any = true;
			}
		}
		if (!any)
			futex_wait(&h->doorbell, bell, 100 * 1000 * 1000);
	}
}

void BounceServer::execute(BounceSlot *slot)
{
	/* Copy the request out once: the initiator may scribble on it. */
	const uint32_t op = slot->op;
	const uint64_t addr = slot->addr, len = slot->len;
	char *data = reinterpret_cast<char *>(slot + 1);
	int status = 0;
	bool write = op == uint32_t(BounceOp::write) || op == uint32_t(BounceOp::fetch_add) ||
		     op == uint32_t(BounceOp::cmp_swap);
	uint64_t end;
	if (op < uint32_t(BounceOp::write) || op > uint32_t(BounceOp::cmp_swap))
		status = EINVAL;
	else if (len > slot_size_ || __builtin_add_overflow(addr, len, &end) || !addr)
		status = EINVAL;
	else if (op >= uint32_t(BounceOp::fetch_add) && (len != 8 || addr % 8))
		status = EINVAL;
	Access access = Access::allowed;
	if (status == 0 && validate_ && (access = validate_(ctx_, addr, len, write)) == Access::refused)
		status = EACCES;
	bool copied = false;
	if (status == 0 && access == Access::by_kernel)
		status = by_kernel(static_cast<BounceOp>(op), addr, data, len, copied);
	if (status == 0 && !copied) {
		void *target = reinterpret_cast<void *>(addr);
		[[maybe_unused]] AsDeviceAccess as_device;
		switch (static_cast<BounceOp>(op)) {
		case BounceOp::write:
			std::memcpy(target, data, len);
			break;
		case BounceOp::read:
			std::memcpy(data, target, len);
			break;
		case BounceOp::fetch_add:
			slot->result = __atomic_fetch_add(static_cast<uint64_t *>(target),
							  slot->operand, __ATOMIC_SEQ_CST);
			break;
		case BounceOp::cmp_swap: {
			uint64_t expected = slot->compare;
			__atomic_compare_exchange_n(static_cast<uint64_t *>(target), &expected,
						    slot->operand, false, __ATOMIC_SEQ_CST,
						    __ATOMIC_SEQ_CST);
			slot->result = expected; /* the old value either way */
			break;
		}
		}
	}
	slot->status = status;
}

/* ---- BounceClient ---- */

Result<BounceClient> BounceClient::attach(int fd, unsigned timeout_ms)
{
	struct stat sb;
	if (fstat(fd, &sb) != 0)
		return Err{errno};
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK) ||
	    static_cast<size_t>(sb.st_size) < sizeof(BounceHeader))
		return Err{EINVAL};
	size_t size = static_cast<size_t>(sb.st_size);
	void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return Err{errno};
	auto *h = static_cast<BounceHeader *>(p);
	/* Copy the geometry once and never trust the shared copy again. */
	uint64_t magic = std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
	uint32_t version = h->version, nslots = h->nslots, slot_size = h->slot_size;
	pid_t owner = h->owner_pid;
	if (magic != kBounceMagic || version != kBounceVersion || nslots < 1 || nslots > 1024 ||
	    slot_size < 64 || slot_size > (1u << 20) || slot_size % 64 ||
	    bounce_file_size(nslots, slot_size) > size || owner <= 0) {
		munmap(p, size);
		return Err{EINVAL};
	}
	auto *c = new BounceClient;
	c->base_ = static_cast<char *>(p);
	c->size_ = size;
	c->nslots_ = nslots;
	c->slot_size_ = slot_size;
	c->target_ = owner;
	c->timeout_ms_ = timeout_ms;
	return c;
}

BounceClient::~BounceClient()
{
	if (base_)
		munmap(base_, size_);
}

BounceSlot *BounceClient::slot_at(uint32_t i) const
{
	return reinterpret_cast<BounceSlot *>(base_ + sizeof(BounceHeader) +
					      size_t{i} * (sizeof(BounceSlot) + slot_size_));
}

BounceClient::Watch BounceClient::watch(const int *alive) const
{
	return {now_ns() + uint64_t{timeout_ms_} * 1000000, alive};
}

bool BounceClient::target_gone(const Watch &w) const
{
	if (w.alive && (__atomic_load_n(w.alive, __ATOMIC_ACQUIRE) & FUTEX_TID_MASK) == 0)
		return true;
	return process_gone(target_);
}

int BounceClient::claim(BounceSlot *&slot, const Watch &w)
{
	const uint32_t self = static_cast<uint32_t>(getpid());
	for (unsigned round = 0;; round++) {
		uint32_t start = next_.fetch_add(1, std::memory_order_relaxed);
		for (uint32_t k = 0; k < nslots_; k++) {
			BounceSlot *s = slot_at((start + k) % nslots_);
			uint32_t owner = s->owner.load(std::memory_order_relaxed);
			/* A slot of a dead initiator is free again; its request,
			 * if any, has been or will be executed harmlessly. */
			if (owner != 0 && owner != self && round > 0 &&
			    process_gone(static_cast<pid_t>(owner))) {
				uint32_t ph = s->phase.load(std::memory_order_acquire);
				if (ph == kPhaseRequest || ph == kPhaseBusy)
					continue; /* the helper still owns it */
			} else if (owner != 0) {
				continue;
			}
			/* acquire: see the previous owner's last writes. */
			if (s->owner.compare_exchange_strong(owner, self, std::memory_order_acquire)) {
				s->phase.store(kPhaseIdle, std::memory_order_relaxed);
				slot = s;
				return 0;
			}
		}
		if (target_gone(w))
			return EPIPE;
		if (now_ns() > w.deadline_ns)
			return ETIMEDOUT;
		usleep(round < 10 ? 10 : 1000);
	}
}

void BounceClient::post(BounceSlot *slot)
{
	auto *h = reinterpret_cast<BounceHeader *>(base_);
	slot->phase.store(kPhaseRequest, std::memory_order_release);
	h->doorbell.fetch_add(1, std::memory_order_release);
	futex_wake(&h->doorbell, 1);
}

int BounceClient::wait(BounceSlot *slot, const Watch &w)
{
	const uint64_t deadline = w.deadline_ns;
	for (;;) {
		uint32_t ph = slot->phase.load(std::memory_order_acquire);
		if (ph == kPhaseDone) {
			int status = slot->status;
			return status < 0 || status > 4095 ? EIO : status;
		}
		if (target_gone(w))
			return EPIPE; /* the slot dies with the file */
		if (now_ns() > deadline) {
			/* Withdraw a request the helper has not taken; one it is
			 * executing completes shortly, keep waiting for it. */
			uint32_t want = kPhaseRequest;
			if (slot->phase.compare_exchange_strong(want, kPhaseIdle))
				return ETIMEDOUT;
			/* A helper stuck in the copy (target stopped): give up
			 * and leave the slot to it (ESTALE: do not release). */
			if (now_ns() > deadline + uint64_t{timeout_ms_} * 1000000)
				return ESTALE;
		}
		futex_wait(&slot->phase, ph, kPollNs);
	}
}

int BounceClient::let_go(BounceSlot *slot, int err)
{
	if (err != EPIPE && err != ESTALE)
		slot->owner.store(0, std::memory_order_release);
	return err == ESTALE ? ETIMEDOUT : err;
}

template <typename Fill, typename Done>
int BounceClient::transfer(BounceOp op, uint64_t va, size_t len, Fill &&fill, Done &&done,
			   const int *alive)
{
	/* One deadline for the chunks in flight, moved on by each one that
	 * completes: what runs out is the time without an answer, not the
	 * time a long transfer takes. */
	Watch w = watch(alive);
	/* Half the slots at most, so that other initiators of this target
	 * still find some free. */
	constexpr uint32_t kMaxInFlight = 8;
	struct Chunk {
		BounceSlot *slot;
		size_t off, n;
	} q[kMaxInFlight];
	const uint32_t depth = std::clamp(nslots_ / 2, 1u, kMaxInFlight);
	uint32_t head = 0, count = 0;
	int err = 0;
	auto retire = [&] {
		Chunk &c = q[head];
		int e = wait(c.slot, w);
		if (!e) {
			done(c.slot, c.off, c.n);
			w.deadline_ns = watch(alive).deadline_ns;
		}
		e = let_go(c.slot, e);
		if (!err)
			err = e;
		head = (head + 1) % depth;
		count--;
	};
	for (size_t off = 0; off < len && !err;) {
		const size_t n = std::min<size_t>(len - off, slot_size_);
		/* The queue is full, or this is the last chunk and it must
		 * land after the others. */
		if (count == depth || (off + n == len && count)) {
			retire();
			continue;
		}
		BounceSlot *s;
		if ((err = claim(s, w)))
			break;
		s->op = uint32_t(op);
		s->addr = va + off;
		s->len = n;
		fill(s, off, n);
		post(s);
		q[(head + count) % depth] = {s, off, n};
		count++;
		off += n;
	}
	while (count)
		retire();
	return err;
}

int bounce_write(BounceClient &c, uint64_t va, const void *src, size_t len, const int *alive)
{
	auto *p = static_cast<const char *>(src);
	return c.transfer(
		BounceOp::write, va, len,
		[&](BounceSlot *s, size_t off, size_t n) {
			std::memcpy(reinterpret_cast<char *>(s + 1), p + off, n);
		},
		[](BounceSlot *, size_t, size_t) {}, alive);
}

int bounce_read(BounceClient &c, void *dst, uint64_t va, size_t len, const int *alive)
{
	auto *p = static_cast<char *>(dst);
	return c.transfer(
		BounceOp::read, va, len, [](BounceSlot *, size_t, size_t) {},
		[&](BounceSlot *s, size_t off, size_t n) {
			std::memcpy(p + off, reinterpret_cast<char *>(s + 1), n);
		},
		alive);
}

int bounce_atomic(BounceClient &c, BounceOp op, uint64_t va, uint64_t operand, uint64_t compare,
		  uint64_t *old, const int *alive)
{
	if ((op != BounceOp::fetch_add && op != BounceOp::cmp_swap) || va % 8)
		return EINVAL;
	const BounceClient::Watch w = c.watch(alive);
	BounceSlot *s;
	if (int err = c.claim(s, w))
		return err;
	s->op = uint32_t(op);
	s->addr = va;
	s->len = 8;
	s->operand = operand;
	s->compare = compare;
	c.post(s);
	int err = c.wait(s, w);
	if (!err && old)
		*old = s->result;
	return c.let_go(s, err);
}

} // namespace shmverbs::memshare
