/* SPDX-License-Identifier: MIT */
#include "mr.h"
#include "mw.h"
#include "cma.h"
#include "dm.h"
#include "mr_memory.h"
#include "segment.h"
#include "device.h"
#include "fork.h"
#include "log.h"
#include "process.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <thread>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Mr> && offsetof(Mr, ibv) == 0);
static_assert(std::is_standard_layout_v<KeySlot>,
	      "slots are meant to move into shared memory: plain fields only");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
	      "key and reader counts must stay lock-free to be shareable between processes");

void (*key_withdrawn_hook)(const KeySlot &slot) = nullptr;

/* ---- KeyRef ---- */

KeyRef &KeyRef::operator=(KeyRef &&other) noexcept
{
	if (this != &other) {
		release();
		slot_ = other.slot_;
		holder_ = other.holder_;
		other.slot_ = nullptr;
	}
	return *this;
}

void KeyRef::count_out()
{
	/* Each decrement pairs with the loads in KeyTable::unpublish(): our
	 * reads of the entry happen before the writer's next update of it. */
	if (holder_ == holder_local) {
		slot_->readers.fetch_sub(1, std::memory_order_release);
	} else if (holder_ == holder_anonymous) {
		slot_->anonymous.fetch_sub(1, std::memory_order_release);
	} else {
		shmverbs::count_out(slot_->holders, holder_);
	}
	slot_ = nullptr;
}

KeyRef acquire_remote_key(KeySlot &s, uint32_t key)
{
	/* seq_cst: the Dekker pair with unpublish() (our count, then the
	 * key). */
	const int entry = count_in(s.holders, own_pid());
	const int8_t holder = entry == holder_anonymous ? KeyRef::holder_anonymous : int8_t(entry);
	if (holder == KeyRef::holder_anonymous)
		s.anonymous.fetch_add(1, std::memory_order_seq_cst);
	KeyRef ref(&s, holder);
	if (s.key.load(std::memory_order_seq_cst) != key)
		return {}; /* ref's destructor takes the count back */
	return ref;
}

/* ---- KeyTable ---- */

KeyTable::KeyTable(uint32_t max_mr, uint32_t index_space) : KeyTable(max_mr, index_space, -1) {}

KeyTable::KeyTable(uint32_t max_mr, uint32_t index_space, int shared_device)
	: max_mr_(max_mr),
	  index_space_(std::min(std::max(index_space, first_index), index_space_max)),
	  shared_device_(shared_device),
	  chunks_(std::make_unique<std::atomic<KeySlot *>[]>((index_space_ + chunk_size - 1) /
							      chunk_size))
{
	std::lock_guard guard(lock_);
	KeySlot &null_slot = slot_alloc(null_index);
	null_slot.entry = KeyEntry{};
	null_slot.entry.kind = KeyKind::NullMr;
	null_slot.entry.access = IBV_ACCESS_LOCAL_WRITE;
	null_slot.entry.length = UINT64_MAX;
	null_slot.entry.owner_pid = static_cast<int32_t>(getpid());
	null_key_ = make_key(null_index, 0);
	static_assert(make_key(null_index, 0) == null_mr_key);
	null_slot.key.store(null_key_, std::memory_order_release);
}

KeyTable::~KeyTable()
{
	size_t n = (index_space_ + chunk_size - 1) / chunk_size;
	if (shared_device_ >= 0)
		return; /* segment memory is never freed */
	for (size_t i = 0; i < n; i++)
		delete[] chunks_[i].load(std::memory_order_relaxed);
}

namespace {

/* Never freed, like the devices: threads may still use a table while the
 * process exits. A forked child starts a new set (lib/fork.h). */
struct KeyTables {
	std::mutex lock;
	std::map<uint32_t, KeyTable *> tables;
};

KeyTables *&key_tables()
{
	static KeyTables *t = new KeyTables;
	return t;
}

/* The tables of the first devices again, without the lock: every local
 * SGE of every WR looks its table up, and a process-wide mutex there is two
 * atomic operations on a line that all posting threads share. Set once
 * under the lock (a table is never replaced but in a forked child). */
constexpr uint32_t fast_tables = 16;
std::atomic<KeyTable *> fast_table[fast_tables];

} // namespace

