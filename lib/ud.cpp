/* SPDX-License-Identifier: MIT */
/*
 * UD sends: an address handle names a port (DLID on InfiniBand, DGID on
 * Ethernet) and the WR a QP number and Q_Key there. Unreliable: whatever
 * cannot be delivered (no such port or QP, QP not ready, Q_Key mismatch, no
 * receive WQE) is dropped and the sender completes successfully. A message
 * larger than the port's active MTU is refused at the sender with
 * IBV_WC_LOC_LEN_ERR, as ConnectX does.
 *
 * The first 40 bytes of every receive buffer are reserved for the GRH. When
 * the sender's AH is global we write what an HCA scatters there: the IPv6
 * header (IB, RoCE v1, RoCE v2 over IPv6) with the sender's SGID, the DGID,
 * payload length, next header (0x1b = BTH; UDP for RoCE v2), traffic class,
 * flow label and hop limit, or, for RoCE v2 between IPv4-mapped GIDs, the
 * 20-byte IPv4 header in the last 20 bytes (as mlx5). ibv_init_ah_from_wc()
 * parses either back into the AH that answers the sender. Without a GRH the
 * 40 bytes are left untouched.
 */
#include "ud.h"

#include "ah.h"
#include "broker_socket.h"
#include "copy.h"
#include "cq_produce.h"
#include "datapath.h"
#include "datapath_internal.h"
#include "device.h"
#include "log.h"
#include "remote_memory.h"

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

namespace shmverbs {

using namespace dp;

namespace {

constexpr uint64_t grh_bytes = 40;
constexpr uint32_t multicast_qpn = 0xffffff; /* DestQP of a multicast packet */

bool is_v4_mapped(const union ibv_gid &g)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return std::memcmp(g.raw, prefix, 12) == 0;
}

/* --- Multicast membership files --- */

std::string group_dir(uint32_t device, const union ibv_gid &gid, uint16_t lid)
{
	std::string dir = broker::default_runtime_dir();
	if (dir.empty())
		return dir;
	char name[96];
	int n = std::snprintf(name, sizeof(name), "/mcast/%u.", device);
	for (uint8_t b : gid.raw)
		n += std::snprintf(name + n, sizeof(name) - size_t(n), "%02x", b);
	std::snprintf(name + n, sizeof(name) - size_t(n), ".%u", lid);
	return dir + name;
}

/* The QP numbers attached to a group (entries of dead owners included: the
 * sender checks each). */
std::vector<std::pair<uint32_t, pid_t>> group_members(const std::string &dir)
{
	std::vector<std::pair<uint32_t, pid_t>> out;
	DIR *d = opendir(dir.c_str());
	if (!d)
		return out;
	while (struct dirent *e = readdir(d)) {
		unsigned qpn = 0;
		if (std::sscanf(e->d_name, "%u", &qpn) != 1)
			continue;
		std::string path = dir + "/" + e->d_name;
		pid_t pid = 0;
		if (FILE *f = std::fopen(path.c_str(), "re")) {
			if (std::fscanf(f, "%d", &pid) != 1)
				pid = 0;
			std::fclose(f);
		}
		out.emplace_back(qpn, pid);
	}
	closedir(d);
	return out;
}

} // namespace

int mcast_join(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn)
{
	std::string dir = group_dir(device, gid, lid);
	if (dir.empty())
		return 0;
	std::string base = broker::default_runtime_dir() + "/mcast";
	if ((::mkdir(base.c_str(), 0700) && errno != EEXIST) ||
	    (::mkdir(dir.c_str(), 0700) && errno != EEXIST))
		return errno;
	std::string path = dir + "/" + std::to_string(qpn);
	int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return errno;
	std::string pid = std::to_string(getpid());
	ssize_t n = ::write(fd, pid.data(), pid.size());
	::close(fd);
	return n == ssize_t(pid.size()) ? 0 : EIO;
}

void mcast_leave(uint32_t device, const union ibv_gid &gid, uint16_t lid, uint32_t qpn)
{
	std::string dir = group_dir(device, gid, lid);
	if (dir.empty())
		return;
	::unlink((dir + "/" + std::to_string(qpn)).c_str());
	::rmdir(dir.c_str()); /* fails while others are attached */
}

