/* SPDX-License-Identifier: MIT */
/*
 * Memory regions, memory windows and the per-device key table.
 *
 * Keys. As with mlx5's mkeys, an lkey/rkey is `index << 8 | variant`: the
 * index names a slot of the device's KeyTable, the low byte is bumped each
 * time the slot is (re)published, so a stale key (a deregistered MR, an MR
 * whose translation changed, a rebound type 1 window) never reaches the
 * slot's new contents. MRs and MWs share one key space, so every lkey/rkey is
 * unique on its device; an MR's lkey and rkey are equal, as on mlx5.
 *
 * The data path (next issue) resolves a key on every operation:
 *
 *   KeyRef ref = KeyTable::of(dev).acquire(wr_key);
 *   if (!ref || ref->pdn != qp_pdn || !ref.permits(iova, len, IBV_ACCESS_REMOTE_WRITE))
 *           -> IBV_WC_REM_ACCESS_ERR / IBV_WC_LOC_PROT_ERR
 *   memcpy(reinterpret_cast<void *>(ref.address_of(iova)), ...);
 *   // ref released at scope exit
 *
 * acquire() is lock-free (two atomic operations on the slot). A KeyRef pins
 * the slot's contents: ibv_dereg_mr() and ibv_rereg_mr() withdraw the key
 * first and then wait until no KeyRef on it remains, so when they return no
 * operation can still touch the memory (DESIGN-NOTES section 3).
 *
 * Slots hold fixed-width fields only (no pointers), so the table can later
 * move into memory shared between the processes that open a device, where
 * the broker hands out indices; the owner's pid is recorded for the
 * process_vm_readv/writev fallback.
 */
#pragma once

