/* SPDX-License-Identifier: MIT */
/*
 * Diagnostics. Errors always go to stderr prefixed "shmverbs:"; debug output
 * only when SHMVERBS_DEBUG is set, so a library loaded under an unmodified
 * program stays silent unless something is wrong.
 */
#pragma once

namespace shmverbs {

void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool debug_enabled();

} // namespace shmverbs
