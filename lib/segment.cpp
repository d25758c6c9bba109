/* SPDX-License-Identifier: MIT */
#include "segment.h"

#include "fork.h"
#include "log.h"
#include "remote_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <future>
#include <thread>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <tuple>

namespace shmverbs {

namespace {

constexpr uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t(63); }

std::mutex segments_lock;
Segment *segments[64];
/* Fds attached to every object we publish (attach_process_fd), -1 if none. */
std::atomic<int> process_fds[broker::fd_slots] = {-1, -1, -1, -1};

/*
 * Peer cache: mapped segments by (pid, handle); objects by (dev, kind, id).
 * The broker client's reader thread (on_broker_event) and the progress
 * thread use it until the process ends, after static destructors ran: it
 * is allocated once and never destroyed.
 */
struct PeerCache {
	std::mutex lock;
	std::map<std::pair<pid_t, uint64_t>, std::shared_ptr<PeerSegment>> segments;
	std::map<std::tuple<uint32_t, uint8_t, uint32_t>, PeerObject> objects;
	/* A peer's CQ channel eventfds by object (null: the object has no
	 * channel), and by (owner pid, broker generation, the broker's file
	 * identity): one descriptor per channel, shared by all the owner's
	 * objects attached to it (a CQ serves thousands of QPs; a descriptor
	 * per QP would exhaust RLIMIT_NOFILE). */
	std::map<std::tuple<uint32_t, uint8_t, uint32_t>, std::shared_ptr<const ChannelFd::Owned>>
		channel_fds;
	std::map<std::tuple<pid_t, uint64_t, uint64_t>, std::weak_ptr<const ChannelFd::Owned>>
		channel_files;
};

PeerCache *&peer_cache()
{
	static PeerCache *cache = new PeerCache; /* never freed, see above */
	return cache;
}

PeerCache &peers() { return *peer_cache(); }

void on_broker_event(const BrokerEvent &e)
{
	if (e.type == BrokerEvent::Type::BrokerLost) {
		/* What we published went with the broker: a peer that looks
		 * for it now would not find it until this process publishes
		 * again, which a server that created everything at start never
		 * does. Say it all again at once, from a thread of its own
		 * (this, the client's reader thread, cannot call the broker). */
		std::thread(Segment::republish_all).detach();
		return;
	}
	if (e.type != BrokerEvent::Type::PeerGone)
		return;
	forget_peer_memory(e.pid);
	PeerCache &pc = peers();
	std::lock_guard guard(pc.lock);
	/* Its segments leave the cache: each is unmapped and its fds closed
	 * once no operation holds it any more (~PeerSegment), so a process
	 * talking to many short-lived peers keeps nothing of theirs. */
	for (auto it = pc.segments.begin(); it != pc.segments.end();) {
		if (!it->second || it->second->pid == e.pid) {
			if (it->second)
				it->second->gone.store(true, std::memory_order_release);
			it = pc.segments.erase(it);
		} else {
			++it;
		}
	}
	/* Numbers of the departed process may be reused: forget them. */
	for (auto it = pc.objects.begin(); it != pc.objects.end();)
		it = it->second.seg->pid == e.pid ? pc.objects.erase(it) : std::next(it);
	/* Its channel eventfds: closed when the last ChannelFd goes. */
	for (auto it = pc.channel_fds.begin(); it != pc.channel_fds.end();)
		it = it->second && it->second->owner == e.pid ? pc.channel_fds.erase(it)
							      : std::next(it);
	for (auto it = pc.channel_files.begin(); it != pc.channel_files.end();)
		it = std::get<0>(it->first) == e.pid ? pc.channel_files.erase(it) : std::next(it);
}

/*
 * Lock order: peers().lock before a Segment's lock_ (resolve_object() asks
 * our own segment for its lock fd under peers().lock), never the reverse.
 * Installing the handler takes neither, so Segment::publish() can do it
 * while it holds lock_.
 */
void install_handler()
{
	static std::once_flag once;
	std::call_once(once, [] { BrokerClient::instance().set_event_handler(on_broker_event); });
}

/*
 * The owner-alive word of a segment header (shm_layout.h): a robust,
 * process-shared mutex that a thread of ours locks and holds until the
 * process ends, so that the kernel marks it (FUTEX_OWNER_DIED, TID bits
 * cleared) when we die, however we die. The thread blocks every signal and
 * sleeps for good; it is never joined.
 */
static_assert(sizeof(pthread_mutex_t) <= sizeof(shm::SegmentHeader::owner_alive));
static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0,
	      "peers read the futex word at the start of the mutex");