std::atomic<uint32_t> own_pid_cache{0};

uint32_t own_pid_slow()
{
	/* fork_child::key_tables() clears the cache in a child of a process
	 * that opened a device; this handler in any other (a CQ ring's
	 * producer in a test that made no context). */
	static std::once_flag once;
	std::call_once(once, [] {
		pthread_atfork(nullptr, nullptr,
			       [] { own_pid_cache.store(0, std::memory_order_relaxed); });
	});
	const uint32_t p = uint32_t(getpid());
	own_pid_cache.store(p, std::memory_order_relaxed);
	return p;
}

void fork_child::key_tables()
{
	::shmverbs::key_tables() = new KeyTables;
	for (auto &t : fast_table)
		t.store(nullptr, std::memory_order_relaxed);
	own_pid_cache.store(0, std::memory_order_relaxed);
}

KeyTable &KeyTable::of(const Device &dev)
{
	if (dev.index < fast_tables)
		if (KeyTable *t = fast_table[dev.index].load(std::memory_order_acquire))
			return *t;
	KeyTables &all = *key_tables();
	std::lock_guard guard(all.lock);
	KeyTable *&table = all.tables[dev.index];
	if (!table) {
		struct ibv_device_attr attr = dev.device_attr();
		table = new KeyTable(static_cast<uint32_t>(attr.max_mr), index_space_max,
				     int(dev.index));
		table->set_max_mw(uint32_t(attr.max_mw));
	}
	if (dev.index < fast_tables)
		fast_table[dev.index].store(table, std::memory_order_release);
	return *table;
}

KeySlot *KeyTable::slot(uint32_t index) const
{
	if (index >= index_space_)
		return nullptr;
	/* Pairs with the release store in slot_alloc(). */
	KeySlot *chunk = chunks_[index >> chunk_bits].load(std::memory_order_acquire);
	return chunk ? &chunk[index & (chunk_size - 1)] : nullptr;
}

KeySlot &KeyTable::slot_alloc(uint32_t index)
{
	std::atomic<KeySlot *> &chunk = chunks_[index >> chunk_bits];
	KeySlot *slots = chunk.load(std::memory_order_relaxed);
	if (!slots && shared_device_ >= 0) {
		/* In the shared segment, where peers find it through the
		 * header (shm_layout.h); fresh segment memory is zero, which
		 * is a valid unpublished KeySlot. */
		Segment &seg = Segment::of(uint32_t(shared_device_));
		uint64_t off = seg.alloc(sizeof(KeySlot) * chunk_size);
		if (off) {
			slots = new (seg.at<void>(off)) KeySlot[chunk_size];
			seg.header().key_chunks[index >> chunk_bits].store(off, std::memory_order_release);
			chunk.store(slots, std::memory_order_release);
		}
	}
	if (!slots) {
		slots = new KeySlot[chunk_size];
		chunk.store(slots, std::memory_order_release);
	}
	return slots[index & (chunk_size - 1)];
}

int KeyTable::reserve(uint32_t &index, bool window)
{
	std::lock_guard guard(lock_);
	if (window ? mw_count_ >= max_mw_ : mr_count_ >= max_mr_)
		return ENOMEM;
	if (recycled_.size() > reuse_delay || next_fresh_ >= index_space_) {
		if (recycled_.empty())
			return ENOMEM;
		index = recycled_.front();
		recycled_.pop_front();
	} else {
		index = next_fresh_++;
		slot_alloc(index);
	}
	(window ? mw_count_ : mr_count_)++;
	return 0;
}

void KeyTable::set_max_mw(uint32_t max_mw)
{
	std::lock_guard guard(lock_);
	max_mw_ = max_mw;
}

uint32_t KeyTable::publish(uint32_t index, const KeyEntry &entry, uint8_t variant)
{
	std::lock_guard guard(lock_);
	KeySlot &s = *slot(index);
	s.entry = entry;
	s.variant = variant;
	uint32_t key = make_key(index, variant);
	/* Pairs with the load in acquire(): a reader that sees the key sees
	 * the entry written above. */
	s.key.store(key, std::memory_order_release);
	return key;
}

