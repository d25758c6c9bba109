/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues (basic and XRC) and XRC domains.
 *
 * XRC domains named by a file are shared, like the kernel's inode -> xrcd
 * table, by every context and every process that opens the same inode on
 * the same device. Within a process a registry maps the inode to the domain;
 * across processes each domain has a marker file in the runtime directory:
 *
 *   <runtime>/xrcd/<device>.<st_dev>.<st_ino>   8 bytes: the domain id
 *
 * Every open handle holds a shared OFD lock on byte 0 of it, through its own
 * open file description, so "the domain exists" is "someone holds byte 0"
 * (F_OFD_GETLK), and a process that dies releases its handles with its fds,
 * as the kernel closes a dead process's uverbs file. Byte 1 is taken
 * exclusively for the few system calls of an open or close, which makes the
 * check-then-create of O_CREAT/O_EXCL atomic as under the kernel's
 * xrcd_tree_mutex. No lock lives in shared memory; a later broker can read
 * the same files.
 */
#include "srq.h"
#include "abi_enum.h"
#include "srq_ring.h"
#include "device.h"
#include "fork.h"
#include "ids.h"
#include "log.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <type_traits>

namespace shmverbs {

static_assert(std::is_standard_layout_v<Srq> && offsetof(Srq, ibv) == 0,
	      "ibv_srq* is converted to Srq*");
static_assert(std::is_standard_layout_v<Xrcd> && offsetof(Xrcd, ibv) == 0,
	      "ibv_xrcd* is converted to Xrcd*");

namespace {

uint64_t new_domain_id()
{
	uint64_t id = 0;
	while (id == 0) {
		if (getrandom(&id, sizeof(id), 0) != sizeof(id)) {
			static std::atomic<uint64_t> fallback{0};
			id = (uint64_t(getpid()) << 32) ^ fallback.fetch_add(1) ^ uint64_t(time(nullptr));
		}
	}
	return id;
}

/* --- Runtime directory --- */

/* A private directory of ours: exists (or is created) with mode 0700 and
 * belongs to us. Anything else (another user's /tmp entry, a symlink) is
 * not trusted. */
bool private_dir(const std::string &path)
{
	if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
		return false;
	struct stat st;
	if (::lstat(path.c_str(), &st) != 0)
		return false;
	return S_ISDIR(st.st_mode) && st.st_uid == getuid() && !(st.st_mode & 0077);
}

/* Where cross-process XRCD markers live: $XDG_RUNTIME_DIR/shmverbs/xrcd or
 * /tmp/shmverbs-$UID/xrcd; empty when neither is usable, in which case
 * domains are shared within this process only. */
const std::string &xrcd_dir()
{
	static const std::string dir = [] {
		std::string base;
		const char *xdg = std::getenv("XDG_RUNTIME_DIR");
		if (xdg && *xdg)
			base = std::string(xdg) + "/shmverbs";
		else
			base = "/tmp/shmverbs-" + std::to_string(getuid());
		std::string sub = base + "/xrcd";
		if (!private_dir(base) || !private_dir(sub)) {
			log_debug("XRC domains are per-process: no usable runtime directory %s",
				  base.c_str());
			return std::string();
		}
		return sub;
	}();
	return dir;
}

std::string marker_path(const Context &ctx, const XrcdKey &key)
{
	char name[160];
	std::snprintf(name, sizeof(name), "/%s.%" PRIx64 ".%" PRIx64, ctx.device->ibv.name,
		      uint64_t(key.st_dev), uint64_t(key.st_ino));
	return xrcd_dir() + name;
}

/* --- Marker file locks (OFD locks: per open file description) --- */

constexpr off_t member_byte = 0; /* shared by every open handle */
constexpr off_t table_byte = 1;  /* exclusive during open/close */

int ofd_lock(int fd, short type, off_t byte, bool wait)
{
	struct flock fl{};
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = byte;
	fl.l_len = 1;
	for (;;) {
		if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
			return 0;
		if (errno != EINTR)
			return errno;
	}
}

/* Whether any other open file description holds the member byte. */
bool others_are_members(int fd)
{
	struct flock fl{};
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	fl.l_start = member_byte;
	fl.l_len = 1;
	if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
		return false;
	return fl.l_type != F_UNLCK;
}

/* Opens the domain's marker file with the table byte held. A closer may
 * unlink the file between our open() and our lock, so the name must still
 * lead to the file we locked; otherwise start over. */
int open_marker(const std::string &path, int &out)
{
	for (int attempt = 0; attempt < 1000; attempt++) {
		int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return errno;
		if (int err = ofd_lock(fd, F_WRLCK, table_byte, true)) {
			::close(fd);
			return err;
		}
		struct stat mine, named;
		if (fstat(fd, &mine) == 0 && ::stat(path.c_str(), &named) == 0 &&
		    mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
			out = fd;
			return 0;
		}
		::close(fd);
	}
	return EAGAIN;
}

/* --- The process-local registry --- */

struct DomainEntry {
	uint64_t domain;
	unsigned handles;
};

std::mutex registry_lock;
std::map<XrcdKey, DomainEntry> registry;

Result<Xrcd> open_named_xrcd(Context &ctx, int fd, int oflags)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return Err{EBADF};
	XrcdKey key{ctx.device->index, st.st_dev, st.st_ino};

