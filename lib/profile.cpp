/* SPDX-License-Identifier: MIT */
#include "profile.h"

#include <algorithm>
#include <cstring>

namespace shmverbs {

namespace {

uint32_t roundup_pow2(uint32_t v)
{
	if (v <= 1)
		return 1;
	return 1u << (32 - __builtin_clz(v - 1));
}

/* Device capability flags every profile claims: only what the emulation does
 * implement (no memory windows type 2, no UD IP checksum, no ODP). */
constexpr unsigned common_cap_flags =
	IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_CHANGE_PHY_PORT |
	IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
	IBV_DEVICE_XRC | IBV_DEVICE_N_NOTIFY_CQ;

struct ibv_port_attr base_port_attr(LinkLayer ll)
{
	struct ibv_port_attr p{};
	p.state = IBV_PORT_ACTIVE;
	p.max_mtu = IBV_MTU_4096;
	p.active_mtu = IBV_MTU_4096;
	p.max_msg_sz = 1u << 30;
	p.max_vl_num = 4;
	p.subnet_timeout = 18;
	p.active_width = 2; /* 4X */
	p.active_speed = 32; /* EDR: 25 Gb/s per lane, 100 Gb/s at 4X */
	p.phys_state = 5; /* LinkUp */
	p.link_layer = ll == LinkLayer::InfiniBand ? IBV_LINK_LAYER_INFINIBAND
						   : IBV_LINK_LAYER_ETHERNET;
	return p;
}

/*
 * mlx5: a ConnectX-5 (MT4119) under rdma-core 44's libmlx5.
 */
class Mlx5Profile final : public Profile {
public:
	const char *name() const override { return "mlx5"; }
	const char *fw_ver() const override { return "16.35.2000"; }

	struct ibv_device_attr device_attr() const override
	{
		struct ibv_device_attr a{};
		a.max_mr_size = ~0ull;
		a.page_size_cap = 0xfffffffffffff000ull;
		a.vendor_id = 0x02c9;
		a.vendor_part_id = 4119;
		a.hw_ver = 0;
		a.max_qp = 1 << 18;
		a.max_qp_wr = max_qp_wr;
		a.device_cap_flags = common_cap_flags;
		a.max_sge = 30;
		a.max_sge_rd = 30;
		a.max_cq = 1 << 24;
		a.max_cqe = max_cqe;
		a.max_mr = 1 << 24;
		a.max_pd = 1 << 24;
		a.max_qp_rd_atom = 16;
		a.max_res_rd_atom = 1 << 22;
		a.max_qp_init_rd_atom = 16;
		a.atomic_cap = IBV_ATOMIC_HCA;
		a.max_mw = 1 << 24;
		a.max_mcast_grp = 1 << 21;
		a.max_mcast_qp_attach = 240;
		a.max_total_mcast_qp_attach = 240 << 21;
		a.max_ah = 0x7fffffff;
		a.max_srq = 1 << 23;
		a.max_srq_wr = 32767;
		a.max_srq_sge = 31;
		a.max_pkeys = 128;
		a.local_ca_ack_delay = 16;
		return a;
	}

	struct ibv_port_attr port_attr(LinkLayer ll) const override
	{
		struct ibv_port_attr p = base_port_attr(ll);
		if (ll == LinkLayer::InfiniBand) {
			p.gid_tbl_len = 128;
			p.port_cap_flags = 0x2651e848;
		} else {
			p.gid_tbl_len = 256;
			p.port_cap_flags = 0x04010000;
		}
		p.pkey_tbl_len = 128;
		return p;
	}