void hold_owner_alive(shm::SegmentHeader &hdr)
{
	auto *m = reinterpret_cast<pthread_mutex_t *>(hdr.owner_alive);
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
	std::promise<void> held;
	std::future<void> ready = held.get_future();
	std::thread([m, &held] {
		sigset_t all;
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, nullptr);
		pthread_mutex_lock(m);
		held.set_value();
		for (;;)
			::pause();
	}).detach();
	ready.wait(); /* peers never see the word before it is held */
}

} // namespace

double time_scale()
{
	static const double scale = [] {
		const char *s = std::getenv("SHMVERBS_TIME_SCALE");
		double v = s ? std::strtod(s, nullptr) : 1.0;
		return v > 0 ? v : 1.0;
	}();
	return scale;
}

/* ---- Own segment ---- */

Segment::Segment(uint32_t device, int fd, char *base, uint64_t size)
	: device_(device), fd_(fd), base_(base), size_(size)
{
	next_ = align64(sizeof(shm::SegmentHeader));
}

Segment &Segment::of(uint32_t device_index)
{
	std::lock_guard guard(segments_lock);
	Segment *&s = segments[device_index % 64];
	if (s)
		return *s;
	char name[32];
	std::snprintf(name, sizeof(name), "shmverbs-seg-%u", device_index);
	int fd = memfd_create(name, MFD_CLOEXEC);
	uint64_t size = default_size;
	void *base = MAP_FAILED;
	if (fd >= 0 && ftruncate(fd, off_t(size)) == 0)
		base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED) {
		log_error("cannot create the shared segment: %s", std::strerror(errno));
		std::abort();
	}
	auto *hdr = static_cast<shm::SegmentHeader *>(base);
	hdr->magic = shm::segment_magic;
	hdr->version = shm::shm_version;
	hdr->size = size;
	hdr->owner_pid = int32_t(getpid());
	hdr->device = device_index;
	hold_owner_alive(*hdr);
	/* Never freed (peers and our own threads may use it until exit). */
	s = new Segment(device_index, fd, static_cast<char *>(base), size);
	return *s;
}

uint64_t Segment::alloc(uint64_t bytes)
{
	bytes = align64(bytes ? bytes : 1);
	std::lock_guard guard(lock_);
	auto it = free_.find(bytes);
	if (it != free_.end() && !it->second.empty()) {
		uint64_t off = it->second.back();
		it->second.pop_back();
		std::memset(base_ + off, 0, bytes);
		return off;
	}
	if (next_ + bytes > size_)
		return 0;
	uint64_t off = next_;
	next_ += bytes;
	return off; /* fresh memfd pages read as zero */
}

void Segment::free(uint64_t off, uint64_t bytes)
{
	if (!off)
		return;
	bytes = align64(bytes ? bytes : 1);
	/* The pages wholly inside the area go back to the system: a process
	 * that creates and destroys queues does not keep their memory. Their
	 * owner already made sure no peer is inside them (QpEngine::quiesce,
	 * CQ use counts); a late reader sees zeros, which fail every magic
	 * check. Reuse zeroes the area anyway (alloc). */
	static const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
	uint64_t first = (off + page - 1) & ~(page - 1);
	uint64_t end = (off + bytes) & ~(page - 1);
	if (end > first)
		fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(first),
			  off_t(end - first));
	std::lock_guard guard(lock_);
	free_[bytes].push_back(off);
}

int Segment::ensure_registered_locked(uint64_t *handle)
{
	BrokerClient &b = BrokerClient::instance();
	install_handler();
	if (int err = b.connect())
		return err;
	uint64_t gen = b.generation();
	if (broker_handle_ && gen == broker_generation_) {
		*handle = broker_handle_;
		return 0;
	}
	uint64_t h = 0;
	if (int err = b.register_segment(fd_, &h))
		return err;
	bool again = broker_handle_ != 0;
	broker_handle_ = h;
	broker_generation_ = gen;
	if (again) {
		/* A new broker: what we published is gone; say it again. */
		for (const Published &p : published_) {
			b.publish({device_, p.kind, p.id}, h, p.off);
			for (uint32_t slot = 0; slot < broker::fd_slots; slot++)
				if (p.fds[slot] >= 0)
					b.attach_fd({device_, p.kind, p.id}, slot, p.fds[slot]);
		}
	}
	*handle = h;
	return 0;
}