	std::lock_guard guard(registry_lock);
	int marker = -1;
	const std::string path = xrcd_dir().empty() ? std::string() : marker_path(ctx, key);
	if (!path.empty()) {
		if (int err = open_marker(path, marker)) {
			log_debug("XRCD marker unavailable (%s): sharing within this process only",
				  strerror(err));
			marker = -1;
		}
	}
	/* A failed open leaves no marker behind unless the domain exists;
	 * closing the marker fd drops the table byte. */
	auto fail = [&](int err) -> Result<Xrcd> {
		if (marker >= 0) {
			if (!others_are_members(marker))
				::unlink(path.c_str());
			::close(marker);
		}
		return Err{err};
	};

	auto local = registry.find(key);
	bool here = local != registry.end();
	bool elsewhere = marker >= 0 && others_are_members(marker);
	/* ib_uverbs_open_xrcd(): no domain and no O_CREAT -> EAGAIN; a domain
	 * and O_EXCL -> EINVAL. */
	if (!here && !elsewhere && !(oflags & O_CREAT))
		return fail(EAGAIN);
	if ((here || elsewhere) && (oflags & O_EXCL))
		return fail(EINVAL);

	uint64_t domain = 0;
	if (here) {
		domain = local->second.domain;
	} else if (elsewhere) {
		if (::pread(marker, &domain, sizeof(domain), 0) != sizeof(domain) || !domain)
			return fail(EIO);
	} else {
		domain = new_domain_id();
		if (marker >= 0) {
			if (ftruncate(marker, 0) != 0)
				return fail(errno);
			if (::pwrite(marker, &domain, sizeof(domain), 0) != sizeof(domain))
				return fail(EIO);
		}
	}

	auto *x = new (std::nothrow) Xrcd{};
	if (!x)
		return fail(ENOMEM);
	if (marker >= 0) {
		if (int err = ofd_lock(marker, F_RDLCK, member_byte, false)) {
			delete x;
			return fail(err);
		}
		ofd_lock(marker, F_UNLCK, table_byte, false);
	}
	x->ibv.context = ctx.abi();
	x->ctx = &ctx;
	x->domain = domain;
	x->named = true;
	x->key = key;
	x->marker_fd = marker;
	if (here)
		local->second.handles++;
	else
		registry.emplace(key, DomainEntry{domain, 1});
	return x;
}

void close_named_xrcd(Xrcd &x)
{
	std::lock_guard guard(registry_lock);
	if (x.marker_fd >= 0) {
		/* With the table byte held nobody opens or closes the domain;
		 * the last member removes the marker so that a recycled inode
		 * number starts afresh. */
		if (ofd_lock(x.marker_fd, F_WRLCK, table_byte, true) == 0) {
			ofd_lock(x.marker_fd, F_UNLCK, member_byte, false);
			if (!others_are_members(x.marker_fd))
				::unlink(marker_path(*x.ctx, x.key).c_str());
		}
		::close(x.marker_fd);
	}
	auto it = registry.find(x.key);
	if (it != registry.end() && --it->second.handles == 0)
		registry.erase(it);
}

} // namespace

/* --- XRC domains --- */