/* How long a withdrawal waits for holds it cannot attribute to a process. */
constexpr std::chrono::seconds unattributed_hold_bound{2};

void KeyTable::unpublish(uint32_t index)
{
	KeySlot &s = *slot(index);
	const uint32_t key_was = s.key.load(std::memory_order_relaxed);
	/* Dekker-style with acquire() and acquire_remote_key(): we store the
	 * key then load the counts, a reader increments a count then loads the
	 * key (all seq_cst), so either we see its count or it sees the key
	 * withdrawn. */
	s.key.store(0, std::memory_order_seq_cst);
	if (key_withdrawn_hook)
		key_withdrawn_hook(s);
	const auto started = std::chrono::steady_clock::now();
	Wait wait;
	for (unsigned spins = 0;; spins++) {
		bool local = s.readers.load(std::memory_order_seq_cst) != 0;
		/* Liveness checks cost system calls: after a short spin, and
		 * then on every 16th round only. */
		bool remote = spins >= 100 && spins % 16 == 0
			? live_holds(s.holders, "key", key_was)
			: any_holds(s.holders);
		const uint32_t unattributed = local || remote ? 1 : unattributed_holds(s, index, wait);
		if (!local && !remote && !unattributed)
			return;
		if (!local && !remote && std::chrono::steady_clock::now() - started >
						 unattributed_hold_bound) {
			/* More processes held the key at once than there are
			 * holder entries, and one of them has not let go for 2 s:
			 * most likely dead (as destroy_qp's in-flight wait). */
			log_error("key 0x%x: withdrawn while %u unattributed remote hold(s) remain",
				  key_was, unattributed);
			give_up_holds(index, wait);
			return;
		}
		if (spins < 1000)
			std::this_thread::yield();
		else
			std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 50 : 1000));
	}
}

uint32_t KeyTable::unattributed_holds(const KeySlot &s, uint32_t index, Wait &wait)
{
	const uint32_t anonymous = s.anonymous.load(std::memory_order_seq_cst);
	wait.fewest = std::min(wait.fewest, anonymous);
	if (!anonymous && !any_abandoned_.load(std::memory_order_relaxed))
		return 0; /* the usual case: no lock */
	std::lock_guard guard(lock_);
	auto it = abandoned_.find(index);
	if (it == abandoned_.end())
		return anonymous;
	/* Fewer now: some of those were alive after all, and let go. */
	const uint32_t abandoned = std::min(it->second, anonymous);
	if (abandoned)
		it->second = abandoned;
	else
		abandoned_.erase(it);
	any_abandoned_.store(!abandoned_.empty(), std::memory_order_relaxed);
	return anonymous - abandoned;
}

void KeyTable::give_up_holds(uint32_t index, const Wait &wait)
{
	std::lock_guard guard(lock_);
	if (wait.fewest && wait.fewest != UINT32_MAX)
		abandoned_[index] = wait.fewest;
	any_abandoned_.store(!abandoned_.empty(), std::memory_order_relaxed);
}

bool KeyTable::try_unpublish(uint32_t index, Wait &wait)
{
	KeySlot &s = *slot(index);
	const uint32_t key_was = s.key.load(std::memory_order_relaxed);
	s.key.store(0, std::memory_order_seq_cst); /* as unpublish() */
	const bool held =
		s.readers.load(std::memory_order_seq_cst) != 0 || live_holds(s.holders, "key", key_was);
	/* The usual case, a key nobody holds: no clock, no lock. */
	if (!held && s.anonymous.load(std::memory_order_seq_cst) == 0 &&
	    !any_abandoned_.load(std::memory_order_relaxed))
		return true;
	const auto now = std::chrono::steady_clock::now();
	if (wait.since == std::chrono::steady_clock::time_point{} ||
	    now - wait.last > std::chrono::milliseconds(100))
		wait = Wait{now, now, UINT32_MAX};
	wait.last = now;
	if (held)
		return false;
	const uint32_t unattributed = unattributed_holds(s, index, wait);
	if (!unattributed)
		return true;
	if (now - wait.since <= unattributed_hold_bound)
		return false;
	log_error("key-table slot %u: withdrawn while %u unattributed remote hold(s) remain",
		  index, unattributed);
	give_up_holds(index, wait);
	return true;
}