void Segment::republish_all()
{
	std::vector<Segment *> all;
	{
		std::lock_guard guard(segments_lock);
		for (Segment *s : segments)
			if (s)
				all.push_back(s);
	}
	for (Segment *s : all) {
		std::lock_guard guard(s->lock_);
		/* Never registered, or nothing to say: no broker needed. A
		 * failure leaves it to the next publish, as before. */
		if (!s->broker_handle_ || s->published_.empty())
			continue;
		uint64_t h;
		if (int err = s->ensure_registered_locked(&h))
			log_debug("broker lost: republishing device %u failed: %s", s->device_,
				  std::strerror(err));
	}
}

int Segment::publish(broker::ObjectKind kind, uint32_t id, uint64_t off)
{
	std::lock_guard guard(lock_);
	uint64_t h;
	if (int err = ensure_registered_locked(&h))
		return err;
	if (int err = BrokerClient::instance().publish({device_, kind, id}, h, off))
		return err;
	Published p{kind, id, off, {-1, -1, -1, -1}};
	/* Under lock_: pairs with attach_process_fd(), which sets the fd
	 * before it walks published_ under this lock. */
	for (uint32_t slot = 0; slot < broker::fd_slots; slot++) {
		int fd = process_fds[slot].load();
		if (fd >= 0 && BrokerClient::instance().attach_fd({device_, kind, id}, slot, fd) == 0)
			p.fds[slot] = fd;
	}
	published_.push_back(p);
	return 0;
}

int Segment::attach_process_fd(uint32_t slot, int fd)
{
	if (slot >= broker::fd_slots)
		return EINVAL;
	process_fds[slot].store(fd);
	std::vector<Segment *> all;
	{
		std::lock_guard guard(segments_lock);
		for (Segment *s : segments)
			if (s)
				all.push_back(s);
	}
	int result = 0;
	for (Segment *s : all) {
		std::lock_guard guard(s->lock_);
		for (Published &p : s->published_) {
			if (p.fds[slot] == fd)
				continue;
			int err = BrokerClient::instance().attach_fd({s->device_, p.kind, p.id}, slot, fd);
			if (err)
				result = err;
			else
				p.fds[slot] = fd;
		}
	}
	return result;
}

void Segment::withdraw(broker::ObjectKind kind, uint32_t id)
{
	std::lock_guard guard(lock_);
	for (auto it = published_.begin(); it != published_.end(); ++it) {
		if (it->kind == kind && it->id == id) {
			published_.erase(it);
			break;
		}
	}
}

int Segment::attach_fd(broker::ObjectKind kind, uint32_t id, uint32_t slot, int fd)
{
	std::lock_guard guard(lock_);
	if (int err = BrokerClient::instance().attach_fd({device_, kind, id}, slot, fd))
		return err;
	for (Published &p : published_)
		if (p.kind == kind && p.id == id && slot < broker::fd_slots)
			p.fds[slot] = fd; /* the fd outlives the object's publication */
	return 0;
}

int Segment::lock_fd()
{
	std::lock_guard guard(lock_);
	if (lock_fd_ < 0) {
		char path[64];
		std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd_);
		lock_fd_ = ::open(path, O_RDWR | O_CLOEXEC);
	}
	return lock_fd_;
}

void Segment::privatize_in_child()
{
	if (mmap(base_, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd_,
		 0) == MAP_FAILED)
		/* Still the parent's pages: make them unusable rather than shared. */
		mmap(base_, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		     -1, 0);
}

void fork_child::segments()
{
	for (Segment *&s : ::shmverbs::segments) {
		if (s)
			s->privatize_in_child(); /* left allocated: stale objects point into it */
		s = nullptr;
	}
	/* The locks may have been held by threads the child does not have. */
	new (&segments_lock) std::mutex;
	for (std::atomic<int> &fd : process_fds)
		fd.store(-1);
	peer_cache() = new PeerCache;
}

/* ---- Peers ---- */

PeerSegment::~PeerSegment()
{
	if (local)
		return; /* our own segment's mapping and fds */
	if (base)
		munmap(base, size);
	if (fd >= 0)
		::close(fd);
	if (lock_fd >= 0)
		::close(lock_fd);
}

ChannelFd::Owned::~Owned()
{
	if (fd >= 0)
		::close(fd);
}

