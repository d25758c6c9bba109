/* SPDX-License-Identifier: MIT */
/*
 * The machine's own references for the benchmark runner (bench/run.py):
 *   - single-thread memcpy, hot (the same source and destination again and
 *     again: cache resident up to the cache size) and cold (a new part of a
 *     pool much larger than the last-level cache for every copy);
 *   - the cross-process floor: a cache line bounced between two processes
 *     through a MAP_SHARED page (half a round trip per hop).
 * Figures are medians of short timed pieces, so time the scheduler gave to
 * other work (this machine is often shared) counts as little as possible.
 * One measurement per JSON line, the runner's shape:
 *   {"group": "ref", "name": ..., "value": ..., "unit": ...}
 * Every loop is bounded in time as well as in count, so a loaded machine
 * makes the figures worse, never the run endless.
 *
 *   ref-bench [--smoke]
 */
#include <sys/mman.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace {

bool smoke = false;

double now_s()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void emit(const char *name, double value, const char *unit)
{
	std::printf("{\"group\": \"ref\", \"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n",
		    name, value, unit);
	std::fflush(stdout);
}

/* Keeps the compiler from dropping copies whose result nobody reads. */
void clobber(void *p)
{
	asm volatile("" : : "r"(p) : "memory");
}

double median(std::vector<double> v)
{
	if (v.empty())
		return -1;
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

/* Copies `size` bytes again and again for `budget` seconds, in chunks of
 * about a millisecond; the figure is the median chunk, so a chunk the
 * scheduler interrupted does not count. `cold` moves through a pool bigger
 * than the last-level cache. */
double memcpy_gbps(size_t size, bool cold, double budget, double *ns_per_copy)
{
	/* One pool for every cold size, touched once (page faults are not copies). */
	static std::vector<char> cold_src, cold_dst;
	const size_t pool = cold ? (smoke ? size_t(64) << 20 : size_t(256) << 20) : size;
	std::vector<char> hot_src, hot_dst;
	std::vector<char> &src = cold ? cold_src : hot_src, &dst = cold ? cold_dst : hot_dst;
	if (src.size() != pool) {
		src.assign(pool, 1);
		dst.assign(pool, 2);
	}
	const size_t slots = pool / size;
	/* about 1 ms of copying at ~10 GB/s, at least one copy */
	const size_t batch = std::max<size_t>(1, (size_t(10) << 20) / size / (size < 4096 ? 8 : 1));
	std::vector<double> per_copy_ns;
	size_t slot = 0;
	double t0 = now_s(), t = t0;
	do {
		double c0 = now_s();
		for (size_t i = 0; i < batch; i++) {
			std::memcpy(dst.data() + slot * size, src.data() + slot * size, size);
			clobber(dst.data());
			if (++slot == slots)
				slot = 0;
		}
		t = now_s();
		per_copy_ns.push_back((t - c0) * 1e9 / double(batch));
	} while (t - t0 < budget);
	*ns_per_copy = median(per_copy_ns);
	return double(size) / *ns_per_copy;
}

/* Ticks of a clock cheap enough to time one round trip (the TSC on x86,
 * calibrated against CLOCK_MONOTONIC), and nanoseconds per tick. */
#if defined(__x86_64__) || defined(__i386__)
uint64_t ticks()
{
	return __rdtsc();
}
#else
uint64_t ticks()
{
	return uint64_t(now_s() * 1e9);
}
#endif

double ns_per_tick()
{
	double t0 = now_s();
	uint64_t k0 = ticks();
	while (now_s() - t0 < 0.01) {
	}
	double t1 = now_s();
	uint64_t k1 = ticks();
	return (t1 - t0) * 1e9 / double(k1 - k0);
}

/*
 * Two processes take turns on one cache line: the parent writes an odd
 * number, the child answers with the next even one. Each hop moves the line
 * once; the figure is the time per hop (half a round trip), the least any
 * cross-process shared-memory message can cost. Every round trip is timed on
 * its own and the median taken (as perftest's t_typical): a round trip during
 * which the scheduler ran something else on one of the two CPUs does not
 * move it.
 */
double pingpong_ns(double budget)
{
	void *page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return -1;
	auto *word = static_cast<std::atomic<uint64_t> *>(page);
	auto *stop = word + 8; /* another cache line */
	word->store(0);
	stop->store(0);
	const double tick_ns = ns_per_tick();
	pid_t child = fork();
	if (child < 0)
		return -1;
	if (child == 0) {
		uint64_t expect = 1;
		for (;;) {
			uint64_t v = word->load(std::memory_order_acquire);
			if (v == expect) {
				word->store(v + 1, std::memory_order_release);
				expect += 2;
			} else if (stop->load(std::memory_order_relaxed)) {
				_exit(0);
			}
		}
	}
	std::vector<double> per_hop;
	per_hop.reserve(1 << 20);
	uint64_t rounds = 0;
	bool failed = false;
	double t0 = now_s();
	while (!failed && per_hop.size() < (1u << 20) && now_s() - t0 < budget) {
		for (int i = 0; i < 64 && !failed; i++) {
			uint64_t mine = 2 * rounds + 1;
			uint64_t k0 = ticks();
			word->store(mine, std::memory_order_release);
			/* Bounded: the child may be descheduled for a while, never forever. */
			unsigned spins = 0;
			while (word->load(std::memory_order_acquire) != mine + 1) {
				if (++spins == 0x100000u) {
					spins = 0;
					if (now_s() - t0 > budget + 5) {
						failed = true;
						break;
					}
				}
			}
			per_hop.push_back(double(ticks() - k0) * tick_ns / 2);
			rounds++;
		}
	}
	stop->store(1);
	if (failed)
		kill(child, SIGKILL);
	waitpid(child, nullptr, 0);
	munmap(page, 4096);
	return failed ? -1 : median(per_hop);
}

} // namespace

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (std::strcmp(argv[i], "--smoke") == 0)
			smoke = true;
		else {
			std::fprintf(stderr, "usage: %s [--smoke]\n", argv[0]);
			return 2;
		}
	}
	const double budget = smoke ? 0.005 : 0.05;
	emit("pingpong_halfrtt", pingpong_ns(smoke ? 0.01 : 0.3) / 1000, "us");
	static const size_t sizes[] = {8, 64, 256, 512, 4096, 65536, 1 << 20, 4 << 20};
	for (size_t size : sizes) {
		char name[64];
		for (int cold = 0; cold < 2; cold++) {
			double ns = 0;
			double gbps = memcpy_gbps(size, cold, budget, &ns);
			std::snprintf(name, sizeof(name), "memcpy_%s_%zu", cold ? "cold" : "hot", size);
			emit(name, gbps, "GB/s");
			if (size == 8) {
				std::snprintf(name, sizeof(name), "memcpy_%s_%zu_ns", cold ? "cold" : "hot", size);
				emit(name, ns, "ns");
			}
		}
	}
	return 0;
}