/* What one UD message carries to each of its targets. */
struct QpEngine::UdMessage {
	const char *data;   /* the payload, contiguous */
	uint64_t length;
	const char *grh;    /* the GRH's 40 bytes, or nullptr (not global) */
	uint32_t src_qp;
	uint16_t slid;
	uint8_t sl;
	bool solicited;
	bool with_imm;
	uint32_t imm_data;
};

namespace {

/* The 40 bytes an HCA scatters ahead of a UD payload whose AH is global. */
void build_grh(char (&grh)[40], const Port &own, const struct ibv_ah_attr &ah, bool eth,
	       bool with_imm, uint64_t length)
{
	union ibv_gid sgid{};
	enum ibv_gid_type sgid_type = eth ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
	if (ah.grh.sgid_index < own.gids.size()) {
		sgid = own.gids[ah.grh.sgid_index].gid;
		sgid_type = own.gids[ah.grh.sgid_index].gid_type;
	}
	const bool v2 = sgid_type == IBV_GID_TYPE_ROCE_V2;
	const uint32_t imm = with_imm ? 4 : 0;
	/* BTH + DETH (+ ImmDt) + payload padded to 4 + ICRC. */
	const uint32_t ib_len = uint32_t(12 + 8 + imm + ((length + 3) & ~3ull) + 4);
	if (v2 && is_v4_mapped(sgid) && is_v4_mapped(ah.grh.dgid)) {
		struct iphdr ip{};
		ip.version = 4;
		ip.ihl = 5;
		ip.tos = ah.grh.traffic_class;
		ip.tot_len = htobe16(uint16_t(20 + 8 + ib_len));
		ip.frag_off = htobe16(0x4000); /* DF */
		ip.ttl = ah.grh.hop_limit;
		ip.protocol = IPPROTO_UDP;
		std::memcpy(&ip.saddr, sgid.raw + 12, 4);
		std::memcpy(&ip.daddr, ah.grh.dgid.raw + 12, 4);
		/* The ones'-complement header checksum. */
		uint16_t words[10];
		std::memcpy(words, &ip, sizeof(words));
		uint32_t sum = 0;
		for (uint16_t w : words)
			sum += w;
		while (sum >> 16)
			sum = (sum & 0xffff) + (sum >> 16);
		ip.check = uint16_t(~sum);
		std::memset(grh, 0, 20);
		std::memcpy(grh + 20, &ip, sizeof(ip));
	} else {
		struct ibv_grh g{};
		g.version_tclass_flow = htobe32((6u << 28) | (uint32_t(ah.grh.traffic_class) << 20) |
						(ah.grh.flow_label & 0xfffff));
		g.paylen = htobe16(uint16_t(ib_len + (v2 ? 8 : 0)));
		g.next_hdr = v2 ? IPPROTO_UDP : 0x1b;
		g.hop_limit = ah.grh.hop_limit;
		g.sgid = sgid;
		g.dgid = ah.grh.dgid;
		std::memcpy(grh, &g, sizeof(g));
	}
}

} // namespace

/*
 * The cached unicast target (sq_lock_ held). What is cached is only ever a
 * shortcut for resolve_object(): every use checks with loads that the
 * segment is still mapped and its owner alive, that the descriptor still
 * is UD QP `qpn`, and (with our in-flight count taken, which holds off its
 * destroy) that it is not dead. A dead one is forgotten in the broker
 * cache as well and resolved once more at once: its number may name a new
 * QP by now.
 */