#include "context.h"
#include "holders.h"
#include "pd.h"
#include "result.h"

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace shmverbs {

struct Device;

enum class KeyKind : uint8_t {
	Unused,
	Mr,     /* a registered region */
	NullMr, /* ibv_alloc_null_mr(): local writes are discarded, nothing is read */
	Mw,     /* a bound memory window (lib/mw.h): remote access only */
};

constexpr uint32_t key_index(uint32_t key) { return key >> 8; }
constexpr uint8_t key_variant(uint32_t key) { return static_cast<uint8_t>(key); }
constexpr uint32_t make_key(uint32_t index, uint8_t variant) { return index << 8 | variant; }

/* What a key grants. */
/* How initiators in other processes reach the memory a key names (the
 * target's choice, per MR; see lib/remote_memory.h). */
enum class MemPath : uint8_t {
	Cma = 0,    /* process_vm_readv/writev by owner_pid; atomics under an OFD lock */
	Shared = 1, /* memshare: the pages are a shared file, offset == VA (lib/memshare) */
	Bounce = 2, /* bounce slots served by the owner's helper thread (lib/bounce.h) */
};

struct KeyEntry {
	KeyKind kind;
	MemPath path;        /* chosen at registration (lib/mr_memory.h) */
	uint32_t access;     /* IBV_ACCESS_* as registered (local read is implied) */
	uint32_t pdn;        /* protection domain proper (never a parent domain) */
	uint32_t parent_key; /* MW: the key of the MR it is bound to, else 0 */
	int32_t owner_pid;   /* process whose address space addr refers to */
	/* A type 2 MW: the QP it was bound on, the only one whose requests
	 * may use the key (mlx5's qpn_mkey); else 0. */
	uint32_t bound_qpn;
	uint64_t iova;       /* first address of the range, in the key's address space */
	uint64_t length;
	uint64_t addr;       /* owner's virtual address of iova */
};

/*
 * Holds of other processes are attributed (lib/holders.h): an initiator
 * counts itself into an entry with its pid before it checks the key, so
 * when the owner withdraws a key and a holder dies before releasing it,
 * unpublish() sees whose hold it was, finds that process gone and clears
 * the entry: a dead peer never makes ibv_dereg_mr wait. Holds beyond the
 * entries (more processes on one key at once) go to `anonymous`, which
 * unpublish() waits for with a bound, as destroy_qp does for in-flight
 * senders.
 */
struct KeySlot {
	/* The live key, or 0 while the slot is not published (index 0 is never
	 * handed out, so 0 never names a live key). */
	std::atomic<uint32_t> key{0};
	/* KeyRefs currently held on this slot by threads of the owner. */
	std::atomic<uint32_t> readers{0};
	uint8_t variant = 0; /* of the last key published here; guarded by the table lock */
	KeyEntry entry{};    /* written only while unpublished and unread */
	/* KeyRefs held by other processes (acquire_remote()), by pid. */
	HolderEntries holders{};
	std::atomic<uint32_t> anonymous{0};
};

class KeyRef;
/* This process's pid, which every remote key hold and every claimed CQ slot
 * carries, cached (getpid() is a system call, glibc keeps no cache);
 * cleared in a forked child (fork_child::key_tables). */
extern std::atomic<uint32_t> own_pid_cache;
uint32_t own_pid_slow();
inline uint32_t own_pid()
{
	const uint32_t p = own_pid_cache.load(std::memory_order_relaxed);
	return p ? p : own_pid_slow();
}
/* Called by KeyTable::unpublish() once the key is withdrawn and before it
 * waits for the holds to end: whoever keeps holds between operations (the
 * data path's local key cache) lets go of `slot`'s here. */
extern void (*key_withdrawn_hook)(const KeySlot &slot);

/* A key of another process's table (a slot in its segment): held like
 * KeyTable::acquire(), and attributed to this process (see KeySlot), so
 * that the owner's dereg_mr is not held up if we die meanwhile. */
KeyRef acquire_remote_key(KeySlot &slot, uint32_t key);

/* The lkey of the null MR (ibv_alloc_null_mr()) in every key table: a
 * receive SGE that names it in any process drops its bytes, without a look
 * at that process's table (KeyTable: index 2, variant 0). */
constexpr uint32_t null_mr_key = make_key(2, 0);

/* A held key: the entry stays as it is until the KeyRef is released. */
class KeyRef {
public:
	KeyRef() = default;
	explicit KeyRef(KeySlot *slot) : slot_(slot) {}
	/* `holder`: which count of the slot this hold is in (below). */
	KeyRef(KeySlot *slot, int8_t holder) : slot_(slot), holder_(holder) {}
	KeyRef(KeyRef &&other) noexcept : slot_(other.slot_), holder_(other.holder_)
	{
		other.slot_ = nullptr;
	}
	KeyRef &operator=(KeyRef &&other) noexcept;
	KeyRef(const KeyRef &) = delete;
	KeyRef &operator=(const KeyRef &) = delete;
	~KeyRef() { release(); }

	explicit operator bool() const { return slot_ != nullptr; }
	const KeyEntry &operator*() const { return slot_->entry; }
	const KeyEntry *operator->() const { return &slot_->entry; }

	/* [iova, iova + length) lies inside the entry's range and the entry
	 * grants every bit of `access` (0 asks for local read only). A null MR
	 * permits any local range. */
	bool permits(uint64_t iova, uint64_t length, uint32_t access) const
	{
		const KeyEntry &e = slot_->entry;
		if (e.kind == KeyKind::NullMr)
			return (access & ~uint32_t(IBV_ACCESS_LOCAL_WRITE)) == 0;
		if ((e.access & access) != access || iova < e.iova)
			return false;
		const uint64_t offset = iova - e.iova;
		return offset <= e.length && length <= e.length - offset;
	}
	/* The owner's virtual address of iova; meaningful where permits() held. */
	uint64_t address_of(uint64_t iova) const { return slot_->entry.addr + (iova - slot_->entry.iova); }

	void release()
	{
		if (slot_) /* inline: most KeyRefs that go hold nothing */
			count_out();
	}
	/* Lets go of the slot without counting out: the hold was another
	 * process's (a KeyRef inherited by a forked child). */
	void forget() { slot_ = nullptr; }
	/* Whether the held slot still publishes `key` (not withdrawn). */
	[[gnu::always_inline]] bool names(uint32_t key) const
	{
		return slot_ && slot_->key.load(std::memory_order_relaxed) == key;
	}
	const KeySlot *slot() const { return slot_; }
	/* Withdraws the held slot's key if it is still `key`: a memory
	 * window's remote invalidation (SEND_WITH_INV). Its owner drains the
	 * holds before it reuses the slot (lib/mw.h). */
	bool withdraw(uint32_t key)
	{
		return slot_->key.compare_exchange_strong(key, 0, std::memory_order_seq_cst);
	}

	/* The count a hold is in: the owner's readers, a holder entry
	 * (0..holder_entries-1) or the anonymous count. */
	static constexpr int8_t holder_local = -1;
	static constexpr int8_t holder_anonymous = int8_t(holder_entries);

private:
	void count_out();

	KeySlot *slot_ = nullptr;
	int8_t holder_ = holder_local;
};

/*
 * The keys of one device. Index allocation and publication take a mutex
 * (control path); acquire() is lock-free. Slots live in chunks that are
 * allocated on first use and never freed, so a reader can never touch freed
 * memory, whatever it races with.
 */
class KeyTable {
public:
	static constexpr uint32_t index_space_max = 1u << 24;

	/* max_mr: the device limit (ENOMEM beyond it); index_space: number of
	 * slot indices, reserved ones included (tests shrink it). */
	explicit KeyTable(uint32_t max_mr, uint32_t index_space = index_space_max);
	/* A device's table: its slot chunks live in the process's shared
	 * segment of that device (lib/segment.h), where peers read them. */
	KeyTable(uint32_t max_mr, uint32_t index_space, int shared_device);
	~KeyTable();
	KeyTable(const KeyTable &) = delete;
	KeyTable &operator=(const KeyTable &) = delete;

	/* The table of an emulated device; created on first use, never freed. */
	static KeyTable &of(const Device &dev);

	/* Takes a free slot for an MR (or a memory window: `window`): 0 and
	 * its index, or ENOMEM when the device limit (max_mr, max_mw) or the
	 * index space is exhausted. */
	int reserve(uint32_t &index, bool window = false);
	/* Publishes an entry in a reserved, unpublished slot under the key
	 * make_key(index, variant) and returns that key. */
	uint32_t publish(uint32_t index, const KeyEntry &entry, uint8_t variant);
	/* Withdraws the slot's key and returns once no KeyRef on it remains,
	 * except holds of processes that died holding it (released here) and,
	 * after 2 s, unattributed remote holds (logged). */
	void unpublish(uint32_t index);
	/* A withdrawal's wait for unattributed holds, across tries. */
	struct Wait {
		/* The first try that found holds, and the last (the epoch
		 * before any). A try long after the last one starts the wait
		 * anew: the WR that waited was flushed meanwhile (its QP reset
		 * or destroyed), and its clock must not shorten the next
		 * one's. */
		std::chrono::steady_clock::time_point since{}, last{};
		/* The fewest unattributed holds any try saw: what a give-up
		 * writes off, never a hold counted only for a moment (an
		 * acquire that found the key withdrawn). */
		uint32_t fewest = UINT32_MAX;
	};
	/* The same without waiting, for a send queue (lib/mw.h), which must
	 * not wait for holders under its lock: withdraws the key; true once
	 * no hold of it remains (dead processes' are released), or once only
	 * unattributed remote holds remain 2 s after the first try. `wait`
	 * lives from the first try to the one that returns true. */
	bool try_unpublish(uint32_t index, Wait &wait);
	/* Gives an unpublished slot back. Indices are reused only after a
	 * delay, and with another variant, so stale keys keep failing. */
	void release(uint32_t index, bool window = false);
	/* The window limit (the profile's max_mw; 0 until set). */
	void set_max_mw(uint32_t max_mw);

	/* The variant of the key last published in a slot. */
	uint8_t variant(uint32_t index) const;
	/* The slot's live key, 0 when none is published. */
	uint32_t live_key(uint32_t index) const;
	/* The entry of a live key, or an empty KeyRef. Lock-free. */
	KeyRef acquire(uint32_t key) const;

	/* The lkey of every null MR of the device (mlx5's dump-and-fill mkey). */
	uint32_t null_key() const { return null_key_; }

	uint32_t mr_count() const;

private:
	static constexpr uint32_t chunk_bits = 12;
	static constexpr uint32_t chunk_size = 1u << chunk_bits;
	/* Index 0 never names a live key; index 1 would give key 0x100, mlx5's
	 * MLX5_INVALID_LKEY; index 2 is the null MR's. */
	static constexpr uint32_t null_index = 2;
	static constexpr uint32_t first_index = 3;
	/* Freed indices wait in a FIFO until this many others are freed. */
	static constexpr size_t reuse_delay = 256;

	KeySlot *slot(uint32_t index) const;
	KeySlot &slot_alloc(uint32_t index); /* under lock_ */
	/* The slot's unattributed remote holds that no earlier withdrawal
	 * gave up on (the fewest seen is noted in `wait`). A count given up
	 * on is not waited for again until a withdrawal sees it lower (those
	 * holds were alive after all, and let go). */
	uint32_t unattributed_holds(const KeySlot &s, uint32_t index, Wait &wait);
	/* The withdrawal stops waiting: the fewest holds it saw are given up
	 * on. */
	void give_up_holds(uint32_t index, const Wait &wait);

	const uint32_t max_mr_, index_space_;
	const int shared_device_ = -1; /* >= 0: chunks in that device's segment */
	std::unique_ptr<std::atomic<KeySlot *>[]> chunks_;
	mutable std::mutex lock_;
	uint32_t next_fresh_ = first_index;
	std::deque<uint32_t> recycled_;
	uint32_t mr_count_ = 0;
	uint32_t max_mw_ = 0, mw_count_ = 0; /* under lock_ */
	uint32_t null_key_ = 0;
	/* Per slot, the unattributed holds a withdrawal stopped waiting for
	 * after 2 s (most likely of dead processes, whose counts stay): later
	 * withdrawals of the slot do not wait for them again. Under lock_. */
	std::unordered_map<uint32_t, uint32_t> abandoned_;
	std::atomic<bool> any_abandoned_{false}; /* !abandoned_.empty() */
};

/* ---- Memory regions ---- */

enum class MrType : uint8_t {
	User, /* ibv_reg_mr and friends */
	Null, /* ibv_alloc_null_mr */
	Dm,   /* ibv_reg_dm_mr: zero-based, over a DM (lib/dm.h) */
};

struct Dm;

struct Mr {
	struct ibv_mr ibv; /* first: ibv_mr* <-> Mr* */
	MrType type;
	/* The protection domain proper; a user MR holds a use on it. A null MR
	 * holds none: in libmlx5 it is no kernel object. */
	Pd *pd;
	uint32_t access;
	/* The registered range: our own copy, since ibv.addr/ibv.length are the
	 * application's to read (and, carelessly, to write). */
	uint64_t addr;
	uint64_t length;
	uint64_t iova;
	uint32_t index; /* key-table slot (user MRs) */
	KeyTable *keys;
	/* How peers reach the range (lib/mr_memory.h); undone at dereg. */
	MemPath path;
	Dm *dm; /* a DM MR's, which holds a use on it */

	struct ibv_mr *abi() { return &ibv; }
	static Mr *from(struct ibv_mr *mr) { return reinterpret_cast<Mr *>(mr); }
};

/*
 * On-demand paging. An ODP MR is never switched to the memory file: its
 * pages follow the process's mappings at the time of each access, as on a
 * NIC that faults them in. Peers reach it by address (CMA, or the bounce
 * helper where CMA is blocked), never through a window; its owner's own
 * accesses (its local SGEs, a loopback target) are copies the kernel makes
 * (memshare::copy_checked), so a page that is not mapped is an error
 * completion, never a SIGSEGV. The device offers it (the profile's
 * odp_caps) only where such a copy works in this process.
 */
inline bool is_odp(uint32_t access) { return access & IBV_ACCESS_ON_DEMAND; }
/* ibv_query_device_ex's odp_caps and xrc_odp_caps for `dev`. */
struct ibv_odp_caps odp_caps(const Device &dev, uint32_t &xrc);
bool odp_supported(const Device &dev);

/* The kernel's access check (ib_check_mr_access, Linux 6.x): remote write or
 * remote atomic without local write, or a bit outside the known and optional
 * ranges: EINVAL; on-demand paging on a device without it: EOPNOTSUPP. */
int check_mr_access(uint32_t access, bool odp);

/* ibv_advise_mr() (mlx5_ib's checks, in its order): flags other than FLUSH,
 * no SGE or more than 4095: EINVAL; advice other than the three prefetches:
 * EOPNOTSUPP; an lkey that is not an ODP MR of this device: ENOENT; of
 * another PD, or a write prefetch of an MR without local write: EPERM. With
 * FLUSH the pages are faulted in now (madvise MADV_POPULATE_READ/WRITE): a
 * range outside the MR or not mapped is EFAULT (PREFETCH_NO_FAULT skips
 * what is not mapped); without it, the same is done and its errors are
 * dropped, as mlx5's work item drops them. */
int advise_mr(Context &ctx, Pd &pd, enum ibv_advise_mr_advice advice, uint32_t flags,
	      const struct ibv_sge *sg_list, uint32_t num_sge);

/* ibv_reg_mr_iova2() behind libibverbs: the checks of libibverbs, uverbs and
 * ib_umem_get in their order (ODP whole-address-space form, iova page offset,
 * access, overflow, zero length, unmapped memory -> EFAULT, device limit ->
 * ENOMEM). Fills the ABI struct except pd/addr/length, which the caller sets
 * as libibverbs does. */
Result<Mr> reg_mr(Context &ctx, Pd &pd, void *addr, size_t length, uint64_t iova,
		  uint32_t access);

/* The uverbs part of ibv_rereg_mr(): flags (0 or unknown: EINVAL), new
 * translation (iova = addr, as libmlx5 passes it), new access, new PD
 * (nullptr with IBV_REREG_MR_CHANGE_PD: EINVAL). A new translation gives the
 * MR new keys; a PD or access change keeps them (as mlx5's in-place UMR
 * update does). On failure the MR is left as it was. */
int rereg_mr(Mr &mr, int flags, Pd *new_pd, void *addr, size_t length, uint32_t access);

/* ibv_reg_dm_mr() behind libibverbs (libmlx5's, uverbs' and mlx5_ib's
 * checks): an access bit other than local write, the remote ones and
 * ZERO_BASED, or no ZERO_BASED, EINVAL; remote write or atomic without
 * local write EINVAL; [offset, offset + length) past the DM EINVAL. The MR
 * is zero-based (iova 0 is the DM's byte `offset`), may be empty, and
 * holds a use on the DM (ibv_free_dm is EBUSY meanwhile). */
Result<Mr> reg_dm_mr(Context &ctx, Pd &pd, Dm &dm, uint64_t offset, size_t length,
		     uint32_t access);

/* Returns once no operation can still use the MR's key. */
int dereg_mr(Mr &mr);

/* A null MR: lkey is the device's discard key, length SIZE_MAX, addr NULL. */
Result<Mr> alloc_null_mr(Context &ctx, Pd &pd);

} // namespace shmverbs
