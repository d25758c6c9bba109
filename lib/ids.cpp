/* SPDX-License-Identifier: MIT */
#include "ids.h"
#include "broker_client.h"
#include "device.h"
#include "log.h"

#include <map>
#include <mutex>
#include <set>
#include <cstring>
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

broker::ObjectKind broker_kind(IdKind kind)
{
	return kind == IdKind::Qp ? broker::ObjectKind::Qp : broker::ObjectKind::Srq;
}

/* Numbers handed out locally because no broker could be reached. */
std::set<std::pair<uint32_t, uint32_t>> local_ids;

uint32_t allocate_local(Device &dev, IdKind kind)
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

} // namespace

/*
 * The broker hands out numbers unique on the device across processes. When
 * no broker can be reached at all (none installed, runtime directory
 * unusable) the QP still works within this process with a local number:
 * logged once, since other processes cannot reach it then.
 */
uint32_t allocate_id(Device &dev, IdKind kind)
{
	uint32_t id = 0;
	int err = BrokerClient::instance().alloc_id(dev.index, broker_kind(kind), &id);
	if (err == 0)
		return id;
	if (err == ENOSPC)
		return 0;
	static std::once_flag warned;
	std::call_once(warned, [err] {
		log_error("no broker (%s): QPs and SRQs are reachable within this process only",
			  std::strerror(err));
	});
	id = allocate_local(dev, kind);
	if (id) {
		std::lock_guard guard(lock);
		local_ids.insert({uint32_t(kind) << 28 | dev.index, id});
	}
	return id;
}

void release_id(Device &dev, IdKind kind, uint32_t id)
{
	{
		std::lock_guard guard(lock);
		if (local_ids.erase({uint32_t(kind) << 28 | dev.index, id})) {
			spaces[{dev.index, kind}].used.erase(id);
			return;
		}
	}
	BrokerClient::instance().free_id({dev.index, broker_kind(kind), id});
}

} // namespace shmverbs
