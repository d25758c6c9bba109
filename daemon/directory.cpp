/* SPDX-License-Identifier: MIT */
#include "directory.h"

#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace shmverbs::broker {

Directory::Directory(uint32_t id_limit, IdMarks start, std::function<void(const IdMarks &)> save)
	: id_limit_(id_limit), save_marks_(std::move(save)), marks_(std::move(start))
{
	for (auto &[k, next] : marks_) {
		if (next < first_object_id || next >= id_limit_)
			next = first_object_id; /* not ours to trust: from the start */
		spaces_[k].next = next;
	}
}

uint32_t Directory::advance(uint32_t n, uint32_t by) const
{
	const uint64_t range = id_limit_ - first_object_id;
	return first_object_id + uint32_t((uint64_t(n - first_object_id) + by) % range);
}

void Directory::keep_mark(uint64_t k, IdSpace &space, uint32_t n)
{
	if (!save_marks_)
		return;
	const uint32_t range = id_limit_ - first_object_id;
	const uint32_t step = std::min(mark_step, range / 2);
	if (space.saved && (n + range - space.saved_at) % range < step)
		return; /* behind the mark saved last */
	space.saved = true;
	space.saved_at = n;
	marks_[k] = advance(n, step);
	save_marks_(marks_);
}

Directory::Key Directory::key_of(uint32_t device, uint8_t kind, uint32_t id)
{
	return (uint64_t(device) << 32) | (uint64_t(kind) << 24) | id;
}

int Directory::check_name(const ObjectName &object) const
{
	if (object.device >= max_devices || !valid_object_kind(object.kind))
		return EINVAL;
	if (object.id < first_object_id || object.id >= id_limit_)
		return EINVAL;
	return 0;
}

void Directory::add_client(ClientId client, pid_t pid)
{
	clients_[client].pid = pid;
}

std::vector<ClientId> Directory::remove_client(ClientId client)
{
	auto it = clients_.find(client);
	if (it == clients_.end())
		return {};
	Client gone = std::move(it->second);
	clients_.erase(it);

	for (Key key : gone.objects)
		drop_object(key);
	for (uint64_t seg : gone.segments)
		segments_.erase(seg);

	std::vector<ClientId> notify;
	for (ClientId w : gone.watchers) {
		if (clients_.count(w))
			notify.push_back(w);
	}
	/* Nobody can be told about the departed client later. */
	for (auto &[id, c] : clients_)
		c.watchers.erase(client);
	return notify;
}

int Directory::alloc_id(ClientId client, uint32_t device, uint8_t kind, uint32_t *id)
{
	auto c = clients_.find(client);
	if (c == clients_.end())
		return ENOENT;
	if (device >= max_devices || !valid_object_kind(kind))
		return EINVAL;
	IdSpace &space = spaces_[key_of(device, kind, 0)];
	if (space.in_use >= id_limit_ - first_object_id)
		return ENOSPC;
	/* Round-robin, so that a freed number comes back only after the whole
	 * space went round: a late message for a destroyed QP must not reach
	 * its successor. */
	uint32_t n = space.next;
	while (objects_.count(key_of(device, kind, n))) {
		if (++n >= id_limit_)
			n = first_object_id;
	}
	keep_mark(key_of(device, kind, 0), space, n);
	space.next = n + 1 >= id_limit_ ? first_object_id : n + 1;
	space.in_use++;
	ids_handed_out_++;

	Key key = key_of(device, kind, n);
	objects_[key].owner = client;
	c->second.objects.insert(key);
	*id = n;
	return 0;
}

Directory::Object *Directory::owned_object(ClientId client, const ObjectName &object, int *err)
{
	if ((*err = check_name(object)))
		return nullptr;
	auto it = objects_.find(key_of(object.device, object.kind, object.id));
	if (it == objects_.end()) {
		*err = ENOENT;
		return nullptr;
	}
	if (it->second.owner != client) {
		*err = EPERM;
		return nullptr;
	}
	return &it->second;
}

void Directory::unpublish(Object &obj)
{
	if (!obj.segment)
		return;
	auto seg = segments_.find(obj.segment);
	if (seg != segments_.end())
		seg->second.published--;
	obj.segment = 0;
	obj.offset = 0;
	published_--;
}

void Directory::drop_object(Key key)
{
	auto it = objects_.find(key);
	if (it == objects_.end())
		return;
	unpublish(it->second);
	spaces_[key & ~Key(0xffffff)].in_use--;
	objects_.erase(it); /* closes the attached descriptors */
}

int Directory::free_id(ClientId client, const ObjectName &object)
{
	int err;
	if (!owned_object(client, object, &err))
		return err;
	Key key = key_of(object.device, object.kind, object.id);
	clients_[client].objects.erase(key);
	drop_object(key);
	return 0;
}

int Directory::register_segment(ClientId client, UniqueFd fd, uint64_t *segment, uint64_t *size)
{
	auto c = clients_.find(client);
	if (c == clients_.end())
		return ENOENT;
	struct stat st;
	if (!fd || ::fstat(fd.get(), &st) != 0)
		return EBADF;
	/* A memfd or a file in a tmpfs: something both sides can mmap. */
	if (!S_ISREG(st.st_mode))
		return EINVAL;
	uint64_t handle = next_segment_++;
	Segment &seg = segments_[handle];
	seg.owner = client;
	seg.fd = std::move(fd);
	c->second.segments.insert(handle);
	*segment = handle;
	*size = uint64_t(st.st_size);
	return 0;
}

