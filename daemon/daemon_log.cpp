/* SPDX-License-Identifier: MIT */
#include "daemon_log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace shmverbs::broker {

namespace {

bool verbose_on = false;

void vlog(const char *fmt, va_list ap)
{
	char msg[512];
	std::vsnprintf(msg, sizeof(msg), fmt, ap);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	localtime_r(&ts.tv_sec, &tm);
	/* One write per line, so that lines of a shared log file never mix. */
	char line[640];
	int n = std::snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld shmverbsd[%d]: %s\n",
			      tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, int(getpid()),
			      msg);
	if (n > 0) {
		size_t len = size_t(n) < sizeof(line) ? size_t(n) : sizeof(line) - 1;
		ssize_t ignored = ::write(STDERR_FILENO, line, len);
		(void)ignored;
	}
}

} // namespace

void set_verbose(bool on)
{
	verbose_on = on;
}

void log_verbose(const char *fmt, ...)
{
	if (!verbose_on)
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

void log_always(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

} // namespace shmverbs::broker
