/* SPDX-License-Identifier: MIT */
#include "process.h"

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

} // namespace shmverbs
