/* SPDX-License-Identifier: MIT */
/*
 * The copy of a large payload shared with a helper thread on another CPU,
 * as a NIC's DMA engines move a large WR beside the CPU that posted it.
 *
 * One core's memcpy() is the ceiling of a copy made by the posting thread
 * alone (32.9 GB/s for 1 MiB on the Intel VM of docs/bench, where a 64 KiB
 * copy runs at 45 GB/s from the core's own cache). From copy_split_min up,
 * the payload is cut into 64 KiB chunks: the posting thread copies from the
 * front, a helper thread from the back, and the post returns once both are
 * done, so what the WR's completion promises is unchanged. The helper waits
 * 100 us for the next job (spinning, then yielding its CPU) and then sleeps
 * on a futex; a posting thread whose helper does not get its CPU in time (a
 * peer polling there) copies alone for a while. SHMVERBS_COPY_HELPER=0, or a
 * process allowed a single CPU, copies alone always. docs/architecture.md,
 * "Large copies".
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace shmverbs {

/* Payloads at least this long go through copy_split(). */
inline constexpr size_t copy_split_min = 256 * 1024;

/* memcpy(to, from, n), the work shared with the helper when it can run. */
void copy_split(void *to, const void *from, size_t n);

/* How many chunks this process's helper has copied (for tests). */
uint64_t copy_split_helper_chunks();

} // namespace shmverbs