void KeyTable::release(uint32_t index, bool window)
{
	std::lock_guard guard(lock_);
	(window ? mw_count_ : mr_count_)--;
	recycled_.push_back(index);
}

uint8_t KeyTable::variant(uint32_t index) const
{
	std::lock_guard guard(lock_);
	const KeySlot *s = slot(index);
	return s ? s->variant : 0;
}

uint32_t KeyTable::live_key(uint32_t index) const
{
	const KeySlot *s = slot(index);
	return s ? s->key.load(std::memory_order_acquire) : 0;
}

KeyRef KeyTable::acquire(uint32_t key) const
{
	if (key_index(key) < null_index)
		return {};
	KeySlot *s = slot(key_index(key));
	if (!s)
		return {};
	s->readers.fetch_add(1, std::memory_order_seq_cst);
	if (s->key.load(std::memory_order_seq_cst) != key) {
		s->readers.fetch_sub(1, std::memory_order_release);
		return {};
	}
	return KeyRef(s);
}

uint32_t KeyTable::mr_count() const
{
	std::lock_guard guard(lock_);
	return mr_count_;
}

/* ---- MRs ---- */

namespace {

/* The uverbs object handle; unique in the process, never 0. */
std::atomic<uint32_t> next_handle{1};

uint64_t page_size()
{
	static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	return size;
}

/* ib_access_writable(): the access for which ib_umem_get() pins with
 * FOLL_WRITE. */
bool writable(uint32_t access)
{
	return access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
}

/* What the pinning refuses of mapped pages (EFAULT): a mapping without
 * access (PROT_NONE), and for a writable MR one without write. Unchecked,
 * a transfer into such memory would fault in the emulator instead. The
 * protections are read from /proc/self/maps (sorted by address), once per
 * registration; if it cannot be read, nothing more is checked. */
int check_protection(uint64_t start, uint64_t end, bool write)
{
	FILE *maps = std::fopen("/proc/self/maps", "re");
	if (!maps)
		return 0;
	char *line = nullptr;
	size_t cap = 0;
	int err = 0;
	while (getline(&line, &cap, maps) > 0) {
		unsigned long lo = 0, hi = 0;
		char perms[5] = {};
		if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || hi <= start)
			continue;
		if (lo >= end)
			break;
		if (std::strncmp(perms, "---", 3) == 0 || (write && perms[1] != 'w')) {
			err = EFAULT;
			break;
		}
	}
	std::free(line);
	std::fclose(maps);
	return err;
}

/* What ib_umem_get() refuses before and while pinning: an range that wraps
 * (EINVAL), no pages (EINVAL), pages that are not mapped or not accessible
 * as `access` needs (EFAULT). msync() with MS_ASYNC only walks the mappings
 * and fails with ENOMEM on a hole. */
int check_user_range(uint64_t addr, uint64_t length, uint32_t access)
{
	const uint64_t page = page_size();
	uint64_t end = addr + length;
	uint64_t end_aligned = (end + page - 1) & ~(page - 1);
	if (end < addr || end_aligned < end)
		return EINVAL;
	if (length == 0)
		return EINVAL;
	uint64_t start = addr & ~(page - 1);
	if (msync(reinterpret_cast<void *>(start), end_aligned - start, MS_ASYNC) != 0)
		return EFAULT;
	return check_protection(start, end_aligned, writable(access));
}

KeyEntry mr_entry(const Mr &mr)
{
	KeyEntry e{};
	e.kind = KeyKind::Mr;
	e.access = mr.access;
	e.pdn = mr.pd->pdn;
	e.owner_pid = static_cast<int32_t>(getpid());
	e.iova = mr.iova;
	e.length = mr.length;
	e.addr = mr.addr;
	e.path = mr.path;
	return e;
}

} // namespace

struct ibv_odp_caps odp_caps(const Device &dev, uint32_t &xrc)
{
	if (!memshare::cma_self_available()) {
		xrc = 0;
		return {};
	}
	return dev.profile->odp_caps(xrc);
}

