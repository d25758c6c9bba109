/* SPDX-License-Identifier: MIT */
/*
 * The memory file, the switch of registered pages between private and shared
 * memory, its SIGSEGV and fork() protection, and the peer window cache.
 * memshare.h states the contracts; docs/architecture.md ("Registered memory")
 * explains the mechanism.
 *
 * Rule for every "switch window" (from making a range read-only to restoring
 * its protections): other threads may be stopped in our SIGSEGV handler, and
 * one of them may hold a lock we would need (malloc's, stdio's). Code inside
 * the window therefore only makes system calls: no allocation, no logging.
 */
#include "memshare.h"
#include "cma.h"
#include "log.h"
#include "tsan.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace shmverbs::memshare {

namespace {

/* The memory file covers every user address of x86-64 4-level paging (and
 * the lower 128 TiB of 5-level): offset == address. Higher addresses are not
 * shareable. Sparse: only pages holding registered data use memory. */
constexpr uint64_t kFileSize = 1ULL << 47;
constexpr const char *kFileName = "shmverbs-memory";

uintptr_t page_size()
{
	static const uintptr_t ps = [] {
		long v = sysconf(_SC_PAGESIZE);
		return v > 0 ? static_cast<uintptr_t>(v) : 4096;
	}();
	return ps;
}

uintptr_t page_down(uintptr_t a) { return a & ~(page_size() - 1); }

/* [s, e) page-aligned around [addr, addr + len), len 0 as 1; false when it
 * wraps or leaves the memory file. */
bool page_range(const void *addr, size_t len, uintptr_t &s, uintptr_t &e)
{
	auto a = reinterpret_cast<uintptr_t>(addr);
	uintptr_t last;
	if (__builtin_add_overflow(a, len ? len - 1 : 0, &last))
		return false;
	s = page_down(a);
	e = page_down(last) + page_size();
	return e > s && e <= kFileSize;
}

int futex(std::atomic<uint32_t> *word, int op, uint32_t val, const struct timespec *ts)
{
	return static_cast<int>(
		syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, val, ts, nullptr, 0));
}

/* ---- /proc/self/maps ---- */

struct MapEntry {
	uintptr_t start, end;
	int prot;
	bool shared;
	uint64_t offset;
	unsigned dev_major, dev_minor;
	unsigned long inode;
	std::string name;
	bool dontfork;   /* VM_DONTCOPY ("dc"), only read with with_flags */
	bool wipeonfork; /* VM_WIPEONFORK ("wf"), only read with with_flags */
};

/* The mappings intersecting [lo, hi), in address order, unclipped. With
 * with_flags, from /proc/self/smaps (slower: it walks the page tables) to
 * learn each mapping's MADV_DONTFORK too. */
std::vector<MapEntry> read_maps(uintptr_t lo, uintptr_t hi, bool with_flags = false)
{
	std::vector<MapEntry> out;
	FILE *f = std::fopen(with_flags ? "/proc/self/smaps" : "/proc/self/maps", "re");
	if (!f)
		return out;
	char line[4096 + 128];
	bool last_kept = false;
	while (std::fgets(line, sizeof(line), f)) {
		if (with_flags && std::strncmp(line, "VmFlags:", 8) == 0) {
			if (last_kept) {
				out.back().dontfork = std::strstr(line, " dc") != nullptr;
				out.back().wipeonfork = std::strstr(line, " wf") != nullptr;
			}
			continue;
		}
		MapEntry m{};
		char perms[8] = {};
		int name_at = 0;
		unsigned long long off;
		if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %llx %x:%x %lu %n", &m.start,
				&m.end, perms, &off, &m.dev_major, &m.dev_minor, &m.inode,
				&name_at) < 7)
			continue;
		last_kept = false;
		if (m.end <= lo)
			continue;
		if (m.start >= hi)
			break;
		m.offset = off;
		m.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			 (perms[2] == 'x' ? PROT_EXEC : 0);
		m.shared = perms[3] == 's';
		if (name_at > 0) {
			m.name = line + name_at;
			while (!m.name.empty() && (m.name.back() == '\n' || m.name.back() == ' '))
				m.name.pop_back();
		}
		out.push_back(std::move(m));
		last_kept = true;
	}
	std::fclose(f);
	return out;
}

/* A piece of [s, e) with one protection, for the switch windows. */
struct Piece {
	uintptr_t start, end;
	int prot;
};

/* ---- Switch signalling, read by the SIGSEGV handler ----
 * g_seq is odd while a switch window is open over [g_lo, g_hi); writers that
 * fault there wait on it (futex) and retry. Switches are serialized by the
 * state mutex, so there is at most one window. */
std::atomic<uint32_t> g_seq{0};
std::atomic<uintptr_t> g_lo{0}, g_hi{0};
struct sigaction g_prev_segv;
std::atomic<bool> g_handler_ready{false};

/* Per thread: the last fault we let retry without a switch in progress, to
 * tell a fault that raced with the end of a switch (retry once) from a real
 * one (chain to the previous handler). initial-exec: no allocation in the
 * signal handler. */
thread_local __attribute__((tls_model("initial-exec"))) uintptr_t t_last_addr = 0;
thread_local __attribute__((tls_model("initial-exec"))) uint32_t t_last_seq = 0;

