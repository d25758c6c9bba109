/* SPDX-License-Identifier: MIT */
/*
 * A device profile decides what an emulated device claims to be: its identity
 * (vendor, part id, firmware), its limits, and how it rounds the capacities an
 * application asks for. The rounding is observable through the verbs (a QP's
 * returned cap, a CQ's cqe), so each profile reproduces a real provider:
 *
 *   mlx5   libmlx5 of rdma-core 44 on a ConnectX-5 (the default)
 *   rxe    Soft-RoCE: every queue 2^k - 1
 *   exact  returns exactly what was asked for (still checks the limits)
 */
#pragma once

#include "config.h"

#include <infiniband/verbs.h>

#include <cstdint>

namespace shmverbs {

/* What a QP asks for; the profile answers with the capacities it grants. */
struct QpSizing {
	enum ibv_qp_type qp_type;
	struct ibv_qp_cap cap;
	bool has_srq;
	/* IBV_QP_EX_WITH_* bits when the application passed
	 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (0 is then a real request for no
	 * operation); without them the provider's default set for the type. */
	bool send_ops_given;
	uint64_t send_ops_flags;
	uint64_t mlx5_send_ops; /* MLX5DV_QP_EX_WITH_* of mlx5dv_create_qp */
	bool is_dci;            /* mlx5dv DC initiator */
};

/* The capacities a QP is granted, as two views that real providers report
 * differently: what create writes back into the caller's cap, and what
 * ibv_query_qp() reports afterwards (libmlx5, for one, reports no send
 * capacity for a QP created without a send queue). */
struct QpCaps {
	struct ibv_qp_cap created;
	struct ibv_qp_cap queried;
	/* The bytes of the work queue buffer libmlx5 allocates for these
	 * queues (SQ and RQ), 0 under the other profiles: what it would put
	 * on huge pages (lib/huge_pages.h). */
	uint64_t mlx5_buffer_bytes;
};

class Profile {
public:
	virtual ~Profile() = default;

	virtual const char *name() const = 0;

	/* Identity and limits. GUIDs and the port count are filled by Device. */
	virtual struct ibv_device_attr device_attr() const = 0;
	/* A port's static attributes for the given link layer (lid, state and
	 * GUID-derived values are filled by Device). */
	virtual struct ibv_port_attr port_attr(LinkLayer ll) const = 0;
	virtual const char *fw_ver() const = 0;

	/* Capacity rounding. Each returns 0 and fills the granted values, or
	 * EINVAL when the request exceeds what the device supports. */
	virtual int size_qp(const QpSizing &in, QpCaps &out) const = 0;
	virtual int size_cq(uint32_t cqe, uint32_t &out) const = 0;
	virtual int size_srq(uint32_t max_wr, uint32_t max_sge, uint32_t &wr_out,
			     uint32_t &sge_out) const = 0;

	/* The remote access a QP with attributes `a` grants as a responder:
	 * its flags' by default. */
	virtual uint32_t responder_access(const struct ibv_qp_attr &a) const
	{
		return a.qp_access_flags;
	}
	/* What ibv_query_qp() reports of the attributes the application set,
	 * as the driver reads them back from the device: as set by default. */
	virtual void read_back(struct ibv_qp_attr &) const {}
	/* Whether a QP may enter SQD (RTS -> SQD, SQD -> SQD). */
	virtual bool drains_sq() const { return true; }
	/* The path fields of a modify as the device takes them (timeout,
	 * retry counts, RNR timer): as given by default, nothing refused. */
	virtual void fit_path_fields(struct ibv_qp_attr &) const {}

	/* On-demand paging as the device reports it (ibv_query_device_ex
	 * odp_caps and xrc_odp_caps); none by default. What the host allows
	 * is decided by odp_caps() in lib/mr.h. */
	virtual struct ibv_odp_caps odp_caps(uint32_t &xrc) const
	{
		xrc = 0;
		return {};
	}
	/* Device memory (ibv_alloc_dm, lib/dm.h) the device has; none by
	 * default. */
	virtual uint64_t max_dm_size() const { return 0; }

	static const Profile &get(ProfileKind kind);
	/* Whether this is the profile of `kind`, for the few differences of
	 * rxe not (yet) expressed as a hook above. */
	bool is(ProfileKind kind) const { return this == &get(kind); }
};

} // namespace shmverbs