[[gnu::always_inline]] inline QpEngine::UdTarget *QpEngine::ud_target(uint32_t device, uint32_t qpn)
{
	UdTarget &t = ud_target_;
	/* A number found dead a moment ago is not asked for again at once:
	 * a sender that keeps sending to a destroyed QP would pay a broker
	 * round trip per message. Numbers are handed out round-robin, so
	 * one that died is not reused within this period. */
	if (ud_dead_.valid && ud_dead_.qpn == qpn && ud_dead_.device == device) {
		if (std::chrono::steady_clock::now() < ud_dead_.until)
			return nullptr;
		ud_dead_.valid = false;
	}
	bool saw_dead = false;
	auto lost = [&]() -> UdTarget * {
		if (saw_dead)
			ud_dead_ = {true, device, qpn,
				    std::chrono::steady_clock::now() + std::chrono::milliseconds(10)};
		return nullptr;
	};
	for (int attempt = 0; attempt < 2; attempt++) {
		if (!t.desc || t.qpn != qpn || t.device != device ||
		    t.seg->gone.load(std::memory_order_acquire) || t.desc->magic != shm::qp_magic ||
		    t.desc->qpn != qpn || t.desc->type != IBV_QPT_UD) {
			release_holds(); /* they point into the old target's segments */
			t = {};
			PeerObject obj;
			if (resolve_object(device, broker::ObjectKind::Qp, qpn, obj, attempt == 1))
				return lost();
			auto *d = obj.seg->at<shm::QpDesc>(obj.off);
			if (!d || d->magic != shm::qp_magic || d->qpn != qpn) {
				if (attempt == 0)
					continue; /* the broker cache may be stale: ask again */
				return lost();
			}
			if (d->type != IBV_QPT_UD)
				return lost(); /* a live QP of another type: lost */
			t.seg = std::move(obj.seg);
			t.desc = d;
			t.device = device;
			t.qpn = qpn;
		}
		if (!t.seg->alive())
			return nullptr;
		/* The target's in-flight count, taken once and kept across WRs
		 * and posts (held_), then `dead` checked for each (seq_cst: the
		 * Dekker pair with quiesce()). */
		if (held_.inflight != t.desc) {
			hold_target(*t.desc);
			t.recv_checked = false;
		}
		if (!t.desc->dead.load(std::memory_order_seq_cst))
			return &t;
		release_holds(); /* its destroy waits for the count */
		t = {};
		forget_object(device, broker::ObjectKind::Qp, qpn);
		saw_dead = true;
	}
	return lost();
}

[[gnu::always_inline]] inline bool QpEngine::ud_recv_side(UdTarget &t)
{
	if (t.recv_checked && held_.inflight == t.desc)
		return true;
	const shm::QpDesc &d = *t.desc;
	if (t.recv_ok && d.srqn == t.srqn && d.rq_off == t.rq_off && d.recv_cq_off == t.cq_off) {
		/* The QP's own RQ and CQ live as long as it does, and an SRQ
		 * outlives every QP using it; but an area may be reused by a
		 * queue of another geometry, or an SRQ number by another SRQ,
		 * since this copy was taken (a destroyed SRQ's magic is
		 * cleared). The ring's geometry line is never written: these
		 * loads stay in the cache. */
		const shm::RecvQueue &r = *t.rq;
		if ((!t.srqn || !t.srq_seg->gone.load(std::memory_order_acquire)) &&
		    r.magic == shm::rq_magic && r.srqn == t.srqn && r.entries == t.rq_entries &&
		    r.max_sge == t.rq_max_sge && r.stride == t.rq_stride &&
		    (!t.cq || t.cq.ring->magic == shm::cq_magic)) {
			t.recv_checked = true;
			return true;
		}
	}
	/* The receive key held points into the old side's segment. */
	held_.recv_key.release();
	t.recv_ok = false;
	t.recv_checked = false;
	t.srq_seg.reset();
	t.srqn = d.srqn;
	t.rq_off = d.rq_off;
	t.cq_off = d.recv_cq_off;
	PeerRq q;
	if (t.srqn) {
		PeerObject srq_obj;
		if (!peer_srq(t.device, t.srqn, srq_obj, q))
			return false;
		t.srq_seg = std::move(srq_obj.seg);
		t.rq_seg = t.srq_seg.get();
		t.rq_pdn = q.rq->pdn;
	} else {
		if (!peer_rq(*t.seg, t.rq_off, q))
			return false;
		t.rq_seg = t.seg.get();
		t.rq_pdn = d.pdn;
	}
	t.rq = q.rq;
	t.rq_entries = q.entries;
	t.rq_max_sge = q.max_sge;
	t.rq_stride = q.stride;
	CqTarget ring = peer_cq(*t.seg, t.cq_off);
	if (ring.ring != t.cq.ring)
		t.cq_cons = 0;
	t.cq = ring;
	t.recv_ok = true;
	t.recv_checked = true;
	return true;
}

/*
 * One message into one target whose in-flight count the caller holds: a
 * receive WQE, the GRH and payload scattered over its SGEs, the receive
 * completion. No WQE: dropped (UD never waits). A receive's own error
 * (too small, bad key) completes it in error and the target enters ERR.
 */