/* A range of ours as seen at fork time, and the child's private copy. */
struct ForkRange {
	uintptr_t start, end;
	int prot;
	char *snapshot;   /* the child's copy; null if it could not be made */
	bool app_dontfork; /* the application keeps it out of children */
	bool installed;   /* in the child: its copy is in place */
};

/* The fork table, from prepare to parent/child. Plain static storage and a
 * table of its own mapping, never the heap: the child's SIGSEGV handler reads
 * it while the child's heap pages may still be missing. */
ForkRange *g_fork_ranges = nullptr;
std::atomic<size_t> g_fork_count{0};
std::atomic<pid_t> g_fork_parent{0};
int g_fork_fd = -1;
size_t g_fork_table_bytes = 0;

/* In a forked child: puts the child's private copy of r in place of the hole
 * MADV_DONTFORK left (a system call or two: safe in a signal handler). */
void install_child_copy(ForkRange &r)
{
	if (r.installed || r.app_dontfork)
		return;
	size_t len = r.end - r.start;
	void *at = reinterpret_cast<void *>(r.start);
	if (r.snapshot && mprotect(r.snapshot, len, r.prot) == 0 &&
	    mremap(r.snapshot, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED) {
		r.installed = true;
		return;
	}
	/* No snapshot: a private mapping of the file, which at least never
	 * writes to the parent's pages. */
	mmap(at, len, r.prot, MAP_PRIVATE | MAP_FIXED, g_fork_fd, static_cast<off_t>(r.start));
	r.installed = true;
}

/* From the SIGSEGV handler: in a child forked while ranges of ours were
 * shared, a fault in one of them is the child's first touch of it before
 * on_fork_child ran (glibc's own child-side work, earlier handlers). */
bool child_fault_on_fork_range(uintptr_t a)
{
	size_t n = g_fork_count.load(std::memory_order_acquire);
	if (n == 0 || static_cast<pid_t>(syscall(SYS_getpid)) == g_fork_parent.load(std::memory_order_relaxed))
		return false;
	for (size_t i = 0; i < n; i++) {
		ForkRange &r = g_fork_ranges[i];
		if (a >= r.start && a < r.end && !r.installed && !r.app_dontfork) {
			install_child_copy(r);
			return true;
		}
	}
	return false;
}

void chain_segv(int sig, siginfo_t *si, void *uc)
{
	struct sigaction prev = g_prev_segv;
	if (prev.sa_flags & SA_SIGINFO) {
		if (prev.sa_sigaction) {
			prev.sa_sigaction(sig, si, uc);
			return;
		}
	} else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
		prev.sa_handler(sig);
		return;
	}
	/* Default action (a fault cannot be ignored): restore it and let the
	 * faulting instruction fault again, or re-raise a sent signal. */
	struct sigaction dfl = {};
	dfl.sa_handler = SIG_DFL;
	sigemptyset(&dfl.sa_mask);
	sigaction(SIGSEGV, &dfl, nullptr);
	if (si->si_code <= 0)
		raise(sig);
}

void on_segv(int sig, siginfo_t *si, void *uc)
{
	int saved_errno = errno;
	auto a = reinterpret_cast<uintptr_t>(si->si_addr);
	if (si->si_code > 0 && child_fault_on_fork_range(a)) {
		errno = saved_errno;
		return; /* the child's copy is in place now: retry */
	}
	if (si->si_code == SEGV_ACCERR) {
		uint32_t s = g_seq.load(std::memory_order_acquire);
		if ((s & 1) && a >= g_lo.load(std::memory_order_relaxed) &&
		    a < g_hi.load(std::memory_order_relaxed)) {
			struct timespec ts = {0, 50 * 1000 * 1000};
			while (g_seq.load(std::memory_order_acquire) == s)
				futex(&g_seq, FUTEX_WAIT_PRIVATE, s, &ts);
			errno = saved_errno;
			return; /* retry the access */
		}
		if (s != 0 && (t_last_addr != a || t_last_seq != s)) {
			t_last_addr = a;
			t_last_seq = s;
			errno = saved_errno;
			return; /* maybe faulted just before a window closed */
		}
	}
	t_last_addr = 0;
	errno = saved_errno;
	chain_segv(sig, si, uc);
}

/* Makes sure on_segv is the SIGSEGV handler, chaining to whatever the
 * application installed since (called before each switch). */
void install_segv_handler()
{
	struct sigaction cur;
	if (sigaction(SIGSEGV, nullptr, &cur) != 0)
		return;
	if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_segv)
		return;
	g_prev_segv = cur;
	struct sigaction ours = {};
	ours.sa_sigaction = on_segv;
	ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
	sigemptyset(&ours.sa_mask);
	sigaction(SIGSEGV, &ours, nullptr);
	g_handler_ready.store(true);
}

/* Opens/closes a switch window over [lo, hi) on this thread, with every
 * blockable signal blocked (a handler of ours writing there would wait on
 * itself). */
void open_window(uintptr_t lo, uintptr_t hi, sigset_t *old_mask)
{
	sigset_t all;
	sigfillset(&all);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_BLOCK, &all, old_mask);
	g_lo.store(lo, std::memory_order_relaxed);
	g_hi.store(hi, std::memory_order_relaxed);
	g_seq.fetch_add(1, std::memory_order_release); /* odd: open */
}

