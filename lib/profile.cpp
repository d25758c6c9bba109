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

uint64_t roundup_pow2_64(uint64_t v)
{
	if (v <= 1)
		return 1;
	return uint64_t(1) << (64 - __builtin_clzll(v - 1));
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

bool is_xrc(enum ibv_qp_type t) { return t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV; }

/* Receive capacities of a QP without a receive queue of its own. */
void clear_recv(struct ibv_qp_cap &c)
{
	c.max_recv_wr = 0;
	c.max_recv_sge = 0;
}

/* Device capability flags every profile claims: only what the emulation does
 * implement (no UD IP checksum, automatic path migration or flow steering;
 * memory windows: the mlx5 profile's own; ODP: odp_caps()). MEM_MGT_EXTENSIONS:
 * SEND_WITH_INV and LOCAL_INV, which mlx5 and rxe set (an application such
 * as SPDK sends with invalidate only where it is set); N_NOTIFY_CQ neither
 * sets. */
constexpr unsigned common_cap_flags =
	IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_CHANGE_PHY_PORT |
	IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
	IBV_DEVICE_XRC | IBV_DEVICE_MEM_MGT_EXTENSIONS;

struct ibv_port_attr base_port_attr(LinkLayer ll)
{
	struct ibv_port_attr p{};
	p.state = IBV_PORT_ACTIVE;
	p.max_mtu = IBV_MTU_4096;
	p.active_mtu = IBV_MTU_4096;
	p.max_msg_sz = 1u << 30;
	if (ll == LinkLayer::InfiniBand) { /* mlx5_query_port_roce() sets neither */
		p.max_vl_num = 4;
		p.subnet_timeout = 18;
	}
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

	/* mlx5_ib (to_mlx5_access_flags): the QP context holds the remote
	 * bits, and without responder resources for RDMA READ and atomics
	 * (max_dest_rd_atomic 0) remote write at most. */
	uint32_t responder_access(const struct ibv_qp_attr &a) const override
	{
		const uint32_t remote = a.qp_access_flags & (IBV_ACCESS_REMOTE_WRITE |
							     IBV_ACCESS_REMOTE_READ |
							     IBV_ACCESS_REMOTE_ATOMIC);
		return a.max_dest_rd_atomic ? remote : remote & IBV_ACCESS_REMOTE_WRITE;
	}
	/* mlx5_ib's query_qp_attr(): those bits, and the READ/atomic depths
	 * as the context keeps them, log2 rounded down (a 0 is not written:
	 * it reads as 1). */
	void read_back(struct ibv_qp_attr &a) const override
	{
		auto depth = [](uint8_t v) { return uint8_t(v ? 1u << (31 - __builtin_clz(v)) : 1); };
		a.qp_access_flags = responder_access(a);
		a.max_rd_atomic = depth(a.max_rd_atomic);
		a.max_dest_rd_atomic = depth(a.max_dest_rd_atomic);
	}
	/* mlx5_ib's transition table has no RTS -> SQD (nor SQD -> SQD): its
	 * QPs are never drained on request. */
	bool drains_sq() const override { return false; }
	/* mlx5_ib writes them into the QP context with MLX5_SET, which keeps
	 * the field's width: timeout 32 is 0 (no timeout), retry_cnt 8 is 0. */
	void fit_path_fields(struct ibv_qp_attr &a) const override
	{
		a.timeout &= 0x1f;
		a.alt_timeout &= 0x1f;
		a.min_rnr_timer &= 0x1f;
		a.retry_cnt &= 7;
		a.rnr_retry &= 7;
	}

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
		/* Memory windows as mlx5_ib reports them: 2^log_max_mkey,
		 * types 1 and 2B (lib/mw.h). */
		a.max_mw = 1 << 24;
		a.device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
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
		/* mlx5_query_port_roce(): RoCE has the default P_Key alone. */
		p.pkey_tbl_len = ll == LinkLayer::InfiniBand ? 128 : 1;
		return p;
	}

	/*
	 * libmlx5's mlx5_calc_sq_size()/mlx5_calc_rq_size() and what it then
	 * writes back (DESIGN-NOTES section 4 has worked examples):
	 *  - SQ, only when max_send_wr > 0: a WQE is the transport/opcode
	 *    overhead plus either the gather list or the inline data, rounded
	 *    up to 64-byte blocks; the queue is the next power of two in
	 *    bytes, and every byte of it is offered back as WRs and inline.
	 *    max_send_sge comes back as asked.
	 *  - RQ, only when max_recv_wr > 0 (its limit is checked even with an
	 *    SRQ): power-of-two WQEs of 16-byte scatter entries, at least one
	 *    64-byte block in all; nothing with an SRQ.
	 */
	int size_qp(const QpSizing &in, QpCaps &out) const override
	{
		struct ibv_qp_cap c = in.cap;
		struct ibv_qp_cap q{};
		uint64_t buffer = 0;

		if (in.cap.max_send_wr) {
			uint32_t overhead = sq_overhead(in);
			uint32_t max_gather = (max_sq_desc_sz - overhead) / data_seg_sz;
			if (in.cap.max_send_sge > max_gather)
				return EINVAL;
			uint64_t gather = overhead + uint64_t(data_seg_sz) * in.cap.max_send_sge;
			uint64_t inl = in.cap.max_inline_data
				? overhead + align_up(inline_hdr_sz + uint64_t(in.cap.max_inline_data), 16)
				: 0;
			uint64_t desc = std::max(gather, inl);
			if (desc > max_sq_desc_sz)
				return EINVAL;
			uint32_t wqe = static_cast<uint32_t>(align_up(desc, send_wqe_bb));
			if (in.cap.max_send_wr > 0x7fffffffu / max_sq_desc_sz)
				return EINVAL;
			uint64_t bytes = roundup_pow2_64(uint64_t(in.cap.max_send_wr) * wqe);
			if (bytes / send_wqe_bb > max_send_wqebb)
				return EINVAL;
			c.max_send_wr = static_cast<uint32_t>(bytes / wqe);
			c.max_inline_data = wqe - overhead - inline_hdr_sz;
			buffer += bytes;
			q.max_send_wr = c.max_send_wr;
			q.max_send_sge = c.max_send_sge;
			q.max_inline_data = c.max_inline_data;
		}

		if (in.cap.max_recv_wr) {
			if (in.cap.max_recv_wr > max_qp_wr)
				return EINVAL;
			if (in.has_srq) {
				clear_recv(c);
			} else {
				uint32_t sge = std::max(in.cap.max_recv_sge, 1u);
				if (sge > max_rq_desc_sz / data_seg_sz)
					return EINVAL;
				uint32_t wqe = roundup_pow2(sge * data_seg_sz);
				uint32_t bytes = std::max(roundup_pow2(in.cap.max_recv_wr) * wqe,
							  send_wqe_bb);
				c.max_recv_wr = bytes / wqe;
				c.max_recv_sge = wqe / data_seg_sz;
				buffer += bytes;
			}
		} else {
			clear_recv(c);
		}
		/* The kernel reports the receive queue it knows of: none for an
		 * SRQ user or an XRC QP, although libmlx5 writes back what it
		 * sized for an XRC initiator at create time. */
		if (!in.has_srq && !is_xrc(in.qp_type)) {
			q.max_recv_wr = c.max_recv_wr;
			q.max_recv_sge = c.max_recv_sge;
		}
		out.created = c;
		out.queried = q;
		out.mlx5_buffer_bytes = buffer;
		return 0;
	}

	/* A ConnectX-5 with ODP on: mlx5_ib mirrors the firmware's bits,
	 * which (on the firmware of the rdma-core 44 era) give RC and XRC all
	 * but atomics, UD sends only, UC nothing (mlx5_ib never fills it),
	 * and implicit ODP. */
	/* A ConnectX-5's MEMIC, as mlx5_ib reports it. */
	uint64_t max_dm_size() const override { return 128 * 1024; }

	struct ibv_odp_caps odp_caps(uint32_t &xrc) const override
	{
		constexpr uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
					IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
					IBV_ODP_SUPPORT_SRQ_RECV;
		xrc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
		      IBV_ODP_SUPPORT_SRQ_RECV;
		struct ibv_odp_caps c{};
		c.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
		c.per_transport_caps.rc_odp_caps = rc;
		c.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND;
		return c;
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
	/* What a ConnectX-5's mlx5_ib reports in the ucontext: WQE descriptor
	 * limits and the send queue's size limit in 64-byte blocks. */
	static constexpr uint32_t max_sq_desc_sz = 1024;
	static constexpr uint32_t max_rq_desc_sz = 512;
	static constexpr uint32_t max_send_wqebb = 32768;
	static constexpr uint32_t send_wqe_bb = 64;
	/* WQE segment sizes (mlx5dv.h). */
	static constexpr uint32_t ctrl_seg_sz = 16, raddr_seg_sz = 16, atomic_seg_sz = 16,
				  umr_ctrl_seg_sz = 48, mkey_seg_sz = 64, klm_seg_sz = 64,
				  datagram_seg_sz = 48, xrc_seg_sz = 16, eth_seg_sz = 32,
				  data_seg_sz = 16, inline_hdr_sz = 4;

	static uint64_t default_send_ops(enum ibv_qp_type type)
	{
		switch (type) {
		case IBV_QPT_UD:
			return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			       IBV_QP_EX_WITH_TSO;
		case IBV_QPT_RAW_PACKET:
			return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
		default:
			return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
			       IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
			       IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
			       IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV |
			       IBV_QP_EX_WITH_BIND_MW;
		}
	}

	/* Bytes of a send WQE before its data: the largest segment set any
	 * enabled opcode needs (memory-window/UMR operations dominate), plus
	 * the transport's own segment. */
	static uint32_t sq_overhead(const QpSizing &in)
	{
		constexpr uint64_t rdma_ops = IBV_QP_EX_WITH_RDMA_WRITE |
					      IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
					      IBV_QP_EX_WITH_RDMA_READ;
		constexpr uint64_t atomic_ops = IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
						IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		constexpr uint64_t mw_ops = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
		constexpr uint64_t mlx5_umr_ops = 3; /* MR_INTERLEAVED | MR_LIST */

		uint64_t ops = in.send_ops_given ? in.send_ops_flags : default_send_ops(in.qp_type);
		uint32_t size = ctrl_seg_sz;
		if (ops & rdma_ops)
			size = std::max(size, ctrl_seg_sz + raddr_seg_sz);
		if (ops & atomic_ops)
			size = std::max(size, ctrl_seg_sz + raddr_seg_sz + atomic_seg_sz);
		if ((ops & mw_ops) || (in.mlx5_send_ops & mlx5_umr_ops))
			size = std::max(size, ctrl_seg_sz + umr_ctrl_seg_sz + mkey_seg_sz + klm_seg_sz);

		if (in.is_dci)
			return size + datagram_seg_sz;
		switch (in.qp_type) {
		case IBV_QPT_UD:
			return size + datagram_seg_sz;
		case IBV_QPT_XRC_SEND:
		case IBV_QPT_XRC_RECV:
			return size + xrc_seg_sz;
		case IBV_QPT_RAW_PACKET:
			return size + eth_seg_sz;
		default:
			return size;
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
		a.max_mw = 0; /* rxe has 0x10000; windows are the mlx5 profile's only */
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

	/*
	 * rdma_rxe: rxe_qp_chk_cap() bounds the request (receive limits only
	 * without an SRQ); a send WQE holds max(sge x 16, inline) bytes and
	 * both are raised to fill it; every queue is 2^k - 1 entries
	 * (rxe_queue_init keeps one slot free). Receive SGEs are granted as
	 * asked.
	 */
	int size_qp(const QpSizing &in, QpCaps &out) const override
	{
		const struct ibv_qp_cap &r = in.cap;
		if (r.max_send_wr > max_qp_wr || r.max_send_sge > max_sge ||
		    r.max_inline_data > max_inline)
			return EINVAL;
		if (!in.has_srq && (r.max_recv_wr > max_qp_wr || r.max_recv_sge > max_sge))
			return EINVAL;
		struct ibv_qp_cap c = r;
		uint32_t wqe = std::max(r.max_send_sge * 16, r.max_inline_data);
		c.max_send_sge = wqe / 16;
		c.max_inline_data = wqe;
		c.max_send_wr = roundup_pow2(r.max_send_wr + 1) - 1;
		if (in.has_srq || is_xrc(in.qp_type))
			clear_recv(c);
		else
			c.max_recv_wr = roundup_pow2(r.max_recv_wr + 1) - 1;
		out.created = c;
		out.queried = c;
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
	struct ibv_odp_caps odp_caps(uint32_t &xrc) const override { return mlx5_.odp_caps(xrc); }
	uint64_t max_dm_size() const override { return mlx5_.max_dm_size(); }
	uint32_t responder_access(const struct ibv_qp_attr &a) const override
	{
		return mlx5_.responder_access(a);
	}
	void read_back(struct ibv_qp_attr &a) const override { mlx5_.read_back(a); }
	bool drains_sq() const override { return mlx5_.drains_sq(); }
	void fit_path_fields(struct ibv_qp_attr &a) const override { mlx5_.fit_path_fields(a); }

	/* Whatever the mlx5 profile would refuse is refused; what it would
	 * grant is granted exactly as asked. */
	int size_qp(const QpSizing &in, QpCaps &out) const override
	{
		if (int err = mlx5_.size_qp(in, out))
			return err;
		struct ibv_qp_cap c = in.cap;
		if (in.has_srq || is_xrc(in.qp_type))
			clear_recv(c);
		out.created = c;
		out.queried = c;
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