int Directory::unregister_segment(ClientId client, uint64_t segment)
{
	auto it = segments_.find(segment);
	if (it == segments_.end())
		return ENOENT;
	if (it->second.owner != client)
		return EPERM;
	if (it->second.published)
		return EBUSY;
	segments_.erase(it);
	clients_[client].segments.erase(segment);
	return 0;
}

int Directory::publish(ClientId client, const ObjectName &object, uint64_t segment,
		       uint64_t offset)
{
	int err;
	Object *obj = owned_object(client, object, &err);
	/* A number nobody holds: taken if the rest is right. */
	const bool adopt = !obj && err == ENOENT && clients_.count(client);
	if (!obj && !adopt)
		return err;
	auto seg = segments_.find(segment);
	if (seg == segments_.end())
		return ENOENT;
	if (seg->second.owner != client)
		return EPERM;
	struct stat st;
	if (::fstat(seg->second.fd.get(), &st) != 0)
		return errno;
	if (offset >= uint64_t(st.st_size))
		return EINVAL;
	if (adopt) {
		const Key key = key_of(object.device, object.kind, object.id);
		obj = &objects_[key];
		obj->owner = client;
		clients_[client].objects.insert(key);
		spaces_[key_of(object.device, object.kind, 0)].in_use++;
	}
	unpublish(*obj);
	obj->segment = segment;
	obj->offset = offset;
	seg->second.published++;
	published_++;
	return 0;
}

int Directory::resolve(ClientId client, const ObjectName &object, Resolution *out)
{
	if (int err = check_name(object))
		return err;
	auto it = objects_.find(key_of(object.device, object.kind, object.id));
	if (it == objects_.end() || !it->second.segment)
		return ENOENT;
	const Object &obj = it->second;
	const Segment &seg = segments_.at(obj.segment);
	Client &owner = clients_.at(obj.owner);
	struct stat st;
	if (::fstat(seg.fd.get(), &st) != 0)
		return errno;
	if (client != obj.owner)
		owner.watchers.insert(client);
	out->owner_pid = owner.pid;
	out->segment = obj.segment;
	out->offset = obj.offset;
	out->size = uint64_t(st.st_size);
	out->fd = seg.fd.get();
	return 0;
}

namespace {

/* Both descriptors name the same open file. A memfd (a regular file) is
 * known by its inode; anything else (eventfds share one anonymous inode)
 * needs kcmp(2), and without it nothing is shared. */
bool same_file(int a, int b, const struct stat &st)
{
	if (S_ISREG(st.st_mode))
		return true;
	pid_t self = ::getpid();
	return ::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b) == 0;
}

} // namespace

std::shared_ptr<const Directory::AttachedFile> Directory::share_file(Client &c, UniqueFd fd)
{
	struct stat st;
	if (::fstat(fd.get(), &st) != 0)
		return std::make_shared<const AttachedFile>(AttachedFile{std::move(fd), next_file_id_++});
	auto id = std::make_pair(st.st_dev, st.st_ino);
	auto [first, last] = c.files.equal_range(id);
	for (auto it = first; it != last;) {
		std::shared_ptr<const AttachedFile> held = it->second.lock();
		if (!held) {
			it = c.files.erase(it); /* its objects are gone */
			continue;
		}
		if (same_file(held->fd.get(), fd.get(), st))
			return held; /* `fd` is closed */
		++it;
	}
	auto fresh = std::make_shared<const AttachedFile>(AttachedFile{std::move(fd), next_file_id_++});
	c.files.emplace(id, fresh);
	return fresh;
}

int Directory::attach_fd(ClientId client, const ObjectName &object, uint32_t slot, UniqueFd fd)
{
	int err;
	Object *obj = owned_object(client, object, &err);
	if (!obj)
		return err;
	if (slot >= fd_slots)
		return EINVAL;
	if (!fd)
		return EBADF;
	obj->fds[slot] = share_file(clients_.at(client), std::move(fd));
	return 0;
}

int Directory::fetch_fd(ClientId client, const ObjectName &object, uint32_t slot, int *fd,
			pid_t *owner_pid, uint64_t *file_id)
{
	if (int err = check_name(object))
		return err;
	if (slot >= fd_slots)
		return EINVAL;
	auto it = objects_.find(key_of(object.device, object.kind, object.id));
	if (it == objects_.end())
		return ENOENT;
	const Object &obj = it->second;
	if (!obj.fds[slot])
		return ENODATA;
	Client &owner = clients_.at(obj.owner);
	if (client != obj.owner)
		owner.watchers.insert(client);
	*fd = obj.fds[slot]->fd.get();
	if (file_id)
		*file_id = obj.fds[slot]->id;
	*owner_pid = owner.pid;
	return 0;
}

DirectoryStats Directory::stats() const
{
	DirectoryStats s;
	s.clients = uint32_t(clients_.size());
	for (auto &[key, space] : spaces_)
		s.ids_in_use += space.in_use;
	s.segments = uint32_t(segments_.size());
	s.published = published_;
	s.ids_handed_out = ids_handed_out_;
	return s;
}

} // namespace shmverbs::broker