void close_window(const sigset_t *old_mask)
{
	g_seq.fetch_add(1, std::memory_order_release); /* even: closed */
	futex(&g_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr);
	pthread_sigmask(SIG_SETMASK, old_mask, nullptr);
}

/* Copies the file's data extents within [s, e) into dst (dst[0] is offset s),
 * leaving holes untouched: reading a hole through a mapping would allocate. */
int copy_file_extents(int fd, uintptr_t s, uintptr_t e, char *dst)
{
	off_t off = static_cast<off_t>(s);
	while (off < static_cast<off_t>(e)) {
		off_t data = lseek(fd, off, SEEK_DATA);
		if (data < 0)
			return errno == ENXIO ? 0 : errno;
		if (data >= static_cast<off_t>(e))
			return 0;
		off_t hole = lseek(fd, data, SEEK_HOLE);
		if (hole < 0)
			return errno;
		hole = std::min(hole, static_cast<off_t>(e));
		for (off_t p = data; p < hole;) {
			ssize_t n = pread(fd, dst + (p - static_cast<off_t>(s)),
					  static_cast<size_t>(hole - p), p);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? errno : EIO;
			p += n;
		}
		off = hole;
	}
	return 0;
}

/* pwrite(2) of whole pages of this process. The pages moved to the memory
 * file hold the registered buffer but also whatever else the allocator put
 * around it (other objects, allocator headers, freed chunks): they are copied
 * as raw pages, not read as an object. So this goes to the kernel directly,
 * not through libc's pwrite(), which sanitizer runtimes intercept and check
 * as a read of one application object (ASan reports the neighbours' redzones
 * as a heap-buffer-overflow). */
ssize_t write_raw_pages(int fd, uintptr_t lo, size_t len)
{
	return syscall(SYS_pwrite64, fd, reinterpret_cast<const void *>(lo), len,
		       static_cast<off_t>(lo));
}

/* Writes the pages of [s, e) that hold data (present or swapped, per
 * /proc/self/pagemap) into the memory file at offset == address. Pages never
 * touched stay holes. Everything is copied when pagemap cannot be read. */
int copy_into_file(int fd, int pagemap_fd, uintptr_t s, uintptr_t e)
{
	auto put = [fd](uintptr_t lo, uintptr_t hi) -> int {
		while (lo < hi) {
			ssize_t n = write_raw_pages(fd, lo, hi - lo);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? errno : EIO;
			lo += static_cast<uintptr_t>(n);
		}
		return 0;
	};
	if (pagemap_fd < 0)
		return put(s, e);
	const uintptr_t ps = page_size();
	uint64_t entries[512];
	uintptr_t run_start = 0;
	bool in_run = false;
	for (uintptr_t a = s; a < e;) {
		size_t n = std::min<size_t>(512, (e - a) / ps);
		ssize_t got = pread(pagemap_fd, entries, n * 8, static_cast<off_t>(a / ps * 8));
		if (got != static_cast<ssize_t>(n * 8))
			return put(in_run ? run_start : a, e);
		for (size_t i = 0; i < n; i++, a += ps) {
			bool data = (entries[i] >> 63) & 1 || (entries[i] >> 62) & 1;
			if (data && !in_run) {
				run_start = a;
				in_run = true;
			} else if (!data && in_run) {
				if (int err = put(run_start, a))
					return err;
				in_run = false;
			}
		}
	}
	return in_run ? put(run_start, e) : 0;
}

/* Page reference counts: disjoint segments with count > 0, keyed by start. */
class PageCounts {
public:
	struct Run {
		uintptr_t start, end;
		uint32_t count;
	};

	/* The runs of equal count covering [s, e), including count-0 gaps. */
	std::vector<Run> runs(uintptr_t s, uintptr_t e) const
	{
		std::vector<Run> out;
		uintptr_t at = s;
		auto it = segs_.upper_bound(s);
		if (it != segs_.begin())
			--it;
		for (; it != segs_.end() && it->first < e; ++it) {
			uintptr_t lo = std::max(it->first, s), hi = std::min(it->second.end, e);
			if (hi <= lo)
				continue;
			if (lo > at)
				out.push_back({at, lo, 0});
			out.push_back({lo, hi, it->second.count});
			at = hi;
		}
		if (at < e)
			out.push_back({at, e, 0});
		return out;
	}

	/* Adds delta (+1/-1) over [s, e); with -1, pages at 0 stay 0. Returns
	 * the ranges that dropped to 0. */
	std::vector<Run> add(uintptr_t s, uintptr_t e, int delta)
	{
		std::vector<Run> dropped;
		for (const Run &r : runs(s, e)) {
			if (r.count == 0 && delta < 0)
				continue;
			uint32_t c = r.count + static_cast<uint32_t>(delta);
			split_at(r.start);
			split_at(r.end);
			if (c == 0) {
				segs_.erase(r.start);
				dropped.push_back({r.start, r.end, 0});
			} else {
				segs_[r.start] = {r.end, c};
			}
		}
		merge(s, e);
		return dropped;
	}

	uint32_t at(uintptr_t a) const
	{
		auto r = runs(page_down(a), page_down(a) + page_size());
		return r.empty() ? 0 : r[0].count;
	}
	bool empty() const { return segs_.empty(); }
	void clear() { segs_.clear(); }

private:
	struct Seg {
		uintptr_t end;
		uint32_t count;
	};

