/* SPDX-License-Identifier: MIT */
/*
 * Holds counted by process, in shared memory: what lets a waiter tell a
 * hold it must wait for from one a dead process left behind.
 *
 * An entry is `pid << 32 | count`, 0 when never used. A process counts a
 * hold into the entry with its pid, or claims one whose count is 0: such an
 * entry holds nothing, whatever pid it names (its last user leaves it so,
 * to count in again with one CAS), and any process may take it over. While
 * a process lives only its own threads change an entry with its pid. All
 * entries taken, the caller counts the hold anonymously somewhere else,
 * which a waiter can only wait out with a bound. Users: a remote key's
 * slot (KeySlot, lib/mr.h: ibv_dereg_mr waits) and a QP's descriptor
 * (shm::QpDesc: ibv_destroy_qp and the reset wait).
 */
#pragma once

#include <atomic>
#include <cstdint>

namespace shmverbs {

constexpr unsigned holder_entries = 6;
using HolderEntries = std::atomic<uint64_t>[holder_entries];
/* count_in()'s answer when every entry is another process's. */
constexpr int holder_anonymous = -1;

constexpr uint32_t holder_pid(uint64_t entry) { return uint32_t(entry >> 32); }
constexpr uint32_t holder_count(uint64_t entry) { return uint32_t(entry); }

/* Counts one hold of process `pid` into `h`: the entry's index, or
 * holder_anonymous (nothing counted). seq_cst: the Dekker pair with a
 * waiter, who withdraws what the hold is for and then loads the counts,
 * while the holder counts in and then checks it is still there. */
inline int count_in(HolderEntries &h, uint32_t pid)
{
	/* Our own entry: a failed CAS on it just means "again". */
	for (unsigned i = 0; i < holder_entries; i++) {
		uint64_t v = h[i].load(std::memory_order_relaxed);
		while (v && holder_pid(v) == pid)
			if (h[i].compare_exchange_weak(v, v + 1, std::memory_order_seq_cst))
				return int(i);
	}
	/* Else one nobody holds anything in (its last user's own CAS on it
	 * fails if we win). */
	for (unsigned i = 0; i < holder_entries; i++) {
		uint64_t v = h[i].load(std::memory_order_relaxed);
		while (holder_count(v) == 0)
			if (h[i].compare_exchange_weak(v, uint64_t(pid) << 32 | 1,
						       std::memory_order_seq_cst))
				return int(i);
	}
	return holder_anonymous;
}

/* Gives back a hold count_in() put into entry `i` (not holder_anonymous).
 * At count 0 the entry keeps the pid. */
inline void count_out(HolderEntries &h, int i) { h[i].fetch_sub(1, std::memory_order_release); }

/* Whether any entry counts a hold, without asking who holds it. */
bool any_holds(const HolderEntries &h);

/* Whether an entry counts a hold of a process that may still act
 * (process_gone(): system calls, a /proc read for a process that exists).
 * Clears the entries of processes that are gone, logging (`what`, `id`)
 * the holds they died with. */
bool live_holds(HolderEntries &h, const char *what, uint32_t id);

} // namespace shmverbs
