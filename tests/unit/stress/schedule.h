/* SPDX-License-Identifier: MIT */
/*
 * The stress test's schedule: what every sender does in every round, as a
 * pure function of (seed, round, sender, receiver, slot). Every process
 * computes the same schedule, so a receiver knows in advance exactly which
 * messages will arrive on each of its queues (and posts exactly the receives
 * they need: no UC/UD message can be lost for lack of a WQE), what every
 * payload byte must be, where every RDMA WRITE lands, and what every atomic
 * must leave behind. Only the interleaving across channels, the posting API
 * and batching are local (and random too).
 */
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace stress {

inline uint64_t mix(uint64_t x)
{
	/* splitmix64's finalizer. */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

inline uint64_t key_of(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0, uint64_t e = 0,
		       uint64_t f = 0)
{
	return mix(mix(mix(mix(mix(mix(a) ^ b) ^ c) ^ d) ^ e) ^ f);
}

struct Rng {
	uint64_t s;
	explicit Rng(uint64_t seed) : s(seed) {}
	uint64_t next() { return mix(s++); }
	/* Uniform in [0, n). */
	uint64_t below(uint64_t n) { return n ? next() % n : 0; }
	uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
	bool chance(unsigned percent) { return below(100) < percent; }
};

/* Payload bytes: byte i of pattern (key) is byte i%8 of mix(key + i/8). */
inline uint8_t pattern_byte(uint64_t key, uint64_t i)
{
	return uint8_t(mix(key + i / 8) >> (8 * (i % 8)));
}
inline void pattern_fill(char *p, uint64_t len, uint64_t key, uint64_t start)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = char(pattern_byte(key, start + i));
}
/* First mismatching offset, or -1. */
inline int64_t pattern_check(const char *p, uint64_t len, uint64_t key, uint64_t start)
{
	for (uint64_t i = 0; i < len; i++)
		if (uint8_t(p[i]) != pattern_byte(key, start + i))
			return int64_t(i);
	return -1;
}

/* Channel kinds: slots 0..nrc-1 are plain RC QPs, then UC, RC on an SRQ,
 * XRC (XRC_SEND to the peer's XRC_RECV, into its XRC SRQ), UD. */
enum class Kind { Rc, Uc, SrqRc, Xrc, Ud };

struct Config {
	unsigned procs = 4;
	unsigned rounds = 200;
	unsigned max_ops = 16;  /* per channel per round */
	unsigned nrc = 2;       /* plain RC QPs per pair */
	uint64_t seed = 0;
	uint32_t ud_mtu = 1024; /* the port's active MTU, bytes */
	uint32_t max_inline = 128;

	unsigned slots() const { return nrc + 4; }
	Kind kind(unsigned slot) const
	{
		if (slot < nrc)
			return Kind::Rc;
		static constexpr Kind tail[] = {Kind::Uc, Kind::SrqRc, Kind::Xrc, Kind::Ud};
		return tail[slot - nrc];
	}
};

constexpr uint32_t window_bytes = 192 * 1024;  /* per incoming channel */
constexpr uint32_t read_area_bytes = 128 * 1024;
constexpr unsigned counters = 8;               /* FETCH_AND_ADD targets per process */
constexpr uint64_t max_len = 64 * 1024;

struct Op {
	enum ibv_wr_opcode opcode;
	uint32_t seq;
	uint32_t len;
	uint8_t nsge;       /* 0..3 */
	bool inl;
	bool signaled;
	uint32_t imm;       /* host order */
	/* The payload (SEND*, WRITE*) or what a READ must return:
	 * pattern(pkey) from offset pstart. */
	uint64_t pkey;
	uint64_t pstart;
	uint32_t win_off;   /* WRITE*: target offset in the window; READ of the window too */
	bool read_window;   /* READ: from the window (read-back), else the read area */
	uint32_t read_off;  /* READ: offset in the read area */
	unsigned counter;   /* FETCH_AND_ADD */
	uint64_t add;
	uint64_t cmp, swp, expect_old; /* CMP_AND_SWP on the channel's word of the round */

	bool consumes_recv() const
	{
		return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
		       opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	}
};

/* What the owner of a read area holds: pattern(read_area_key(owner)). */
inline uint64_t read_area_key(uint64_t seed, unsigned owner) { return key_of(seed, 0xa11ea, owner); }

inline std::vector<Op> schedule(const Config &c, unsigned round, unsigned src, unsigned dst,
				unsigned slot)
{
	Rng r(key_of(c.seed, round, src, dst, slot, 0x5c4ed));
	const Kind kind = c.kind(slot);
	std::vector<Op> ops(r.below(c.max_ops + 1));
	uint32_t win = uint32_t(r.below(8)); /* start misaligned at times */
	uint64_t cas_value = 0;
	unsigned unsignaled_run = 0;
	std::vector<size_t> writes; /* earlier WRITEs of this round, for read-back */
	for (size_t i = 0; i < ops.size(); i++) {
		Op &o = ops[i];
		o = Op{};
		o.seq = uint32_t(i);
		unsigned w = unsigned(r.below(100));
		switch (kind) {
		case Kind::Ud:
			o.opcode = w < 55 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
			break;
		case Kind::Uc:
			o.opcode = w < 30 ? IBV_WR_SEND : w < 50 ? IBV_WR_SEND_WITH_IMM
				 : w < 75 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
			break;
		default:
			o.opcode = w < 18 ? IBV_WR_SEND : w < 32 ? IBV_WR_SEND_WITH_IMM
				 : w < 50 ? IBV_WR_RDMA_WRITE : w < 62 ? IBV_WR_RDMA_WRITE_WITH_IMM
				 : w < 78 ? IBV_WR_RDMA_READ : w < 92 ? IBV_WR_ATOMIC_FETCH_AND_ADD
				 : IBV_WR_ATOMIC_CMP_AND_SWP;
			break;
		}
		unsigned sz = unsigned(r.below(100));
		o.len = sz < 8 ? 0 : sz < 40 ? uint32_t(r.range(1, 64))
			: sz < 70 ? uint32_t(r.range(65, 4096)) : sz < 90 ? uint32_t(r.range(4097, 16384))
			: uint32_t(r.range(16385, max_len));
		if (kind == Kind::Ud)
			o.len %= c.ud_mtu + 1;
		o.imm = uint32_t(r.next());
		o.pkey = key_of(c.seed, round, src, dst, slot, 0x10000 + i);
		bool write = o.opcode == IBV_WR_RDMA_WRITE || o.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		if (write && win + o.len > window_bytes)
			o.opcode = IBV_WR_SEND; /* the window is full for this round */
		switch (o.opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			o.win_off = win;
			win += o.len + uint32_t(r.below(16));
			writes.push_back(i);
			break;
		case IBV_WR_RDMA_READ:
			if (!writes.empty() && r.chance(40)) {
				/* Read back part of an earlier WRITE of this round. */
				const Op &wr = ops[writes[r.below(writes.size())]];
				uint32_t from = uint32_t(r.below(wr.len + 1));
				o.len = uint32_t(r.below(wr.len - from + 1));
				o.read_window = true;
				o.win_off = wr.win_off + from;
				o.pkey = wr.pkey;
				o.pstart = from;
			} else {
				o.len = std::min<uint32_t>(o.len, read_area_bytes);
				o.read_off = uint32_t(r.below(read_area_bytes - o.len + 1));
				o.pkey = read_area_key(c.seed, dst);
				o.pstart = o.read_off;
			}
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			o.len = 8;
			o.counter = unsigned(r.below(counters));
			o.add = r.range(1, 1u << 20);
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			o.len = 8;
			o.expect_old = cas_value;
			o.cmp = r.chance(70) ? cas_value : cas_value + 1 + r.below(5);
			o.swp = r.next();
			if (o.cmp == cas_value)
				cas_value = o.swp;
			break;
		default:
			break;
		}
		bool atomic = o.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
			      o.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
		if (atomic)
			o.nsge = 1;
		else if (o.len == 0)
			o.nsge = uint8_t(r.below(2));
		else
			o.nsge = uint8_t(1 + r.below(std::min<uint32_t>(3, o.len)));
		o.inl = !atomic && o.opcode != IBV_WR_RDMA_READ && o.len <= c.max_inline &&
			r.chance(50);
		o.signaled = r.chance(65) || i + 1 == ops.size() || unsignaled_run >= 6;
		unsignaled_run = o.signaled ? 0 : unsignaled_run + 1;
	}
	return ops;
}

/* The final value of the channel's CMP_AND_SWP word for the round. */
inline uint64_t cas_final(const std::vector<Op> &ops)
{
	uint64_t v = 0;
	for (const Op &o : ops)
		if (o.opcode == IBV_WR_ATOMIC_CMP_AND_SWP && o.cmp == v)
			v = o.swp;
	return v;
}

/* Critical sections (CMP_AND_SWP lock at the round's holder) of a sender. */
inline unsigned critical_sections(const Config &c, unsigned round, unsigned src)
{
	if (src == round % c.procs)
		return 0; /* the holder only owns the lock */
	Rng r(key_of(c.seed, round, src, 0xc5));
	return unsigned(r.below(3));
}

/* Between rounds, a pair's QPs of a slot may be reset and reconnected, or
 * destroyed and created anew (new numbers), by both sides. */
enum class Churn { None, Reset, Recreate };

inline Churn churn(const Config &c, unsigned round, unsigned a, unsigned b, unsigned slot)
{
	if (round == 0 || c.kind(slot) == Kind::Ud)
		return Churn::None;
	Rng r(key_of(c.seed, round, std::min(a, b), std::max(a, b), slot, 0xc4c4));
	unsigned w = unsigned(r.below(100));
	return w < 2 ? Churn::Reset : w < 4 ? Churn::Recreate : Churn::None;
}

} // namespace stress