bool odp_supported(const Device &dev)
{
	uint32_t xrc;
	return odp_caps(dev, xrc).general_caps & IBV_ODP_SUPPORT;
}

int check_mr_access(uint32_t access, bool odp)
{
	constexpr uint32_t known = ((IBV_ACCESS_HUGETLB << 1) - 1) | IBV_ACCESS_OPTIONAL_RANGE;
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	if (access & ~known)
		return EINVAL;
	if (is_odp(access) && !odp)
		return EOPNOTSUPP;
	return 0;
}

namespace {

/* A registration whose range and access were checked: a key, the range
 * made reachable (an empty one never is) and published. */
Result<Mr> publish_mr(Context &ctx, Pd &pd, MrType type, uint64_t start, uint64_t length,
		      uint64_t iova, uint32_t access)
{
	KeyTable &keys = KeyTable::of(*ctx.device);
	uint32_t index;
	if (int err = keys.reserve(index))
		return Err{err};
	auto *mr = new (std::nothrow) Mr{};
	if (!mr) {
		keys.release(index);
		return Err{ENOMEM};
	}
	mr->type = type;
	mr->pd = &pd;
	mr->access = access;
	mr->addr = start;
	mr->length = length;
	mr->iova = iova;
	mr->index = index;
	mr->keys = &keys;
	/* Reachable by peers before anyone can learn the key. */
	mr->path = length ? mr_memory_attach(start, length, access) : MemPath::Cma;
	pd.uses.get();
	uint32_t key = keys.publish(index, mr_entry(*mr), uint8_t(keys.variant(index) + 1));
	mr->ibv.context = ctx.abi();
	mr->ibv.lkey = key;
	mr->ibv.rkey = key;
	mr->ibv.handle = next_handle.fetch_add(1, std::memory_order_relaxed);
	return mr;
}

/* What ib_umem_odp_get() checks of an explicit ODP range: a wrap is
 * EOVERFLOW; nothing needs to be mapped. */
int check_odp_range(uint64_t addr, uint64_t length)
{
	const uint64_t page = page_size();
	if (length == 0)
		return EINVAL;
	uint64_t end = addr + length;
	if (end < addr || ((end + page - 1) & ~(page - 1)) < end)
		return EOVERFLOW;
	return 0;
}

} // namespace

Result<Mr> reg_mr(Context &ctx, Pd &pd, void *addr, size_t length, uint64_t iova,
		  uint32_t access)
{
	const uint64_t start = reinterpret_cast<uintptr_t>(addr);
	/* libibverbs: implicit ODP must name the whole address space from 0. */
	if (is_odp(access) && length == SIZE_MAX && addr)
		return Err{EINVAL};
	/* uverbs: the iova must sit at the same offset in its page. */
	if ((start ^ iova) & (page_size() - 1))
		return Err{EINVAL};
	if (int err = check_mr_access(access, odp_supported(*ctx.device)))
		return Err{err};
	if (is_odp(access) && !addr && length == SIZE_MAX) {
		/* Implicit ODP (mlx5_ib): the whole address space, at iova 0,
		 * never on huge pages. */
		if (iova || (access & IBV_ACCESS_HUGETLB))
			return Err{EINVAL};
	} else if (is_odp(access)) {
		if (int err = check_odp_range(start, length))
			return Err{err};
	} else if (int err = check_user_range(start, length, access)) {
		return Err{err};
	}
	return publish_mr(ctx, pd, MrType::User, start, length, iova, access);
}

Result<Mr> reg_dm_mr(Context &ctx, Pd &pd, Dm &dm, uint64_t offset, size_t length,
		     uint32_t access)
{
	/* libmlx5's mask, then libibverbs' ZERO_BASED, then uverbs and
	 * mlx5_ib's MEMIC mask, which (unlike libmlx5's) leaves out the
	 * optional bits: IBV_ACCESS_RELAXED_ORDERING is EINVAL here. */
	constexpr uint32_t allowed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				     IBV_ACCESS_ZERO_BASED;
	if ((access & ~allowed) || !(access & IBV_ACCESS_ZERO_BASED))
		return Err{EINVAL};
	if (int err = check_mr_access(access, false))
		return Err{err};
	if (offset > dm.length || length > dm.length - offset)
		return Err{EINVAL};
	Result<Mr> mr = publish_mr(ctx, pd, MrType::Dm, reinterpret_cast<uintptr_t>(dm.mem) + offset,
				   length, 0, access);
	if (mr) {
		mr->dm = &dm;
		dm.uses.get();
	}
	return mr;
}

