/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log: lines "shmverbsd[pid]: ..." on stderr, which is the
 * terminal in --foreground mode, the --log-file otherwise, or /dev/null.
 * Errors are always written; the rest only with --verbose.
 */
#pragma once

namespace shmverbs::broker {

void set_verbose(bool on);
void log_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} // namespace shmverbs::broker