[[gnu::always_inline]] inline void QpEngine::ud_deliver(UdTarget &t, const UdMessage &m, bool hold_key)
{
	PeerRq q{t.rq, t.rq_entries, t.rq_max_sge, t.rq_stride};
	shm::RecvWqe wqe;
	/* The common WQE of one SGE stays on the stack; others are read
	 * into the engine's vector. */
	shm::RecvSge one;
	std::span<const shm::RecvSge> rsges(&one, 1);
	bool other = false;
	if (!consume_wqe_one_sge(q, wqe, one, other)) {
		if (!other || !consume_wqe(q, wqe, recv_sges_))
			return; /* no receive posted: dropped */
		rsges = recv_sges_;
	}

	/* pkey_index 0, dlid_path_bits 0 (LMC 0): PlainCompletion's zeros. */
	PlainCompletion rc{wqe.wr_id,
			   IBV_WC_SUCCESS,
			   IBV_WC_RECV,
			   uint32_t(m.length + grh_bytes),
			   m.with_imm ? m.imm_data : 0,
			   t.qpn,
			   m.src_qp,
			   (m.grh ? uint32_t(IBV_WC_GRH) : 0) | (m.with_imm ? uint32_t(IBV_WC_WITH_IMM) : 0),
			   m.solicited,
			   m.slid,
			   m.sl};
	const PeerSegment &rq_seg = *t.rq_seg;
	const uint64_t total = m.length + grh_bytes;
	if (rsges.size() == 1 && hold_key && rsges[0].length >= total &&
	    rsges[0].lkey != null_mr_key) {
		/* The common receive: one SGE that takes the GRH area and the
		 * payload, its key held between WRs; the loop below with
		 * nothing to decide. */
		const shm::RecvSge &s = rsges[0];
		const HeldKey &h = held_.recv_key;
		char *to = nullptr;
		if (held_.recv_key.get(rq_seg, s.lkey) && !h.null_mr && h.pdn == t.rq_pdn &&
		    h.permits(s.addr, total, IBV_ACCESS_LOCAL_WRITE))
			to = h.local(s.addr);
		if (to) {
			if (m.grh)
				std::memcpy(to, m.grh, grh_bytes);
			copy_payload(to + grh_bytes, m.data, m.length);
			produce_recv(t, rc);
			return;
		}
		/* A refused key or another memory path: the loop decides. */
	}
	uint64_t room = 0;
	for (const shm::RecvSge &s : rsges)
		room += s.length;
	if (total > room) {
		rc.status = IBV_WC_LOC_LEN_ERR;
	} else {
		/* Scatter GRH (if any) + payload over the receive SGEs. */
		uint64_t pos = 0;
		KeyRef own_ref;
		for (const shm::RecvSge &s : rsges) {
			if (pos >= total)
				break;
			uint64_t n = std::min<uint64_t>(s.length, total - pos);
			if (s.lkey == null_mr_key) { /* its bytes are dropped */
				pos += n;
				continue;
			}
			/* The buffer's key, held in the target's table while we
			 * write (its dereg_mr waits); kept for the next WRs and
			 * posts when allowed, while the key is still published.
			 * A held key's entry stays the key's: PD, range and
			 * access are checked per use. */
			const KeyRef *ref;
			if (hold_key) {
				ref = &held_.recv_key.get(rq_seg, s.lkey);
			} else {
				own_ref = acquire_key(rq_seg, s.lkey);
				ref = &own_ref;
			}
			if (!*ref || (*ref)->pdn != t.rq_pdn ||
			    !ref->permits(s.addr, n, IBV_ACCESS_LOCAL_WRITE)) {
				rc.status = IBV_WC_LOC_PROT_ERR;
				break;
			}
			struct iovec v[2];
			int nv = 0;
			uint64_t skip = 0; /* bytes of this SGE left as they are */
			uint64_t grh_part = pos < grh_bytes ? std::min(n, grh_bytes - pos) : 0;
			if (grh_part) {
				if (m.grh)
					v[nv++] = {const_cast<char *>(m.grh) + pos, size_t(grh_part)};
				else
					skip = grh_part;
			}
			uint64_t from = pos < grh_bytes ? 0 : pos - grh_bytes;
			if (n > grh_part)
				v[nv++] = {const_cast<char *>(m.data) + from, size_t(n - grh_part)};
			if (nv) {
				/* Our own memory (but ODP memory) and a peer's
				 * Shared MR directly; anything else through its
				 * path. */
				const uint64_t at = ref->address_of(s.addr + skip);
				char *to = direct_at(rq_seg, **ref, at, n - skip);
				if (to) {
					for (int i = 0; i < nv; i++) {
						std::memcpy(to, v[i].iov_base, v[i].iov_len);
						to += v[i].iov_len;
					}
				} else if (remote_memory_for(rq_seg, **ref).write(rq_seg, **ref, at, v, nv)) {
					rc.status = IBV_WC_LOC_PROT_ERR;
					break;
				}
			}
			pos += n;
		}
	}
	produce_recv(t, rc);
}

