/* SPDX-License-Identifier: MIT */
/*
 * Address handles, and building their attributes from a received completion
 * (ibv_init_ah_from_wc).
 *
 * What libmlx5 checks depends on the link layer. On InfiniBand it builds the
 * address vector in user space without asking the kernel: only the port
 * number (and a GRH where the port requires one) is checked, nothing pins the
 * PD, and the SGID index, DLID and static rate are taken as given (a bad one
 * fails later, on the wire). On Ethernet (RoCE) the AH is also a kernel
 * object: a GRH is mandatory (EINVAL), the SGID index must name a valid GID
 * (ENODATA) and the AH holds a use on its PD.
 */
#pragma once

#include "context.h"
#include "pd.h"
#include "result.h"

#include <infiniband/verbs.h>

#include <cstdint>

namespace shmverbs {

struct Ah {
	struct ibv_ah ibv; /* first: ibv_ah* <-> Ah* */
	/* Holds a use where the AH is a kernel object (Ethernet); else nullptr. */
	Pd *pd;
	/* The address as given; the data path routes by dlid (IB) or dgid. */
	struct ibv_ah_attr attr;
	bool is_eth;
	bool roce_v2;       /* the SGID is a RoCE v2 GID */
	uint16_t udp_sport; /* RoCE v2: from the flow label, else random (as libmlx5) */

	struct ibv_ah *abi() { return &ibv; }
	static Ah *from(struct ibv_ah *ah) { return reinterpret_cast<Ah *>(ah); }
};

/* pd is the protection domain proper (Pd::from). Fills ibv.context and
 * ibv.handle; the caller sets ibv.pd to the application's pointer. */
Result<Ah> create_ah(Context &ctx, Pd &pd, const struct ibv_ah_attr &attr);
int destroy_ah(Ah &ah);

/* ibv_init_ah_from_wc(): 0, or an errno (EINVAL: GID not in the table, bad
 * port, multicast destination; EPROTONOSUPPORT: neither IPv6/IB nor IPv4
 * header). Like libibverbs, it clears and fills `out` as it goes, so a
 * failure leaves the generic fields set. grh may be nullptr only without
 * IBV_WC_GRH. */
int init_ah_from_wc(Context &ctx, uint8_t port_num, const struct ibv_wc &wc,
		    const struct ibv_grh *grh, struct ibv_ah_attr &out);

/* ibv_find_gid_index() of libibverbs: the first index whose GID and sysfs
 * type (RoCE v2, or IB/RoCE v1) match, scanning as ibv_query_gid does (an
 * empty entry reads as the zero GID of type v1). EINVAL when none does. */
int find_gid_index(Context &ctx, uint8_t port_num, const union ibv_gid &gid, bool roce_v2,
		   int &index);

} // namespace shmverbs
