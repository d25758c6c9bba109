/* SPDX-License-Identifier: MIT */
#include "process.h"

#include "holders.h"
#include "log.h"

#include <dirent.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace shmverbs {

bool process_gone(pid_t pid)
{
	if (pid <= 0)
		return false;
	if (::kill(pid, 0) != 0)
		return errno == ESRCH;
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
	FILE *f = std::fopen(path, "re");
	if (!f)
		return errno == ENOENT;
	char buf[512];
	size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
	std::fclose(f);
	buf[n] = 0;
	/* "pid (comm) S ...": comm may hold anything, the state follows the
	 * last ')'. */
	const char *paren = std::strrchr(buf, ')');
	if (!paren || paren[1] != ' ' || (paren[2] != 'Z' && paren[2] != 'X'))
		return false;
	std::snprintf(path, sizeof(path), "/proc/%d/task", int(pid));
	DIR *d = opendir(path);
	if (!d)
		return true;
	unsigned tasks = 0;
	while (struct dirent *e = readdir(d))
		tasks += e->d_name[0] != '.';
	closedir(d);
	return tasks <= 1;
}

bool any_holds(const HolderEntries &h)
{
	for (const std::atomic<uint64_t> &e : h)
		if (holder_count(e.load(std::memory_order_seq_cst)))
			return true;
	return false;
}

bool live_holds(HolderEntries &h, const char *what, uint32_t id)
{
	bool live = false;
	for (std::atomic<uint64_t> &e : h) {
		uint64_t v = e.load(std::memory_order_seq_cst);
		if (!v)
			continue;
		const pid_t pid = pid_t(holder_pid(v));
		if (!process_gone(pid)) {
			live = live || holder_count(v) != 0;
			continue;
		}
		/* Nobody else writes a dead pid's entry: the CAS only fails if
		 * the pid was reused by a live process already counted in. (A
		 * count of 0: it died between its last release and freeing the
		 * entry, which is freed for others all the same.) */
		if (e.compare_exchange_strong(v, 0, std::memory_order_seq_cst)) {
			if (holder_count(v))
				log_debug("%s 0x%x: released %u hold(s) of process %d, which died holding it",
					  what, id, holder_count(v), int(pid));
		} else {
			live = true;
		}
	}
	return live;
}

} // namespace shmverbs