/* The receive completion of a message into `t`; one in error puts the
 * target into ERR (its owner acts on the descriptor's remote_error). */
[[gnu::always_inline]] inline void QpEngine::produce_recv(UdTarget &t, const PlainCompletion &rc)
{
	if (t.cq && cq_ring_produce(t.cq, rc,
				    t.desc->recv_cq_has_channel
					    ? CqChannel::attached_to(t.device, broker::ObjectKind::Qp, t.qpn)
					    : CqChannel::none(),
				    &t.cq_cons) == ENOSPC) [[unlikely]]
		shm::leave_remote_error(*t.desc, shm::remote_error_cq);
	if (rc.status != IBV_WC_SUCCESS)
		t.desc->remote_error.store(shm::remote_error_fatal, std::memory_order_release);
}

/*
 * A UD SEND of one piece to the unicast target of the messages before, by
 * the route they took (a LID, no GRH): execute_ud()'s checks and
 * ud_deliver(), without the port, route and GRH decisions, the UdSend and
 * the iovec of the general way. Anything else, or a message execute_ud()
 * would drop or fail, goes there (false: nothing done).
 */
[[gnu::flatten]] bool QpEngine::direct_ud(const struct ibv_send_wr &wr)
{
	struct ibv_ah *ibah = wr.wr.ud.ah;
	const Port *own = ud_port_;
	const auto &r = ud_route_;
	if (!ibah || ibah->context != qp_.ctx->abi() || !own || ud_port_num_ != attr_.port_num ||
	    !r.valid || !r.found)
		return false;
	/* A LID the route was found for: not global (nor, so, Ethernet,
	 * whose AHs all are), and unicast (only those are routed). */
	const struct ibv_ah_attr &ah = Ah::from(ibah)->attr;
	if (ah.is_global || ah.dlid != r.dlid)
		return false;
	UdTarget &t = ud_target_;
	const uint32_t qpn = wr.wr.ud.remote_qpn;
	if (!t.desc || t.qpn != qpn || t.device != r.device || held_.inflight != t.desc ||
	    !t.recv_checked || t.seg->gone.load(std::memory_order_acquire) ||
	    t.desc->magic != shm::qp_magic || t.desc->qpn != qpn || t.desc->type != IBV_QPT_UD ||
	    !t.seg->alive() || t.desc->dead.load(std::memory_order_seq_cst))
		return false;
	const uint32_t qkey = (wr.wr.ud.remote_qkey & 0x80000000u) ? attr_.qkey : wr.wr.ud.remote_qkey;
	const shm::QpDesc &d = *t.desc;
	if (!responder_ready(d) ||
	    d.port.load(std::memory_order_relaxed) != r.port ||
	    d.qkey.load(std::memory_order_relaxed) != qkey)
		return false;
	const struct ibv_sge &s = wr.sg_list[0];
	if (s.length > (128ull << own->attr.active_mtu))
		return false;
	const void *from;
	if (!one_piece(s, wr.send_flags & IBV_SEND_INLINE, from))
		return false;
	UdMessage m{};
	m.data = static_cast<const char *>(from);
	m.length = s.length;
	m.src_qp = qpn_;
	m.slid = own->attr.lid;
	m.sl = ah.sl;
	m.solicited = wr.send_flags & IBV_SEND_SOLICITED;
	m.with_imm = wr.opcode == IBV_WR_SEND_WITH_IMM;
	m.imm_data = wr.imm_data;
	ud_deliver(t, m, true);
	local_refs_.end_wr();
	/* complete_send()'s work, inline here (a SEND, with or without
	 * immediate, completes as IBV_WC_SEND). */
	if (((wr.send_flags & IBV_SEND_SIGNALED) || core_.sq_sig_all) && send_cq_)
		if (deliver_send_completion(*send_cq_, send_target_, wr.wr_id, IBV_WC_SUCCESS,
					    IBV_WC_SEND, qpn_, s.length, {sq_completing_, sq_slot_},
					    m.with_imm ? IBV_WC_WITH_IMM : 0) == ENOSPC) [[unlikely]]
			send_cq_overrun();
	return true;
}

