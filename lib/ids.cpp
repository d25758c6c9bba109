/* SPDX-License-Identifier: MIT */
#include "ids.h"
#include "device.h"

#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace shmverbs {

namespace {

constexpr uint32_t first_id = 2;
constexpr uint32_t id_space = 1u << 24;

struct Space {
	uint32_t next = first_id;
	std::set<uint32_t> used;
};

std::mutex lock;
std::map<std::pair<uint32_t, IdKind>, Space> spaces;

} // namespace

uint32_t allocate_id(Device &dev, IdKind kind)
{
	std::lock_guard guard(lock);
	Space &s = spaces[{dev.index, kind}];
	if (s.used.size() >= id_space - first_id)
		return 0;
	/* Hand numbers out round-robin so a destroyed QP's number is not
	 * reused at once: a late packet for the old QP must not reach a new one. */
	while (s.used.count(s.next)) {
		if (++s.next >= id_space)
			s.next = first_id;
	}
	uint32_t id = s.next;
	s.used.insert(id);
	if (++s.next >= id_space)
		s.next = first_id;
	return id;
}

void release_id(Device &dev, IdKind kind, uint32_t id)
{
	std::lock_guard guard(lock);
	spaces[{dev.index, kind}].used.erase(id);
}

} // namespace shmverbs