Result<Xrcd> open_xrcd(Context &ctx, const struct ibv_xrcd_init_attr &attr)
{
	/* libibverbs' ibv_cmd_open_xrcd(). */
	if (attr.comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED)
		return Err{EOPNOTSUPP};
	if (!(attr.comp_mask & IBV_XRCD_INIT_ATTR_FD) ||
	    !(attr.comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
		return Err{EINVAL};
	if (attr.fd != -1)
		return open_named_xrcd(ctx, attr.fd, attr.oflags);

	/* fd -1: a new domain of its own; the kernel ignores oflags here. */
	auto *x = new (std::nothrow) Xrcd{};
	if (!x)
		return Err{ENOMEM};
	x->ibv.context = ctx.abi();
	x->ctx = &ctx;
	x->domain = new_domain_id();
	x->named = false;
	x->marker_fd = -1;
	return x;
}

int close_xrcd(Xrcd &xrcd)
{
	if (xrcd.uses.busy())
		return EBUSY;
	if (xrcd.named)
		close_named_xrcd(xrcd);
	delete &xrcd;
	return 0;
}

/* --- Shared receive queues --- */

Result<Srq> create_srq(Context &ctx, struct ibv_srq_init_attr_ex &attr)
{
	const uint32_t mask = attr.comp_mask;
	const uint32_t raw_type = (mask & IBV_SRQ_INIT_ATTR_TYPE) ? abi_enum_value(attr.srq_type)
								  : uint32_t{IBV_SRQT_BASIC};
	/* libmlx5's mlx5_create_srq_ex(), in its order. */
	if (raw_type != IBV_SRQT_BASIC && raw_type != IBV_SRQT_XRC && raw_type != IBV_SRQT_TM)
		return Err{EINVAL};
	const auto type = static_cast<enum ibv_srq_type>(raw_type);
	if (type == IBV_SRQT_TM) {
		/* A tag-matching SRQ reports through an extended CQ. */
		if (!attr.cq || to_context(attr.cq->context) != &ctx || !Cq::from(attr.cq)->extended)
			return Err{EINVAL};
		/* Tag matching is not emulated (query_device_ex reports no
		 * tm_caps). */
		return Err{EOPNOTSUPP};
	}
	uint32_t max_wr, max_sge;
	if (int err = ctx.device->profile->size_srq(attr.attr.max_wr, attr.attr.max_sge, max_wr,
						    max_sge))
		return Err{err};
	/* libibverbs' ibv_cmd_create_srq_ex() and the kernel's handle lookups.
	 * libmlx5 creates a basic SRQ through ibv_create_srq()'s command
	 * instead, which reads attr.pd and never comp_mask: neither unknown
	 * bits nor a missing PD bit refuse it there. librxe sends every type
	 * through ibv_cmd_create_srq_ex(). */
	const bool rxe = ctx.device->profile->is(ProfileKind::Rxe);
	if (type != IBV_SRQT_BASIC || rxe) {
		if (mask >= IBV_SRQ_INIT_ATTR_RESERVED)
			return Err{EOPNOTSUPP};
		if (!(mask & IBV_SRQ_INIT_ATTR_PD))
			return Err{EINVAL};
	}
	if (!attr.pd || to_context(attr.pd->context) != &ctx)
		return Err{EINVAL};
	Xrcd *xrcd = nullptr;
	Cq *cq = nullptr;
	if (type == IBV_SRQT_XRC) {
		if (!(mask & IBV_SRQ_INIT_ATTR_XRCD) || !(mask & IBV_SRQ_INIT_ATTR_CQ))
			return Err{EINVAL};
		if (!attr.xrcd || to_context(attr.xrcd->context) != &ctx)
			return Err{EINVAL};
		if (!attr.cq || to_context(attr.cq->context) != &ctx)
			return Err{EINVAL};
		xrcd = Xrcd::from(attr.xrcd);
		cq = Cq::from(attr.cq);
	}
	/* rxe (rxe_srq_chk_attr) also refuses an empty SRQ and a limit
	 * beyond the device's max_srq_wr, and keeps the initial limit;
	 * mlx5_ib ignores srq_limit at creation. */
	if (rxe && (attr.attr.max_wr == 0 ||
		    attr.attr.srq_limit > uint32_t(ctx.device->device_attr().max_srq_wr)))
		return Err{EINVAL};

	/* libmlx5's SRQ buffer: twice the WQEs asked for and one (the extra
	 * ones its wait queue), or the WQEs asked for and one when the device
	 * cannot hold that many, each of the stride the SGEs round up to; on
	 * huge pages when asked to be. */
	uint64_t wqes = 2 * uint64_t(attr.attr.max_wr) + 1;
	if (wqes > uint64_t(ctx.device->device_attr().max_srq_wr))
		wqes = uint64_t(attr.attr.max_wr) + 1;
	const uint64_t buffer = std::bit_ceil(wqes) * (16 + 16 * uint64_t(max_sge));
	HugeChunks::Lease huge;
	if (int err = take_queue_huge_pages(ctx, ParentDomain::from(attr.pd), "MLX_SRQ", nullptr,
					    buffer, huge))
		return Err{err};

	auto *srq = new (std::nothrow) Srq{};
	if (!srq) {
		ctx.huge_chunks.give_back(huge);
		return Err{ENOMEM};
	}
	srq->huge = huge;
	if (type == IBV_SRQT_BASIC)
		srq->room = std::make_shared<RqRoom>(0, true);
	srq->srq_num = allocate_id(*ctx.device, IdKind::Srq);
	if (!srq->srq_num) {
		ctx.huge_chunks.give_back(srq->huge);
		delete srq;
		return Err{ENOMEM};
	}
	srq->ctx = &ctx;
	srq->srq_type = type;
	srq->pd = Pd::from(attr.pd);
	srq->xrcd = xrcd;
	srq->cq = cq;
	srq->max_wr = max_wr;
	srq->max_sge = max_sge;
	srq->requested_sge = attr.attr.max_sge;
	srq->srq_limit = rxe ? attr.attr.srq_limit : 0;

	struct ibv_srq &s = srq->ibv;
	s.context = ctx.abi();
	s.srq_context = attr.srq_context;
	s.pd = attr.pd;
	s.handle = srq->srq_num;
	pthread_mutex_init(&s.mutex, nullptr);
	pthread_cond_init(&s.cond, nullptr);
	s.events_completed = 0;

	if (int err = srq_ring_attach(*srq)) {
		release_id(*ctx.device, IdKind::Srq, srq->srq_num);
		ctx.huge_chunks.give_back(srq->huge);
		pthread_cond_destroy(&s.cond);
		pthread_mutex_destroy(&s.mutex);
		delete srq;
		return Err{err};
	}
	srq->pd->uses.get();
	if (xrcd)
		xrcd->uses.get();
	if (cq)
		cq->uses.get();
	ctx.add_event_source(srq, &srq->async_events);

	attr.attr.max_wr = max_wr;
	attr.attr.max_sge = max_sge;
	process_fork_ranges().queue_created();
	return srq;
}

int modify_srq(Srq &srq, const struct ibv_srq_attr &attr, int attr_mask)
{
	const bool rxe = srq.ctx->device->profile->is(ProfileKind::Rxe);
	const uint32_t device_max_wr = uint32_t(srq.ctx->device->device_attr().max_srq_wr);
	std::lock_guard guard(srq.lock);

	/* Validate everything first: an invalid attribute modifies nothing. */
	uint32_t new_wr = srq.max_wr;
	if (attr_mask & IBV_SRQ_MAX_WR) {
		/* mlx5_ib cannot resize an SRQ (nor claims IBV_DEVICE_SRQ_RESIZE);
		 * rxe can, within rxe_srq_chk_attr()'s rules. */
		if (!rxe)
			return EINVAL;
		if (attr.max_wr == 0 || attr.max_wr > device_max_wr)
			return EINVAL;
		const uint32_t armed = srq_ring_limit(srq);
		if (armed && attr.max_wr < armed)
			return EINVAL;
		uint32_t sge;
		if (int err = srq.ctx->device->profile->size_srq(attr.max_wr, srq.requested_sge,
								  new_wr, sge))
			return err;
		/* The queue cannot shrink below the WQEs it holds (rxe's
		 * queue resize refuses it). */
		if (srq_ring_outstanding(srq) > new_wr)
			return EINVAL;
	}
	if (attr_mask & IBV_SRQ_LIMIT) {
		/* The limit must fit the queue as it is now. */
		if (attr.srq_limit > srq.max_wr)
			return EINVAL;
		if (rxe && attr.srq_limit > device_max_wr)
			return EINVAL;
	}

	srq.max_wr = new_wr;
	if (attr_mask & IBV_SRQ_LIMIT) {
		srq.srq_limit = attr.srq_limit;
		srq_ring_set_limit(srq, attr.srq_limit);
	}
	return 0;
}

int query_srq(Srq &srq, struct ibv_srq_attr &attr)
{
	std::lock_guard guard(srq.lock);
	attr.max_wr = srq.max_wr;
	attr.max_sge = srq.max_sge;
	attr.srq_limit = srq_ring_limit(srq);
	return 0;
}

int get_srq_num(Srq &srq, uint32_t &srq_num)
{
	/* libmlx5 answers for every SRQ type (DC users need it too). */
	srq_num = srq.srq_num;
	return 0;
}

int destroy_srq(Srq &srq)
{
	if (srq.uses.busy())
		return EBUSY;
	/* The limit's poller first, so that no event is raised from here on;
	 * then those the application has not read die with the SRQ (as for a
	 * QP), and those it read must be acknowledged. */
	srq_ring_detach(srq);
	srq.ctx->drop_queued_events(&srq);
	srq.async_events.wait_all_acked();
	srq.ctx->remove_event_source(&srq);
	release_id(*srq.ctx->device, IdKind::Srq, srq.srq_num);
	srq.pd->uses.put();
	if (srq.xrcd)
		srq.xrcd->uses.put();
	if (srq.cq)
		srq.cq->uses.put();
	pthread_cond_destroy(&srq.ibv.cond);
	pthread_mutex_destroy(&srq.ibv.mutex);
	srq.ctx->huge_chunks.give_back(srq.huge);
	delete &srq;
	return 0;
}

void srq_limit_reached(Srq &srq, uint64_t events)
{
	{
		std::lock_guard guard(srq.lock);
		srq.srq_limit = srq_ring_limit(srq);
	}
	for (uint64_t i = 0; i < events; i++) {
		struct ibv_async_event ev{};
		ev.element.srq = srq.abi();
		ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
		Context::post_async_event_if_open(srq.ctx, ev);
	}
}

} // namespace shmverbs
