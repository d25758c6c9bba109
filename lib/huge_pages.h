/* SPDX-License-Identifier: MIT */
/*
 * libmlx5's queue buffer allocation types, as far as they are observable.
 *
 * libmlx5 reads MLX_QP_ALLOC_TYPE, MLX_CQ_ALLOC_TYPE and MLX_SRQ_ALLOC_TYPE
 * (and the older HUGE_CQ, HUGE_RC, HUGE_UC, HUGE_UD = "y") every time it
 * creates such an object. HUGE puts the queue's buffer on huge pages or
 * fails the create; PREFER_HUGE and ALL try huge pages first and fall back.
 * Our queues live in the shared segment (lib/segment.h), where peers reach
 * them, so the queue itself never moves; what the application and the host
 * see is kept instead: an object asked onto huge pages takes the huge pages
 * libmlx5 would take (its buffer's size in 32 KiB chunks, carved out of
 * SysV SHM_HUGETLB regions of whole 2 MiB pages that the context shares
 * between its objects, as libmlx5's do), keeps them until it is destroyed,
 * and cannot be created when the host has none left: ENOMEM on a host
 * without huge pages, as with libmlx5 (rdma-core's test_obj_on_huge).
 * CONTIG and PREFER_CONTIG are treated as the default (ANON).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace shmverbs {

struct Context;
struct ParentDomain;

/* What an object asks for, from the environment (mlx5 profile only). */
enum class AllocType { Anon, Huge, PreferHuge };

/* `component` is libmlx5's prefix ("MLX_QP", "MLX_CQ", "MLX_SRQ");
 * `legacy_key` the older variable that, set to "y", makes HUGE the default
 * (nullptr: none). */
AllocType queue_alloc_type(const char *component, const char *legacy_key);

/* The huge-page chunks one context's objects hold. */
class HugeChunks {
public:
	/* What one object holds; empty (region == nullptr) when it holds none. */
	struct Lease {
		void *region = nullptr;
		uint32_t first = 0;
		uint32_t count = 0;
	};

	HugeChunks() = default;
	HugeChunks(const HugeChunks &) = delete;
	HugeChunks &operator=(const HugeChunks &) = delete;
	~HugeChunks();

	/* Takes the chunks a buffer of `bytes` needs: 0, or the errno of the
	 * huge-page allocation that failed (ENOMEM without huge pages). */
	int take(size_t bytes, Lease &out);
	/* Gives them back; a region left empty returns its pages. */
	void give_back(Lease &lease);
	/* Takes for `type`: HUGE fails as take() does, PREFER_HUGE falls back
	 * to holding nothing, ANON holds nothing. */
	int take_for(AllocType type, size_t bytes, Lease &out);

	static constexpr size_t chunk_bytes = 32768;
	static constexpr size_t huge_page_bytes = 2u << 20;

private:
	struct Region {
		void *addr;
		std::vector<bool> used; /* one per chunk */
	};
	std::mutex lock_;
	std::vector<Region> regions_;
};

/* What libmlx5 would hold on huge pages for a queue buffer of `bytes` of
 * an object created on `ctx`, taken into `out`: nothing but under the mlx5
 * profile, and nothing when `parent` brings its own allocators (libmlx5
 * then calls those instead). 0, or ENOMEM (the errno of the huge-page
 * allocation) when the object asked for HUGE and none could be had. */
int take_queue_huge_pages(Context &ctx, const ParentDomain *parent, const char *component,
			  const char *legacy_key, size_t bytes, HugeChunks::Lease &out);

} // namespace shmverbs