/*
 * One UD WR (sq_lock_ held): local gathered into `local` (`length` bytes).
 * Done, or Fatal for a message over the MTU: UD never waits and never
 * fails remotely.
 *
 * Flattened, as the direct path is (lib/datapath.cpp try_direct): left to
 * itself the compiler kept the receive key's check (HeldKey::get) and
 * own_pid() as calls in this large function. callgrind, UD inline SEND
 * signaled every 16th: post_send 639 -> 622 instructions per WR, for 3 KB
 * of text.
 */
[[gnu::flatten]] QpEngine::Outcome QpEngine::execute_ud(const UdSend &wr, struct ibv_wc &wc,
							const struct iovec *local, int count,
							uint64_t length)
{
	if (!ud_port_ || ud_port_num_ != attr_.port_num) {
		ud_port_ = devices()[device_]->port(uint8_t(attr_.port_num));
		ud_port_num_ = attr_.port_num;
	}
	const Port *own = ud_port_;
	if (!own) {
		wc.status = IBV_WC_SUCCESS;
		return Outcome::Done;
	}
	/* UD messages are single packets: no larger than the path MTU. */
	if (length > (128ull << own->attr.active_mtu)) {
		wc.status = IBV_WC_LOC_LEN_ERR;
		return Outcome::Fatal;
	}
	wc.status = IBV_WC_SUCCESS;
	const struct ibv_ah_attr &ah = wr.ah;
	const bool eth = own->attr.link_layer == IBV_LINK_LAYER_ETHERNET;

	/* Where to: a multicast group, or the port owning the DLID/DGID (the
	 * last answer is kept: the fabric never changes). */
	const bool multicast = eth ? is_multicast_gid(ah.grh.dgid)
				   : (ah.dlid >= 0xc000 && ah.dlid != 0xffff);
	uint32_t to_device = device_;
	uint8_t to_port = 0;
	if (!multicast) {
		auto &r = ud_route_;
		if (!r.valid || r.eth != eth ||
		    (eth ? std::memcmp(r.dgid.raw, ah.grh.dgid.raw, 16) != 0 : r.dlid != ah.dlid)) {
			r.valid = false;
			r.found = false;
			for (const Device *d : devices()) {
				for (const Port &p : d->ports) {
					bool match = false;
					if (!eth) {
						match = p.attr.lid == ah.dlid;
					} else {
						for (const GidEntry &g : p.gids)
							if (g.valid && !std::memcmp(g.gid.raw, ah.grh.dgid.raw, 16))
								match = true;
					}
					if (match && (p.attr.link_layer == IBV_LINK_LAYER_ETHERNET) == eth) {
						r.device = d->index;
						r.port = p.port_num;
						r.found = true;
						break;
					}
				}
				if (r.found)
					break;
			}
			r.eth = eth;
			r.dlid = ah.dlid;
			r.dgid = ah.grh.dgid;
			r.valid = true;
		}
		if (!r.found)
			return Outcome::Done; /* no such port: lost */
		to_device = r.device;
		to_port = r.port;
	}

	/* The payload, contiguous: gathered only when in several pieces. */
	const char *data = count ? static_cast<const char *>(local[0].iov_base) : nullptr;
	if (count > 1) {
		gathered_.resize(length);
		gather(gathered_.data(), local, count);
		data = gathered_.data();
	}

	/* The GRH as the receiver will find it. */
	const bool global = ah.is_global || eth;
	const bool with_imm = wr.opcode == IBV_WR_SEND_WITH_IMM;
	if (global) {
		/* The last one built is kept: a sender's messages mostly
		 * repeat the route and the size. Everything it depends on is
		 * compared (the port's GIDs never change). */
		auto &g = ud_grh_;
		if (!g.valid || g.port != own || g.eth != eth || g.with_imm != with_imm ||
		    g.length != length || g.sgid_index != ah.grh.sgid_index ||
		    g.hop_limit != ah.grh.hop_limit || g.traffic_class != ah.grh.traffic_class ||
		    g.flow_label != ah.grh.flow_label ||
		    std::memcmp(g.dgid.raw, ah.grh.dgid.raw, 16) != 0) {
			build_grh(g.bytes, *own, ah, eth, with_imm, length);
			g.port = own;
			g.eth = eth;
			g.with_imm = with_imm;
			g.length = length;
			g.sgid_index = ah.grh.sgid_index;
			g.hop_limit = ah.grh.hop_limit;
			g.traffic_class = ah.grh.traffic_class;
			g.flow_label = ah.grh.flow_label;
			g.dgid = ah.grh.dgid;
			g.valid = true;
		}
	}

	UdMessage m{};
	m.data = data;
	m.length = length;
	m.grh = global ? ud_grh_.bytes : nullptr;
	m.src_qp = qpn_;
	m.slid = own->attr.lid;
	m.sl = ah.sl;
	m.solicited = wr.send_flags & IBV_SEND_SOLICITED;
	m.with_imm = with_imm;
	m.imm_data = wr.imm_data;

	const uint32_t qkey = (wr.remote_qkey & 0x80000000u) ? attr_.qkey : wr.remote_qkey;
	/* A target takes the message when ready, on the addressed port (a
	 * multicast group spans ports) and of the same Q_Key; otherwise the
	 * message is dropped silently. */
	auto accepts = [&](const shm::QpDesc &d) {
		return responder_ready(d) &&
		       (multicast || d.port.load(std::memory_order_relaxed) == to_port) &&
		       d.qkey.load(std::memory_order_relaxed) == qkey;
	};

	if (!multicast) {
		UdTarget *t = ud_target(to_device, wr.remote_qpn);
		if (t && accepts(*t->desc) && ud_recv_side(*t))
			ud_deliver(*t, m, true);
		else if (t && !responder_ready(*t->desc))
			release_holds(); /* its reset waits for the count */
		return Outcome::Done;
	}

	/* A multicast packet's DestQP is 0xFFFFFF in the IBA, and rxe
	 * takes a packet as multicast only so: another QP number to a
	 * group reaches nobody, dropped as a UD send to no QP is. */
	if (wr.remote_qpn != multicast_qpn)
		return Outcome::Done;
	/* A group is found by its MGID, which only a global AH carries
	 * (libmlx5 copies the GID only then; rxe drops multicast without a
	 * GRH): an IB AH to a multicast LID without it reaches nobody,
	 * whatever its unused grh.dgid holds. */
	if (!eth && !ah.is_global)
		return Outcome::Done;
	/* Multicast: every member of the group, each resolved afresh (the
	 * listing is a directory read anyway), holding nothing across WRs. */
	const bool block_self = core_.create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	for (auto [qpn, pid] : group_members(group_dir(device_, ah.grh.dgid, eth ? 0 : ah.dlid))) {
		PeerObject obj;
		if (resolve_object(to_device, broker::ObjectKind::Qp, qpn, obj))
			continue;
		auto *desc = obj.seg->at<shm::QpDesc>(obj.off);
		if (!desc || desc->magic != shm::qp_magic || desc->qpn != qpn ||
		    desc->type != IBV_QPT_UD || !obj.seg->alive())
			continue;
		if (block_self && qpn == qpn_ && uint32_t(obj.seg->pid) == own_pid())
			continue; /* not looped back to the sending QP */
		if (pid && obj.seg->pid != pid)
			continue; /* a stale entry: the number now names another QP */
		struct Release {
			shm::QpDesc *d;
			int entry;
			~Release() { shm::release_qp(*d, entry); }
		} release{desc, shm::hold_qp(*desc, own_pid())};
		if (desc->dead.load(std::memory_order_seq_cst) || !accepts(*desc))
			continue;
		/* A member's receive side, built like the cached target's but
		 * held only for this message. */
		UdTarget member;
		member.seg = obj.seg;
		member.desc = desc;
		member.device = to_device;
		member.qpn = qpn;
		member.srqn = desc->srqn;
		PeerRq q;
		if (desc->srqn) {
			PeerObject srq_obj;
			if (!peer_srq(to_device, desc->srqn, srq_obj, q))
				continue;
			member.srq_seg = std::move(srq_obj.seg);
			member.rq_seg = member.srq_seg.get();
			member.rq_pdn = q.rq->pdn;
		} else {
			if (!peer_rq(*obj.seg, desc->rq_off, q))
				continue;
			member.rq_seg = obj.seg.get();
			member.rq_pdn = desc->pdn;
		}
		member.rq = q.rq;
		member.rq_entries = q.entries;
		member.rq_max_sge = q.max_sge;
		member.rq_stride = q.stride;
		member.cq = peer_cq(*obj.seg, desc->recv_cq_off);
		ud_deliver(member, m, false);
	}
	return Outcome::Done;
}

} // namespace shmverbs
