/* SPDX-License-Identifier: MIT */
/*
 * Device memory (ibv_alloc_dm), as a ConnectX's MEMIC: a small pool of
 * memory on the device that the host reaches with ibv_memcpy_to_dm() and
 * ibv_memcpy_from_dm() and that ibv_reg_dm_mr() registers (zero-based) for
 * the data path. Here it is host memory: an anonymous mapping per DM,
 * which a DM MR shares with peers as any registered memory (lib/mr_memory.h).
 * The pool (max_dm_size, the profile's) is counted per device in whole
 * pages, as mlx5_ib counts MEMIC; unlike a device's it is per process.
 */
#pragma once

#include "context.h"
#include "pd.h"
#include "result.h"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace shmverbs {

struct Dm {
	struct ibv_dm ibv; /* first: ibv_dm* <-> Dm* */
	Context *ctx;
	char *mem;      /* the mapping, page-aligned */
	size_t mapped;  /* its bytes */
	uint64_t length; /* as requested: every bounds check uses it */
	uint32_t pages; /* of the pool */
	UseCount uses;  /* DM MRs on it */

	struct ibv_dm *abi() { return &ibv; }
	static Dm *from(struct ibv_dm *dm) { return reinterpret_cast<Dm *>(dm); }
};

/* ibv_alloc_dm() (libmlx5's and mlx5_ib's checks): comp_mask set or a length
 * over max_dm_size EINVAL, as is length 0 or an alignment over a page; an
 * exhausted pool ENOMEM; a device without device memory EOPNOTSUPP. */
Result<Dm> alloc_dm(Context &ctx, const struct ibv_alloc_dm_attr &attr);

/* ibv_free_dm(): EBUSY while a DM MR uses it. */
int free_dm(Dm &dm);

/* ibv_memcpy_to_dm() / ibv_memcpy_from_dm() (libmlx5): past the DM's
 * length EFAULT, then an offset or length that is not a multiple of 4
 * EINVAL; the error is the return value. */
int dm_copy_to(Dm &dm, uint64_t offset, const void *from, size_t length);
int dm_copy_from(void *to, Dm &dm, uint64_t offset, size_t length);

} // namespace shmverbs