	void split_at(uintptr_t a)
	{
		auto it = segs_.upper_bound(a);
		if (it == segs_.begin())
			return;
		--it;
		if (it->first < a && a < it->second.end) {
			segs_[a] = {it->second.end, it->second.count};
			it->second.end = a;
		}
	}

	void merge(uintptr_t s, uintptr_t e)
	{
		auto it = segs_.lower_bound(s);
		if (it != segs_.begin())
			--it;
		while (it != segs_.end() && it->first <= e) {
			auto next = std::next(it);
			if (next == segs_.end())
				break;
			if (it->second.end == next->first && it->second.count == next->second.count) {
				it->second.end = next->second.end;
				segs_.erase(next);
			} else {
				it = next;
			}
		}
	}

	std::map<uintptr_t, Seg> segs_;
};


struct State {
	std::mutex lock;
	int fd = -1;
	dev_t dev = 0;
	ino_t ino = 0;
	int pagemap_fd = -1;
	PageCounts counts;
	/* Shared ranges whose private pages the application had advised
	 * MADV_DONTFORK or MADV_WIPEONFORK before they were switched: the
	 * advice goes back on the private mapping at the switch back
	 * (unshare), and a child gets zeros in `wipe` (on_fork_prepare),
	 * which a shared mapping cannot be advised. Disjoint, start -> end. */
	std::map<uintptr_t, uintptr_t> dontfork, wipe;
};

/* Removes [lo, hi) from `set`; returns the parts it held. */
std::vector<std::pair<uintptr_t, uintptr_t>> take_range(std::map<uintptr_t, uintptr_t> &set,
							uintptr_t lo, uintptr_t hi)
{
	std::vector<std::pair<uintptr_t, uintptr_t>> out;
	auto it = set.upper_bound(lo);
	if (it != set.begin())
		--it;
	while (it != set.end() && it->first < hi) {
		const uintptr_t a = it->first, b = it->second;
		if (b <= lo) {
			++it;
			continue;
		}
		it = set.erase(it);
		if (a < lo)
			set[a] = lo;
		if (b > hi)
			set[hi] = b;
		out.emplace_back(std::max(a, lo), std::min(b, hi));
	}
	return out;
}

/*
 * A switch makes a new mapping, which has none of the advice the
 * application gave the old one. To shared: `flags` (read_maps with_flags,
 * before the switch) says what it was over [s, e): MADV_DONTFORK is given
 * again, and both are noted. Back to private: what was noted is given
 * again.
 */
void keep_app_advice(State &st, const std::vector<MapEntry> &flags, uintptr_t s, uintptr_t e)
{
	take_range(st.dontfork, s, e); /* stale: from pages switched before */
	take_range(st.wipe, s, e);
	for (const MapEntry &m : flags) {
		const uintptr_t lo = std::max(m.start, s), hi = std::min(m.end, e);
		if (hi <= lo)
			continue;
		if (m.dontfork) {
			madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_DONTFORK);
			st.dontfork[lo] = hi;
		}
		if (m.wipeonfork)
			st.wipe[lo] = hi;
	}
}

void restore_app_advice(State &st, uintptr_t s, uintptr_t e)
{
	for (const auto &[lo, hi] : take_range(st.dontfork, s, e))
		madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_DONTFORK);
	for (const auto &[lo, hi] : take_range(st.wipe, s, e))
		madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_WIPEONFORK);
}

State &state()
{
	/* Never destroyed: atfork handlers and late unshare() calls may run
	 * during exit. */
	static State *s = new State;
	return *s;
}

/* Whether the mapping m maps our memory file with offset == address. */
bool is_ours(const State &st, const MapEntry &m)
{
	return st.fd >= 0 && m.shared && m.inode == st.ino &&
	       m.dev_major == major(st.dev) && m.dev_minor == minor(st.dev) &&
	       m.offset == m.start;
}

/* Private, anonymous, readable and writable, not a special mapping. */
bool is_eligible(const MapEntry &m)
{
	if (m.shared || m.inode != 0 || (m.prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE))
		return false;
	return m.name.empty() || m.name == "[heap]" || m.name.rfind("[anon:", 0) == 0;
}

/* The pieces of [s, e) as mapped, each with its protection, if every byte of
 * [s, e) is mapped and satisfies pred; empty otherwise. */
template <typename Pred>
std::vector<Piece> pieces_if(const std::vector<MapEntry> &maps, uintptr_t s, uintptr_t e, Pred pred)
{
	std::vector<Piece> out;
	uintptr_t at = s;
	for (const MapEntry &m : maps) {
		if (m.end <= at || m.start >= e)
			continue;
		if (m.start > at || !pred(m))
			return {};
		uintptr_t hi = std::min(m.end, e);
		out.push_back({at, hi, m.prot});
		at = hi;
		if (at >= e)
			break;
	}
	if (at < e)
		return {};
	return out;
}

void on_fork_prepare();
void on_fork_parent();
void on_fork_child();