	int size_qp(const QpSizing &in, struct ibv_qp_cap &out) const override
	{
		out = in.cap;
		if (in.cap.max_send_wr > max_qp_wr || in.cap.max_recv_wr > max_qp_wr ||
		    in.cap.max_send_sge > 30 || in.cap.max_recv_sge > 30)
			return EINVAL;
		/* Send queue: see DESIGN-NOTES section 4 and mlx5_calc_sq_size(). */
		if (in.qp_type != IBV_QPT_XRC_RECV) {
			uint32_t overhead = sq_overhead(in);
			uint32_t sge_size = overhead + 16 * in.cap.max_send_sge;
			uint32_t inl_size = in.cap.max_inline_data
				? overhead + align(4 + in.cap.max_inline_data, 16) : 0;
			uint32_t wqe = std::max(sge_size, inl_size);
			if (wqe > max_sq_desc_sz)
				return EINVAL;
			wqe = align(wqe, 64);
			uint64_t bytes = roundup_pow2(std::max(in.cap.max_send_wr, 1u) * wqe);
			if (bytes / 64 > max_qp_wr)
				return EINVAL;
			out.max_send_wr = in.cap.max_send_wr ? static_cast<uint32_t>(bytes / wqe) : 0;
			out.max_inline_data = wqe - overhead - 4;
		} else {
			out.max_send_wr = out.max_send_sge = out.max_inline_data = 0;
		}
		/* Receive queue: power-of-two entries and sges, none with an SRQ. */
		if (in.has_srq || in.qp_type == IBV_QPT_XRC_SEND || in.qp_type == IBV_QPT_XRC_RECV) {
			out.max_recv_wr = out.max_recv_sge = 0;
		} else if (in.cap.max_recv_wr) {
			out.max_recv_wr = roundup_pow2(in.cap.max_recv_wr);
			out.max_recv_sge = roundup_pow2(std::max(in.cap.max_recv_sge, 1u));
		} else {
			out.max_recv_sge = 0;
		}
		return 0;
	}

	int size_cq(uint32_t cqe, uint32_t &out) const override
	{
		if (cqe < 1 || cqe > max_cqe)
			return EINVAL;
		out = roundup_pow2(cqe + 1) - 1;
		return 0;
	}

	int size_srq(uint32_t max_wr, uint32_t max_sge, uint32_t &wr_out,
		     uint32_t &sge_out) const override
	{
		if (max_wr > 32767 || max_sge > 31)
			return EINVAL;
		wr_out = roundup_pow2(max_wr + 1) - 1;
		uint32_t desc = roundup_pow2(std::max(32u, 16 + 16 * max_sge));
		sge_out = (desc - 16) / 16;
		return 0;
	}

private:
	static constexpr uint32_t max_qp_wr = 32768;
	static constexpr uint32_t max_cqe = 4194303;
	static constexpr uint32_t max_sq_desc_sz = 1024;

	static uint32_t align(uint32_t v, uint32_t a) { return (v + a - 1) & ~(a - 1); }

	static uint32_t sq_overhead(const QpSizing &in)
	{
		constexpr uint64_t mw_ops = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
		bool mw = in.send_ops_flags == 0 || (in.send_ops_flags & mw_ops);
		uint32_t base = mw ? 192 : 32;
		if (in.is_dci)
			return base + 48;
		switch (in.qp_type) {
		case IBV_QPT_UD:
			return 64;
		case IBV_QPT_XRC_SEND:
			return base + 16;
		default:
			return base;
		}
	}
};

/*
 * rxe: Soft-RoCE (rdma_rxe in Linux 6.1) under rdma-core 44's librxe.
 */
class RxeProfile final : public Profile {
public:
	const char *name() const override { return "rxe"; }
	const char *fw_ver() const override { return "0.0.0"; }

	struct ibv_device_attr device_attr() const override
	{
		struct ibv_device_attr a{};
		a.max_mr_size = ~0ull;
		a.page_size_cap = 0xfffff000;
		a.vendor_id = 0xffffff;
		a.vendor_part_id = 0;
		a.max_qp = 0x10000;
		a.max_qp_wr = max_qp_wr;
		a.device_cap_flags = common_cap_flags;
		a.max_sge = max_sge;
		a.max_sge_rd = 32;
		a.max_cq = 0x4000;
		a.max_cqe = max_cqe;
		a.max_mr = 0x40000;
		a.max_pd = 0x10000;
		a.max_qp_rd_atom = 128;
		a.max_res_rd_atom = 0x3f000;
		a.max_qp_init_rd_atom = 128;
		a.atomic_cap = IBV_ATOMIC_HCA;
		a.max_mw = 0x10000;
		a.max_mcast_grp = 8192;
		a.max_mcast_qp_attach = 56;
		a.max_total_mcast_qp_attach = 0x70000;
		a.max_ah = 0x8000;
		a.max_srq = 0x4000;
		a.max_srq_wr = max_srq_wr;
		a.max_srq_sge = 27;
		a.max_pkeys = 64;
		a.local_ca_ack_delay = 15;
		return a;
	}

