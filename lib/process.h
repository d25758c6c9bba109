/* SPDX-License-Identifier: MIT */
/*
 * Whether another process can still act: used where a peer's death must not
 * hang anyone (key holders of an MR, producers of a CQ entry).
 */
#pragma once

#include <sys/types.h>

namespace shmverbs {

/* True when pid can no longer touch anything: gone, or a zombie whose
 * threads have all exited (killed, not yet reaped by its parent). A zombie
 * group leader with live threads is alive. Reads /proc for a process that
 * still exists: not for a hot path. */
bool process_gone(pid_t pid);

} // namespace shmverbs
