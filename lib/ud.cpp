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

/*
 * One UD WR (sq_lock_ held): local gathered into `local` (`length` bytes).
 * Always Done: UD never waits and never fails remotely.
 */
QpEngine::Outcome QpEngine::execute_ud(SendWr &wr, struct ibv_wc &wc,
				       const struct iovec *local, int count, uint64_t length)
{
	const Device &dev = *devices()[device_];
	const Port *own = dev.port(uint8_t(attr_.port_num));
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
	const struct ibv_ah_attr &ah = wr.ah_attr;
	const bool eth = own->attr.link_layer == IBV_LINK_LAYER_ETHERNET;

	/* Where to: a multicast group, or the port owning the DLID/DGID. */
	bool multicast = eth ? ah.grh.dgid.raw[0] == 0xff
			     : (ah.dlid >= 0xc000 && ah.dlid != 0xffff);
	uint32_t to_device = device_;
	uint8_t to_port = 0;
	if (!multicast) {
		bool found = false;
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
					to_device = d->index;
					to_port = p.port_num;
					found = true;
					break;
				}
			}
			if (found)
				break;
		}
		if (!found)
			return Outcome::Done; /* no such port: lost */
	}

	std::vector<std::pair<uint32_t, pid_t>> targets;
	if (multicast)
		targets = group_members(group_dir(device_, ah.grh.dgid, eth ? 0 : ah.dlid));
	else
		targets.emplace_back(wr.remote_qpn, 0);

	/* The payload, gathered once. */
	std::vector<char> data(length);
	size_t at = 0;
	for (const struct iovec &v : std::span(local, size_t(count))) {
		std::memcpy(data.data() + at, v.iov_base, v.iov_len);
		at += v.iov_len;
	}

	/* The GRH as the receiver will find it. */
	char grh[grh_bytes] = {};
	const bool global = ah.is_global || eth;
	if (global) {
		union ibv_gid sgid{};
		enum ibv_gid_type sgid_type = eth ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
		if (ah.grh.sgid_index < own->gids.size()) {
			sgid = own->gids[ah.grh.sgid_index].gid;
			sgid_type = own->gids[ah.grh.sgid_index].gid_type;
		}
		const bool v2 = sgid_type == IBV_GID_TYPE_ROCE_V2;
		const uint32_t imm = wr.opcode == IBV_WR_SEND_WITH_IMM ? 4 : 0;
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

	const uint32_t own_qkey = attr_.qkey;
	const uint32_t qkey = (wr.remote_qkey & 0x80000000u) ? own_qkey : wr.remote_qkey;
	for (auto [qpn, pid] : targets) {
		PeerObject obj;
		if (resolve_object(to_device, broker::ObjectKind::Qp, qpn, obj))
			continue;
		auto *desc = obj.seg->at<shm::QpDesc>(obj.off);
		if (!desc || desc->magic != shm::qp_magic || desc->qpn != qpn ||
		    desc->type != IBV_QPT_UD || !obj.seg->alive())
			continue;
		if (multicast && pid && obj.seg->pid != pid)
			continue; /* a stale entry: the number now names another QP */
		desc->inflight.fetch_add(1, std::memory_order_seq_cst);
		struct Release {
			shm::QpDesc *d;
			~Release() { d->inflight.fetch_sub(1, std::memory_order_release); }
		} release{desc};
		if (desc->dead.load(std::memory_order_seq_cst))
			continue;
		uint32_t st = desc->state.load(std::memory_order_acquire);
		if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE)
			continue;
		if (!multicast && desc->port.load() != to_port)
			continue;
		if (desc->qkey.load() != qkey)
			continue; /* Q_Key mismatch: dropped silently */

		/* The receive WQE: the QP's RQ or its SRQ. */
		PeerRq q;
		PeerObject srq_obj;
		const PeerSegment *rq_seg = obj.seg.get();
		uint32_t rq_pdn = desc->pdn;
		if (desc->srqn) {
			if (!peer_srq(to_device, desc->srqn, srq_obj, q))
				continue;
			rq_seg = srq_obj.seg.get();
			rq_pdn = q.rq->pdn;
		} else if (!peer_rq(*obj.seg, desc->rq_off, q)) {
			continue;
		}
		shm::RecvWqe wqe{};
		std::vector<shm::RecvSge> rsges;
		if (!consume_wqe(q, wqe, rsges))
			continue; /* no receive posted: dropped */

		Completion rc = make_completion(wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, qpn);
		rc.wc.src_qp = qpn_;
		rc.wc.slid = own->attr.lid;
		rc.wc.sl = ah.sl;
		rc.wc.pkey_index = 0;
		rc.wc.dlid_path_bits = 0; /* LMC 0 */
		rc.wc.byte_len = uint32_t(length + grh_bytes);
		rc.solicited = wr.send_flags & IBV_SEND_SOLICITED;
		if (global)
			rc.wc.wc_flags |= IBV_WC_GRH;
		if (wr.opcode == IBV_WR_SEND_WITH_IMM) {
			rc.wc.imm_data = wr.imm_data;
			rc.wc.wc_flags |= IBV_WC_WITH_IMM;
		}
		uint64_t room = 0;
		for (const shm::RecvSge &s : rsges)
			room += s.length;
		if (length + grh_bytes > room) {
			rc.wc.status = IBV_WC_LOC_LEN_ERR;
		} else {
			/* Scatter GRH (if any) + payload over the receive SGEs. */
			const uint64_t total = length + grh_bytes;
			uint64_t pos = 0;
			for (const shm::RecvSge &s : rsges) {
				if (pos >= total)
					break;
				uint64_t n = std::min<uint64_t>(s.length, total - pos);
				KeyRef ref = acquire_key(*rq_seg, s.lkey);
				if (!ref || ref->pdn != rq_pdn ||
				    !ref.permits(s.addr, n, IBV_ACCESS_LOCAL_WRITE)) {
					rc.wc.status = IBV_WC_LOC_PROT_ERR;
					break;
				}
				struct iovec v[2];
				int nv = 0;
				uint64_t skip = 0; /* bytes of this SGE left as they are */
				if (pos < grh_bytes) {
					uint64_t g = std::min(n, grh_bytes - pos);
					if (global)
						v[nv++] = {grh + pos, size_t(g)};
					else
						skip = g;
				}
				uint64_t from = pos < grh_bytes ? 0 : pos - grh_bytes;
				uint64_t grh_part = pos < grh_bytes ? std::min(n, grh_bytes - pos) : 0;
				if (n > grh_part)
					v[nv++] = {data.data() + from, size_t(n - grh_part)};
				if (nv && remote_memory_for(*rq_seg, *ref).write(
						  *rq_seg, *ref, ref.address_of(s.addr + skip), v, nv)) {
					rc.wc.status = IBV_WC_LOC_PROT_ERR;
					break;
				}
				pos += n;
			}
		}
		uint32_t cap;
		if (shm::CqRing *ring = peer_cq(*obj.seg, desc->recv_cq_off, cap))
			cq_ring_produce(*ring, cap, rc,
					desc->recv_cq_has_channel
						? fetch_channel_fd(to_device, broker::ObjectKind::Qp, qpn)
						: -1);
		if (rc.wc.status != IBV_WC_SUCCESS)
			desc->remote_error.store(shm::remote_error_fatal, std::memory_order_release);
	}
	return Outcome::Done;
}

} // namespace shmverbs