int rereg_mr(Mr &mr, int flags, Pd *new_pd, void *addr, size_t length, uint32_t access)
{
	const uint64_t start = reinterpret_cast<uintptr_t>(addr);
	if (flags == 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED))
		return EINVAL;
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!start || !length))
		return EINVAL;
	if (mr.type != MrType::User)
		return EINVAL;
	const Device &dev = *Context::from(mr.ibv.context)->device;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		if (int err = check_mr_access(access, odp_supported(dev)))
			return err;
	if ((flags & IBV_REREG_MR_CHANGE_PD) && !new_pd)
		return EINVAL;
	const uint32_t new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : mr.access;
	const bool odp = is_odp(new_access);
	/* mlx5_ib changes local write, remote read/write/atomic and the
	 * optional bits of an MR in place (umr_rereg_pd_access), keys kept.
	 * Any other difference (ON_DEMAND, MW_BIND, ...) makes a new MR: new
	 * keys; from the same pages for a pinned MR (create_real_mr), and for
	 * an ODP one from the address and length of this call, which
	 * libibverbs passes whatever the flags (recreate): none is an error,
	 * a range the MR takes. */
	constexpr uint32_t in_place = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				      IBV_ACCESS_OPTIONAL_RANGE;
	const bool recreate = (flags & IBV_REREG_MR_CHANGE_ACCESS) && ((access ^ mr.access) & ~in_place);
	if (recreate && is_odp(mr.access) && !(flags & IBV_REREG_MR_CHANGE_TRANSLATION)) {
		if (!start || !length)
			return odp ? EOVERFLOW : EINVAL; /* ib_init_umem_odp, ib_umem_get */
		flags |= IBV_REREG_MR_CHANGE_TRANSLATION;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		if (int err = odp ? check_odp_range(start, length)
				  : check_user_range(start, length, new_access))
			return err;
	} else if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && !odp && writable(new_access) &&
		   !writable(mr.access)) {
		/* mlx5_ib pins again for the new access. */
		if (int err = check_user_range(mr.addr, mr.length, new_access))
			return err;
	}

	Pd *old_pd = mr.pd;
	Pd *pd = (flags & IBV_REREG_MR_CHANGE_PD) ? new_pd : old_pd;
	if (pd != old_pd)
		pd->uses.get();

	KeyTable &keys = *mr.keys;
	keys.unpublish(mr.index);
	/* A window names the MR's range, path and PD as they were. */
	unbind_windows_of(mr);
	uint8_t variant = keys.variant(mr.index);
	const uint64_t old_addr = mr.addr, old_length = mr.length;
	const uint32_t old_access = mr.access;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr.addr = start;
		mr.length = length;
		mr.iova = start;
	}
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) || recreate)
		variant++;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr.access = access;
	if (flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS)) {
		/* The new range first: pages in both stay shared throughout. */
		MemPath old_path = mr.path;
		mr.path = mr_memory_attach(mr.addr, mr.length, mr.access);
		mr_memory_detach(old_addr, old_length, old_access, old_path);
	}
	mr.pd = pd;
	uint32_t key = keys.publish(mr.index, mr_entry(mr), variant);
	mr.ibv.lkey = key;
	mr.ibv.rkey = key;

	if (pd != old_pd)
		old_pd->uses.put();
	return 0;
}

int dereg_mr(Mr &mr)
{
	if (mr.type != MrType::Null) {
		mr.keys->unpublish(mr.index);
		unbind_windows_of(mr);
		/* No operation holds the key any more: the pages may go private. */
		if (mr.length)
			mr_memory_detach(mr.addr, mr.length, mr.access, mr.path);
		mr.keys->release(mr.index);
		mr.pd->uses.put();
	}
	if (mr.dm)
		mr.dm->uses.put();
	delete &mr;
	return 0;
}

