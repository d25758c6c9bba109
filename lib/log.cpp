/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace shmverbs {

namespace {
void vlog(const char *fmt, va_list ap)
{
	char buf[512];
	std::vsnprintf(buf, sizeof(buf), fmt, ap);
	std::fprintf(stderr, "shmverbs: %s\n", buf);
}
} // namespace

bool debug_enabled()
{
	static const bool on = [] {
		const char *v = std::getenv("SHMVERBS_DEBUG");
		return v && *v && *v != '0';
	}();
	return on;
}

void log_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

void log_debug(const char *fmt, ...)
{
	if (!debug_enabled())
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

} // namespace shmverbs