int ensure_file(State &st)
{
	if (st.fd >= 0)
		return 0;
	int fd = memfd_create(kFileName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errno;
	struct stat sb;
	if (ftruncate(fd, static_cast<off_t>(kFileSize)) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
	    fstat(fd, &sb) != 0) {
		int err = errno;
		close(fd);
		return err;
	}
	st.fd = fd;
	st.dev = sb.st_dev;
	st.ino = sb.st_ino;
	if (st.pagemap_fd < 0)
		st.pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	install_fork_handlers();
	return 0;
}

/* Makes the pieces read-only (keeping PROT_EXEC), first to last, so that
 * no store lands while their pages are copied (another thread's store
 * faults and waits in on_segv until the window closes). `done`: how many
 * it changed. 0, or the errno of the mprotect that failed. */
int write_protect(const std::vector<Piece> &pieces, size_t &done)
{
	for (; done < pieces.size(); done++) {
		const Piece &p = pieces[done];
		if (mprotect(reinterpret_cast<void *>(p.start), p.end - p.start,
			     PROT_READ | (p.prot & PROT_EXEC)) != 0)
			return errno;
	}
	return 0;
}

/* Gives pieces [from, to) their own protection back. */
void restore_protection(const std::vector<Piece> &pieces, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		mprotect(reinterpret_cast<void *>(pieces[i].start), pieces[i].end - pieces[i].start,
			 pieces[i].prot);
}

/* Switches the contiguous pieces (private anonymous) to the memory file. On
 * failure nothing changed, except when an mmap failed half-way (logged). */
int switch_in(State &st, const std::vector<Piece> &pieces)
{
	uintptr_t s = pieces.front().start, e = pieces.back().end;
	/* Pages never touched are not copied: they must read as zero, whatever
	 * an earlier registration at these addresses left in the file. */
	if (fallocate(st.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(s),
		      static_cast<off_t>(e - s)) != 0)
		return errno;
	install_segv_handler();
	sigset_t mask;
	open_window(s, e, &mask);
	size_t protected_n = 0, mapped_n = 0;
	int err = write_protect(pieces, protected_n);
	if (!err)
		err = copy_into_file(st.fd, st.pagemap_fd, s, e);
	if (!err) {
		/* The same contents under another mapping, not a store of the
		 * program's: TSan would take each mmap for a write to every
		 * object on these pages (heap neighbours of the buffer that
		 * other threads read) and report those reads as races. */
		[[maybe_unused]] TsanIgnoreAccesses same_contents;
		for (; mapped_n < pieces.size(); mapped_n++) {
			const Piece &p = pieces[mapped_n];
			void *r = mmap(reinterpret_cast<void *>(p.start), p.end - p.start, p.prot,
				       MAP_SHARED | MAP_FIXED, st.fd, static_cast<off_t>(p.start));
			if (r == MAP_FAILED) {
				err = errno;
				/* MAP_FIXED may have dropped the old mapping: the
				 * data is in the file, map it back as best we can. */
				mmap(reinterpret_cast<void *>(p.start), p.end - p.start, p.prot,
				     MAP_SHARED | MAP_FIXED, st.fd, static_cast<off_t>(p.start));
				break;
			}
		}
	}
	if (err)
		restore_protection(pieces, mapped_n, protected_n);
	close_window(&mask);
	if (err && mapped_n == 0)
		fallocate(st.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(s),
			  static_cast<off_t>(e - s));
	return err;
}

/* Switches contiguous pieces mapped from the memory file back to private
 * anonymous memory with the same contents and protections. */
int switch_out(State &st, const std::vector<Piece> &pieces)
{
	uintptr_t s = pieces.front().start, e = pieces.back().end;
	void *tmp_v = mmap(nullptr, e - s, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (tmp_v == MAP_FAILED)
		return errno;
	char *tmp = static_cast<char *>(tmp_v);
	install_segv_handler();
	sigset_t mask;
	open_window(s, e, &mask);
	size_t protected_n = 0, moved_n = 0;
	int err = write_protect(pieces, protected_n);
	if (!err)
		err = copy_file_extents(st.fd, s, e, tmp);
	if (!err) {
		for (const Piece &p : pieces)
			if (mprotect(tmp + (p.start - s), p.end - p.start, p.prot) != 0)
				err = errno;
	}
	if (!err) {
		[[maybe_unused]] TsanIgnoreAccesses same_contents; /* as in switch_in() */
		for (; moved_n < pieces.size(); moved_n++) {
			const Piece &p = pieces[moved_n];
			void *r = mremap(tmp + (p.start - s), p.end - p.start, p.end - p.start,
					 MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void *>(p.start));
			if (r == MAP_FAILED) {
				err = errno;
				break;
			}
		}
	}
	/* Pieces not moved keep the shared mapping: restore their protection. */
	restore_protection(pieces, moved_n, protected_n);
	close_window(&mask);
	for (size_t i = moved_n; i < pieces.size(); i++)
		munmap(tmp + (pieces[i].start - s), pieces[i].end - pieces[i].start);
	return err;
}

/* Releases the file's pages in [s, e) that no mapping of ours still shows
 * (an application mremap() may have moved a shared mapping elsewhere). */
void release_file_range(State &st, uintptr_t s, uintptr_t e, const std::vector<MapEntry> &all)
{
	std::vector<std::pair<uint64_t, uint64_t>> keep;
	for (const MapEntry &m : all)
		if (m.shared && m.inode == st.ino && m.dev_major == major(st.dev) &&
		    m.dev_minor == minor(st.dev))
			keep.emplace_back(m.offset, m.offset + (m.end - m.start));
	std::sort(keep.begin(), keep.end());
	uint64_t at = s;
	auto punch = [&](uint64_t lo, uint64_t hi) {
		if (hi > lo)
			fallocate(st.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  static_cast<off_t>(lo), static_cast<off_t>(hi - lo));
	};
	for (auto [lo, hi] : keep) {
		if (hi <= at || lo >= e)
			continue;
		punch(at, std::min<uint64_t>(lo, e));
		at = std::max<uint64_t>(at, hi);
	}
	if (at < e)
		punch(at, e);
}

/* ---- fork() ----
 * A child must get a private copy of every range of ours, and nothing it
 * does may reach the parent's pages, not even before on_fork_child runs:
 * glibc writes arena headers in the child before any handler, and handlers
 * registered before ours run first. So the child never inherits our shared
 * mappings at all:
 * prepare: snapshot every range into private anonymous memory while it is
 * read-only (consistent), and mark the range MADV_DONTFORK, all inside
 * prepare (glibc takes its own locks after the handlers, and a thread waiting
 * in our SIGSEGV handler could hold one of them).
 * child: the ranges are holes; each snapshot is moved over its hole (mremap,
 * no copy) by on_fork_child, or by the SIGSEGV handler when the child touches
 * the range earlier. Ranges the application itself keeps out of children
 * (MADV_DONTFORK, ibv_fork_init) stay holes, as they would be.
 * parent: MADV_DOFORK again, drop the snapshots.
 * The state mutex is held from prepare to parent/child so no range switches
 * in between. Writes other threads make between the snapshot and the fork
 * itself are not in the child's copy. */
void drop_fork_table()
{
	g_fork_count.store(0, std::memory_order_release);
	if (g_fork_ranges)
		munmap(g_fork_ranges, g_fork_table_bytes);
	g_fork_ranges = nullptr;
	g_fork_table_bytes = 0;
}

void on_fork_prepare()
{
	State &st = state();
	st.lock.lock();
	if (st.fd < 0 || st.counts.empty())
		return;
	std::vector<ForkRange> ranges;
	for (const MapEntry &m : read_maps(0, UINTPTR_MAX, true))
		if (is_ours(st, m))
			ranges.push_back({m.start, m.end, m.prot, nullptr, m.dontfork, false});
	if (ranges.empty())
		return;
	/* The child's first touch of a range comes to on_segv, even if the
	 * application installed its own handler since our last switch. */
	install_segv_handler();
	size_t bytes = (ranges.size() * sizeof(ForkRange) + page_size() - 1) & ~(page_size() - 1);
	void *table = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (table == MAP_FAILED) {
		log_error("memshare: fork(): no memory for the fork table; the child shares registered pages");
		return;
	}
	for (ForkRange &r : ranges) {
		if (r.app_dontfork)
			continue;
		void *p = mmap(nullptr, r.end - r.start, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		r.snapshot = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
	}
	sigset_t mask;
	open_window(ranges.front().start, ranges.back().end, &mask);
	for (const ForkRange &r : ranges)
		if (!r.app_dontfork && (r.prot & PROT_WRITE))
			mprotect(reinterpret_cast<void *>(r.start), r.end - r.start,
				 PROT_READ | (r.prot & PROT_EXEC));
	for (ForkRange &r : ranges) {
		if (r.snapshot && copy_file_extents(st.fd, r.start, r.end, r.snapshot) != 0) {
			munmap(r.snapshot, r.end - r.start);
			r.snapshot = nullptr;
		}
		/* MADV_WIPEONFORK the application gave before the switch:
		 * the child's copy of those pages is zero. */
		if (r.snapshot)
			for (const auto &[a, b] : st.wipe) {
				const uintptr_t lo = std::max(a, r.start), hi = std::min(b, r.end);
				if (lo < hi)
					madvise(r.snapshot + (lo - r.start), hi - lo, MADV_DONTNEED);
			}
		if (!r.app_dontfork)
			madvise(reinterpret_cast<void *>(r.start), r.end - r.start, MADV_DONTFORK);
	}
	for (const ForkRange &r : ranges)
		if (!r.app_dontfork && (r.prot & PROT_WRITE))
			mprotect(reinterpret_cast<void *>(r.start), r.end - r.start, r.prot);
	close_window(&mask);
	g_fork_ranges = static_cast<ForkRange *>(table);
	std::copy(ranges.begin(), ranges.end(), g_fork_ranges);
	g_fork_table_bytes = bytes;
	g_fork_fd = st.fd;
	g_fork_parent.store(static_cast<pid_t>(syscall(SYS_getpid)), std::memory_order_relaxed);
	g_fork_count.store(ranges.size(), std::memory_order_release);
}

void on_fork_parent()
{
	size_t n = g_fork_count.load(std::memory_order_acquire);
	for (size_t i = 0; i < n; i++) {
		const ForkRange &r = g_fork_ranges[i];
		if (r.app_dontfork)
			continue;
		madvise(reinterpret_cast<void *>(r.start), r.end - r.start, MADV_DOFORK);
		if (r.snapshot)
			munmap(r.snapshot, r.end - r.start);
	}
	drop_fork_table();
	state().lock.unlock();
}

void on_fork_child()
{
	/* First the copies: the state itself may live on a registered page. */
	size_t n = g_fork_count.load(std::memory_order_acquire);
	for (size_t i = 0; i < n; i++)
		install_child_copy(g_fork_ranges[i]);
	drop_fork_table();
	State &st = state();
	/* The child has no registrations and no memory file of its own yet. */
	if (st.fd >= 0)
		close(st.fd);
	st.fd = -1;
	st.counts.clear();
	st.dontfork.clear();
	st.wipe.clear();
	st.lock.unlock();
}

/* ---- Peer windows ---- */

struct Window {
	dev_t dev;
	ino_t ino;
	uint64_t lo, hi; /* target addresses covered */
	char *base;      /* local address of lo */
	uint32_t refs;
	bool forgotten;  /* unmap on last release */
	uint64_t last_use;
};

constexpr size_t kMaxIdleWindows = 64;

struct WindowCache {
	std::mutex lock;
	std::vector<Window *> windows;
	uint64_t clock = 0;
};

WindowCache &window_cache()
{
	static WindowCache *c = new WindowCache;
	return *c;
}

void unmap_window(Window *w)
{
	munmap(w->base, w->hi - w->lo);
	delete w;
}

/* Unmaps the least recently used idle windows beyond the limit. */
void trim_idle(WindowCache &c)
{
	for (;;) {
		size_t idle = 0;
		Window *oldest = nullptr;
		for (Window *w : c.windows)
			if (w->refs == 0) {
				idle++;
				if (!oldest || w->last_use < oldest->last_use)
					oldest = w;
			}
		if (idle <= kMaxIdleWindows)
			return;
		c.windows.erase(std::find(c.windows.begin(), c.windows.end(), oldest));
		unmap_window(oldest);
	}
}

} // namespace

Policy policy()
{
	static const Policy p = [] {
		const char *v = std::getenv("SHMVERBS_MEMORY_PATH");
		if (!v || !*v || !std::strcmp(v, "auto"))
			return Policy::automatic;
		if (!std::strcmp(v, "shared"))
			return Policy::shared;
		if (!std::strcmp(v, "cma"))
			return Policy::cma;
		if (!std::strcmp(v, "bounce"))
			return Policy::bounce;
		log_error("bad configuration: SHMVERBS_MEMORY_PATH=%s (auto, shared, cma or bounce); using auto", v);
		return Policy::automatic;
	}();
	return p;
}

Path share(void *addr, size_t len)
{
	const Policy pol = policy();
	const Path fallback = (pol == Policy::automatic || pol == Policy::cma) && cma_available()
				      ? Path::cma
				      : Path::bounce;
	if (pol == Policy::cma || pol == Policy::bounce)
		return fallback;
	uintptr_t s, e;
	if (!page_range(addr, len, s, e))
		return fallback;
	State &st = state();
	std::lock_guard<std::mutex> g(st.lock);
	if (ensure_file(st) != 0)
		return fallback;
	const auto maps = read_maps(s, e);
	/* Check everything first: a range is shared whole or not at all. */
	std::vector<std::vector<Piece>> to_switch;
	for (const auto &run : st.counts.runs(s, e)) {
		if (run.count > 0) {
			if (pieces_if(maps, run.start, run.end,
				      [&](const MapEntry &m) { return is_ours(st, m); })
				    .empty()) {
				log_debug("memshare: [%#" PRIxPTR ", %#" PRIxPTR ") was replaced while registered",
					  run.start, run.end);
				return fallback;
			}
			continue;
		}
		auto pieces = pieces_if(maps, run.start, run.end, is_eligible);
		if (pieces.empty())
			return fallback;
		to_switch.push_back(std::move(pieces));
	}
	/* What the application advised there, which the switch would lose. */
	std::vector<MapEntry> flags;
	if (!to_switch.empty())
		flags = read_maps(to_switch.front().front().start, to_switch.back().back().end, true);
	size_t done = 0;
	for (; done < to_switch.size(); done++) {
		if (int err = switch_in(st, to_switch[done])) {
			log_debug("memshare: switching [%#" PRIxPTR ", %#" PRIxPTR ") failed: %s",
				  to_switch[done].front().start, to_switch[done].back().end,
				  std::strerror(err));
			break;
		}
	}
	if (done < to_switch.size()) {
		/* Undo the ones that switched, so nothing changed. */
		for (size_t i = 0; i < done; i++) {
			switch_out(st, to_switch[i]);
			fallocate(st.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  static_cast<off_t>(to_switch[i].front().start),
				  static_cast<off_t>(to_switch[i].back().end - to_switch[i].front().start));
		}
		return fallback;
	}
	for (const std::vector<Piece> &run : to_switch)
		keep_app_advice(st, flags, run.front().start, run.back().end);
	st.counts.add(s, e, +1);
	return Path::shared;
}

void unshare(void *addr, size_t len)
{
	uintptr_t s, e;
	if (!page_range(addr, len, s, e))
		return;
	State &st = state();
	std::lock_guard<std::mutex> g(st.lock);
	if (st.fd < 0)
		return;
	auto dropped = st.counts.add(s, e, -1);
	if (dropped.empty())
		return;
	const auto maps = read_maps(dropped.front().start, dropped.back().end);
	for (const auto &run : dropped) {
		/* Each maximal stretch still mapped from our file at offset ==
		 * address goes back to private memory; anything the
		 * application unmapped or replaced is left alone. */
		std::vector<Piece> group;
		auto flush = [&] {
			if (group.empty())
				return;
			if (int err = switch_out(st, group))
				log_error("memshare: could not make [%#" PRIxPTR ", %#" PRIxPTR
					  ") private again: %s; it stays shared",
					  group.front().start, group.back().end, std::strerror(err));
			else
				restore_app_advice(st, group.front().start, group.back().end);
			group.clear();
		};
		for (const MapEntry &m : maps) {
			uintptr_t lo = std::max(m.start, run.start), hi = std::min(m.end, run.end);
			if (hi <= lo)
				continue;
			if (!is_ours(st, m) || (!group.empty() && group.back().end != lo)) {
				flush();
				if (!is_ours(st, m))
					continue;
			}
			group.push_back({lo, hi, m.prot});
		}
		flush();
	}
	const auto all = read_maps(0, UINTPTR_MAX);
	for (const auto &run : dropped)
		release_file_range(st, run.start, run.end, all);
}

void install_fork_handlers()
{
	static std::once_flag atfork_once;
	std::call_once(atfork_once, [] { pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child); });
}

namespace {
/* At load, so that ours come before every other child handler of this
 * library and of the application (they run in registration order). */
__attribute__((constructor)) void install_fork_handlers_at_load()
{
	install_fork_handlers();
}
} // namespace

int memory_file_fd()
{
	State &st = state();
	std::lock_guard<std::mutex> g(st.lock);
	if (int err = ensure_file(st)) {
		errno = err;
		return -1;
	}
	return st.fd;
}

uint32_t share_count_at(const void *addr)
{
	State &st = state();
	std::lock_guard<std::mutex> g(st.lock);
	return st.counts.at(reinterpret_cast<uintptr_t>(addr));
}

bool page_is_shared(const void *addr)
{
	State &st = state();
	std::lock_guard<std::mutex> g(st.lock);
	uintptr_t a = page_down(reinterpret_cast<uintptr_t>(addr));
	for (const MapEntry &m : read_maps(a, a + page_size()))
		if (m.start <= a && a < m.end)
			return is_ours(st, m);
	return false;
}

/* ---- PeerWindow ---- */

PeerWindow::PeerWindow(PeerWindow &&o) noexcept : entry_(o.entry_), delta_(o.delta_)
{
	o.entry_ = nullptr;
}

PeerWindow &PeerWindow::operator=(PeerWindow &&o) noexcept
{
	if (this != &o) {
		reset();
		entry_ = o.entry_;
		delta_ = o.delta_;
		o.entry_ = nullptr;
	}
	return *this;
}

PeerWindow::~PeerWindow() { reset(); }

void PeerWindow::reset()
{
	if (!entry_)
		return;
	auto *w = static_cast<Window *>(entry_);
	entry_ = nullptr;
	WindowCache &c = window_cache();
	std::lock_guard<std::mutex> g(c.lock);
	if (--w->refs == 0) {
		if (w->forgotten) {
			c.windows.erase(std::find(c.windows.begin(), c.windows.end(), w));
			unmap_window(w);
		} else {
			trim_idle(c);
		}
	}
}

int map_peer(int fd, uint64_t va, size_t len, PeerWindow &out)
{
	out.reset();
	struct stat sb;
	if (fstat(fd, &sb) != 0)
		return errno;
	/* Only a sealed memory file: a peer that could shrink it would make our
	 * accesses fault (SIGBUS). */
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return EINVAL;
	uintptr_t s, e;
	if (!page_range(reinterpret_cast<void *>(va), len, s, e) ||
	    e > static_cast<uint64_t>(sb.st_size))
		return EINVAL;
	WindowCache &c = window_cache();
	std::lock_guard<std::mutex> g(c.lock);
	Window *hit = nullptr;
	for (Window *w : c.windows)
		if (!w->forgotten && w->dev == sb.st_dev && w->ino == sb.st_ino && w->lo <= s &&
		    e <= w->hi) {
			hit = w;
			break;
		}
	if (!hit) {
		void *p = mmap(nullptr, e - s, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			       static_cast<off_t>(s));
		if (p == MAP_FAILED)
			return errno;
		hit = new Window{sb.st_dev, sb.st_ino, s, e, static_cast<char *>(p), 0, false, 0};
		c.windows.push_back(hit);
	}
	hit->refs++;
	hit->last_use = ++c.clock;
	out.entry_ = hit;
	out.delta_ = reinterpret_cast<uint64_t>(hit->base) - hit->lo;
	return 0;
}

void forget_peer(int fd)
{
	struct stat sb;
	if (fstat(fd, &sb) != 0)
		return;
	WindowCache &c = window_cache();
	std::lock_guard<std::mutex> g(c.lock);
	for (auto it = c.windows.begin(); it != c.windows.end();) {
		Window *w = *it;
		if (w->dev != sb.st_dev || w->ino != sb.st_ino) {
			++it;
			continue;
		}
		if (w->refs == 0) {
			it = c.windows.erase(it);
			unmap_window(w);
		} else {
			w->forgotten = true;
			++it;
		}
	}
}

size_t peer_window_count()
{
	WindowCache &c = window_cache();
	std::lock_guard<std::mutex> g(c.lock);
	return c.windows.size();
}

} // namespace shmverbs::memshare