	struct ibv_port_attr port_attr(LinkLayer ll) const override
	{
		struct ibv_port_attr p = base_port_attr(ll);
		p.gid_tbl_len = 1024;
		p.pkey_tbl_len = 64;
		p.port_cap_flags = 0x00010000;
		return p;
	}

	int size_qp(const QpSizing &in, struct ibv_qp_cap &out) const override
	{
		out = in.cap;
		if (in.cap.max_send_wr > max_qp_wr || in.cap.max_recv_wr > max_qp_wr ||
		    in.cap.max_send_sge > max_sge || in.cap.max_recv_sge > max_sge ||
		    in.cap.max_inline_data > max_inline)
			return EINVAL;
		uint32_t wqe = std::max(in.cap.max_send_sge * 16, in.cap.max_inline_data);
		out.max_send_sge = wqe / 16;
		out.max_inline_data = wqe;
		out.max_send_wr = roundup_pow2(in.cap.max_send_wr + 1) - 1;
		if (in.has_srq) {
			out.max_recv_wr = out.max_recv_sge = 0;
		} else {
			out.max_recv_wr = roundup_pow2(in.cap.max_recv_wr + 1) - 1;
		}
		return 0;
	}

	int size_cq(uint32_t cqe, uint32_t &out) const override
	{
		if (cqe < 1 || cqe > max_cqe)
			return EINVAL;
		out = roundup_pow2(cqe + 1) - 1;
		return 0;
	}

	int size_srq(uint32_t max_wr, uint32_t max_sge, uint32_t &wr_out,
		     uint32_t &sge_out) const override
	{
		if (max_wr > max_srq_wr || max_sge > 27)
			return EINVAL;
		wr_out = roundup_pow2(max_wr + 1) - 1;
		sge_out = max_sge;
		return 0;
	}

private:
	static constexpr uint32_t max_qp_wr = 0x4000;
	static constexpr uint32_t max_sge = 32;
	static constexpr uint32_t max_cqe = (1 << 15) - 1;
	static constexpr uint32_t max_srq_wr = 0x4000;
	static constexpr uint32_t max_inline = 400;
};

/*
 * exact: the mlx5 identity and limits, but every capacity is granted exactly
 * as requested, so tests can check sizes without knowing any rounding rule.
 */
class ExactProfile final : public Profile {
public:
	const char *name() const override { return "exact"; }
	const char *fw_ver() const override { return mlx5_.fw_ver(); }
	struct ibv_device_attr device_attr() const override { return mlx5_.device_attr(); }
	struct ibv_port_attr port_attr(LinkLayer ll) const override { return mlx5_.port_attr(ll); }

	int size_qp(const QpSizing &in, struct ibv_qp_cap &out) const override
	{
		struct ibv_device_attr a = device_attr();
		if (in.cap.max_send_wr > uint32_t(a.max_qp_wr) ||
		    in.cap.max_recv_wr > uint32_t(a.max_qp_wr) ||
		    in.cap.max_send_sge > uint32_t(a.max_sge) ||
		    in.cap.max_recv_sge > uint32_t(a.max_sge) || in.cap.max_inline_data > 1024)
			return EINVAL;
		out = in.cap;
		if (in.has_srq)
			out.max_recv_wr = out.max_recv_sge = 0;
		return 0;
	}

	int size_cq(uint32_t cqe, uint32_t &out) const override
	{
		if (cqe < 1 || cqe > uint32_t(device_attr().max_cqe))
			return EINVAL;
		out = cqe;
		return 0;
	}

	int size_srq(uint32_t max_wr, uint32_t max_sge, uint32_t &wr_out,
		     uint32_t &sge_out) const override
	{
		struct ibv_device_attr a = device_attr();
		if (max_wr > uint32_t(a.max_srq_wr) || max_sge > uint32_t(a.max_srq_sge))
			return EINVAL;
		wr_out = max_wr;
		sge_out = max_sge;
		return 0;
	}

private:
	Mlx5Profile mlx5_;
};

} // namespace

const Profile &Profile::get(ProfileKind kind)
{
	static const Mlx5Profile mlx5;
	static const RxeProfile rxe;
	static const ExactProfile exact;
	switch (kind) {
	case ProfileKind::Rxe:
		return rxe;
	case ProfileKind::Exact:
		return exact;
	case ProfileKind::Mlx5:
		break;
	}
	return mlx5;
}

} // namespace shmverbs