int resolve_object(uint32_t device, broker::ObjectKind kind, uint32_t id, PeerObject &out,
		   bool refresh)
{
	auto key = std::make_tuple(device, uint8_t(kind), id);
	{
		install_handler();
		std::lock_guard guard(peers().lock);
		auto it = peers().objects.find(key);
		if (it != peers().objects.end()) {
			if (!refresh && !it->second.seg->gone.load(std::memory_order_acquire)) {
				out = it->second;
				uint64_t v = pack_object(device, kind, id);
				if (out.seg->via.load(std::memory_order_relaxed) != v)
					out.seg->via.store(v, std::memory_order_relaxed);
				return 0;
			}
			peers().objects.erase(it);
		}
	}
	ResolvedObject r;
	if (int err = BrokerClient::instance().resolve({device, kind, id}, &r))
		return err;

	std::lock_guard guard(peers().lock);
	auto &seg = peers().segments[{r.owner_pid, r.segment}];
	if (!seg || seg->gone.load()) {
		auto s = std::make_shared<PeerSegment>();
		s->pid = r.owner_pid;
		s->handle = r.segment;
		s->size = r.size;
		if (r.owner_pid == getpid()) {
			/* Our own segment: use the mapping we have. */
			Segment &own = Segment::of(device);
			s->base = own.at<char>(0);
			s->local = true;
			s->fd = own.fd();
			s->lock_fd = own.lock_fd();
			::close(r.fd);
		} else {
			void *base = mmap(nullptr, r.size, PROT_READ | PROT_WRITE,
					  MAP_SHARED | MAP_NORESERVE, r.fd, 0);
			if (base == MAP_FAILED) {
				int err = errno;
				::close(r.fd);
				return err;
			}
			auto *hdr = static_cast<shm::SegmentHeader *>(base);
			if (r.size < sizeof(shm::SegmentHeader) || hdr->magic != shm::segment_magic ||
			    hdr->version != shm::shm_version) {
				munmap(base, r.size);
				::close(r.fd);
				return EPROTO;
			}
			s->base = static_cast<char *>(base);
			s->fd = r.fd;
			char path[64];
			std::snprintf(path, sizeof(path), "/proc/self/fd/%d", r.fd);
			s->lock_fd = ::open(path, O_RDWR | O_CLOEXEC);
		}
		/* A replaced (gone) mapping stays mapped while threads hold it. */
		seg = s;
	} else {
		::close(r.fd);
	}
	if (r.offset >= seg->size)
		return EPROTO;
	out.seg = seg;
	out.off = r.offset;
	seg->via.store(pack_object(device, kind, id), std::memory_order_relaxed);
	peers().objects[key] = out;
	return 0;
}

void forget_object(uint32_t device, broker::ObjectKind kind, uint32_t id)
{
	std::lock_guard guard(peers().lock);
	peers().objects.erase(std::make_tuple(device, uint8_t(kind), id));
	/* A user in another thread keeps its ChannelFd (and the fd) open. */
	peers().channel_fds.erase(std::make_tuple(device, uint8_t(kind), id));
}

ChannelFd fetch_channel_fd(uint32_t device, broker::ObjectKind kind, uint32_t id)
{
	auto key = std::make_tuple(device, uint8_t(kind), id);
	PeerCache &pc = peers();
	{
		std::lock_guard guard(pc.lock);
		auto it = pc.channel_fds.find(key);
		if (it != pc.channel_fds.end())
			return ChannelFd(it->second);
	}
	int fd = -1;
	pid_t owner = 0;
	uint64_t file = 0;
	uint64_t generation = BrokerClient::instance().generation();
	std::shared_ptr<const ChannelFd::Owned> got;
	if (BrokerClient::instance().fetch_fd({device, kind, id}, 0, &fd, &owner, &file) == 0)
		got = std::make_shared<const ChannelFd::Owned>(fd, owner);
	std::lock_guard guard(pc.lock);
	if (got && file) {
		/* Another object of the owner's already brought this channel:
		 * keep that descriptor (ours closes as `got` goes). */
		auto &known = pc.channel_files[{owner, generation, file}];
		if (auto held = known.lock())
			got = held;
		else
			known = got;
	}
	/* Another thread may have cached one meanwhile: ours then closes. */
	auto [it, inserted] = pc.channel_fds.emplace(key, std::move(got));
	return ChannelFd(it->second);
}

} // namespace shmverbs
