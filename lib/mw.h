/* SPDX-License-Identifier: MIT */
/*
 * Memory windows (the mlx5 profile: type 1 and type 2B, as a ConnectX-5).
 *
 * A window is a slot of the device's key table (lib/mr.h), reserved by
 * ibv_alloc_mw and counted against max_mw, whose key is published only
 * while the window is bound. The entry (KeyKind::Mw) names the bound range
 * of the MR: the MR's memory path and owner address, the window's own
 * remote access, its PD and, for type 2, the QP it was bound on, so an
 * initiator in any process checks a window's rkey as it checks an MR's,
 * plus that QP (HeldKey::bound_qpn). A window's key is never an lkey: the
 * local key cache refuses it and its entry grants no local write.
 *
 * Binding is a WR of the send queue (BIND_MW, and ibv_bind_mw for type 1,
 * which posts one as libmlx5 does), executed in order with the others;
 * what the HCA checks at execution fails it with IBV_WC_MW_BIND_ERR and
 * the QP enters ERR. LOCAL_INV of a window fails with IBV_WC_LOC_QP_OP_ERR
 * unless the key is a bound type 2 window of the QP's PD. A remote
 * SEND_WITH_INV withdraws the key at the responder (KeyRef::withdraw()).
 *
 * Rebinding, invalidating and deallocating end only once no operation
 * holds the old key, so that when they complete nothing reaches the memory
 * through it any more; so do ibv_dereg_mr and ibv_rereg_mr of the MR,
 * which first unbind every window bound to it (a device's windows die with
 * their MR's translation). A send queue never waits under its lock: a
 * bind or LOCAL_INV that finds the window's lock taken or the old key
 * still held (by another queue between its posts, say, whose holds the
 * progress thread's sweep lets go) waits at the head of the queue like an
 * RNR retry, and runs again (nullopt below). The queue lets go of its own
 * holds first.
 */
#pragma once

#include "mr.h"
#include "pd.h"
#include "result.h"

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

namespace shmverbs {

struct Device;

struct Mw {
	struct ibv_mw ibv; /* first: ibv_mw* <-> Mw* */
	Pd *pd;            /* the PD proper; holds a use on it */
	KeyTable *keys;
	uint32_t index;    /* key-table slot */
	/* Serialises binds, invalidations and the deallocation. Under it:
	 * the MR whose range the slot's last entry named while holds of it
	 * may remain (bound, or withdrawn by a peer's SEND_WITH_INV and not
	 * drained yet); nullptr once drained. */
	std::mutex lock;
	uint32_t bound_mr = 0; /* that MR's key-table slot; 0: none */
	uint32_t key = 0;      /* the key that binding was published under */
	/* A send queue's wait for the holds of the withdrawn key
	 * (KeyTable::try_unpublish()); reset once drained. */
	KeyTable::Wait drain_wait;

	struct ibv_mw *abi() { return &ibv; }
	static Mw *from(struct ibv_mw *mw) { return reinterpret_cast<Mw *>(mw); }
};

/* ibv_alloc_mw(): a type other than 1 or 2 EINVAL (uverbs); a device
 * without windows EOPNOTSUPP; max_mw reached ENOMEM. */
Result<Mw> alloc_mw(Context &ctx, Pd &pd, int type);
/* ibv_dealloc_mw(): unbinds (waiting for the holds) and frees the slot. */
int dealloc_mw(Mw &mw);

/* A BIND_MW WR as posted (ibv_send_wr::bind_mw), by value: the window
 * and the MR may be gone or changed by the time a queued bind executes
 * (an application's mistake, which must fail the bind, not crash it): the
 * window is looked up again by its slot, the MR by its key. */
struct MwBind {
	uint32_t device = 0;
	uint32_t mw_index = 0;  /* the window's slot (its rkey's index) */
	uint32_t mw_handle = 0; /* which window of that slot (slots are reused) */
	uint64_t addr = 0, length = 0;
	uint32_t access = 0;    /* mw_access_flags */
	uint32_t rkey = 0;      /* its low 8 bits: the new key's variant */
	/* The MR's key at post (0: none; the rest is read from its entry at
	 * execution) and its type, which never changes. */
	uint32_t mr_key = 0;
	MrType mr_type = MrType::User;
};
/* The MwBind of a bind of `mw` over `info` (both the application's, of
 * this context: checked by the caller). */
MwBind mw_bind_of(struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info &info);

/* The execution of a bind posted on QP `qpn` of PD `qp_pdn`: SUCCESS, or
 * MW_BIND_ERR (the window of another PD; an MR that is not a user MR of
 * the window's PD registered with IBV_ACCESS_MW_BIND; a range outside the
 * MR; remote write or atomic access over an MR without local write; a
 * type 2 window still bound); nullopt: not now (above). A length of 0
 * unbinds. */
std::optional<enum ibv_wc_status> bind_mw(const MwBind &b, uint32_t qp_pdn, uint32_t qpn);
/* LOCAL_INV of `rkey` by a QP of PD `qp_pdn` of device `dev`: SUCCESS, or
 * LOC_QP_OP_ERR when it does not name a bound type 2 window of that PD;
 * nullopt: not now. */
std::optional<enum ibv_wc_status> local_invalidate(const Device &dev, uint32_t rkey,
						   uint32_t qp_pdn);
/* Before an MR's translation goes (dereg, rereg), after its key was
 * withdrawn: every window bound to it is unbound, its holds drained. (A
 * bind checks the MR's key under the window's lock: it either fails or
 * is found here.) */
void unbind_windows_of(const Mr &mr);

} // namespace shmverbs