namespace {

/* One SGE of a prefetch: its pages faulted in now (madvise), as
 * pagefault_mr() faults them: outside the MR or not mapped is EFAULT, a
 * write prefetch of pages that cannot be written EPERM. NO_FAULT only
 * takes what is present: nothing to do here. */
int prefetch(const KeyRef &ref, enum ibv_advise_mr_advice advice, const struct ibv_sge &s)
{
	if (!ref.permits(s.addr, s.length, 0))
		return EFAULT;
	if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT || !s.length)
		return 0;
	const uint64_t page = page_size();
	const uint64_t at = ref.address_of(s.addr);
	const uint64_t start = at & ~(page - 1);
	const uint64_t end = (at + s.length + page - 1) & ~(page - 1);
	void *range = reinterpret_cast<void *>(start);
	const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	if (madvise(range, end - start, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
		return 0;
	/* A hole or a page that cannot be read: EFAULT; one that can be read
	 * but not written, for a write prefetch: EPERM (hmm_vma_fault). */
	return write && madvise(range, end - start, MADV_POPULATE_READ) == 0 ? EPERM : EFAULT;
}

} // namespace

int advise_mr(Context &ctx, Pd &pd, enum ibv_advise_mr_advice advice, uint32_t flags,
	      const struct ibv_sge *sg_list, uint32_t num_sge)
{
	if (!odp_supported(*ctx.device))
		return EOPNOTSUPP; /* mlx5_ib installs no advise_mr without ODP */
	/* libibverbs: the list must fit one attribute (64 KiB). */
	if (num_sge > 4095)
		return EINVAL;
	if (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH) || num_sge == 0)
		return EINVAL;
	if (!sg_list)
		return EFAULT;
	if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return EOPNOTSUPP;
	const KeyTable &keys = KeyTable::of(*ctx.device);
	/* get_prefetchable_mr(): an ODP MR of this PD, writable for a write
	 * prefetch, as ib_access_writable() counts it: local write or
	 * MW_BIND (remote write and atomics need local write). */
	auto check = [&](const KeyRef &ref) {
		if (!ref || ref->kind != KeyKind::Mr || !is_odp(ref->access))
			return ENOENT;
		if (ref->pdn != pd.pdn)
			return EPERM;
		if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
		    !(ref->access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND)))
			return EPERM;
		return 0;
	};
	const std::span<const struct ibv_sge> sges(sg_list, num_sge);
	if (flags & IBV_ADVISE_MR_FLAG_FLUSH) {
		/* Synchronous: SGE by SGE, the first error ends it. */
		for (const struct ibv_sge &s : sges) {
			KeyRef ref = keys.acquire(s.lkey);
			if (int err = check(ref))
				return err;
			if (int err = prefetch(ref, advice, s))
				return err;
		}
		return 0;
	}
	/* Asynchronous on mlx5: the keys are checked now, the faults are
	 * the work item's, whose errors nobody sees. */
	for (const struct ibv_sge &s : sges)
		if (int err = check(keys.acquire(s.lkey)))
			return err;
	for (const struct ibv_sge &s : sges)
		if (KeyRef ref = keys.acquire(s.lkey))
			(void)prefetch(ref, advice, s);
	return 0;
}

Result<Mr> alloc_null_mr(Context &ctx, Pd &pd)
{
	auto *mr = new (std::nothrow) Mr{};
	if (!mr)
		return Err{ENOMEM};
	KeyTable &keys = KeyTable::of(*ctx.device);
	mr->type = MrType::Null;
	mr->pd = &pd;
	mr->access = IBV_ACCESS_LOCAL_WRITE;
	mr->length = SIZE_MAX;
	mr->keys = &keys;
	mr->ibv.context = ctx.abi();
	mr->ibv.lkey = keys.null_key();
	mr->ibv.addr = nullptr;
	mr->ibv.length = SIZE_MAX;
	return mr;
}

} // namespace shmverbs
