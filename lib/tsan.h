/* SPDX-License-Identifier: MIT */
/*
 * ThreadSanitizer's annotations, for the few places where the library does
 * what TSan cannot follow (nothing in builds without it).
 *
 * TsanIgnoreAccesses: this thread's memory accesses are not recorded in
 * the scope. Besides the loads and stores themselves, it changes what an
 * mmap() over existing memory means to TSan: with accesses ignored, its
 * interceptor forgets the range's history instead of imitating a write to
 * every byte of it.
 */
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" {
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);
}

namespace shmverbs {

struct TsanIgnoreAccesses {
	TsanIgnoreAccesses()
	{
		AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
		AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
	}
	~TsanIgnoreAccesses()
	{
		AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
		AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
	}
	TsanIgnoreAccesses(const TsanIgnoreAccesses &) = delete;
	TsanIgnoreAccesses &operator=(const TsanIgnoreAccesses &) = delete;
};

/* Accesses and synchronization both (the atomics of an access that stands
 * for a device's DMA). */
struct TsanIgnoreAll : TsanIgnoreAccesses {
	TsanIgnoreAll() { AnnotateIgnoreSyncBegin(__FILE__, __LINE__); }
	~TsanIgnoreAll() { AnnotateIgnoreSyncEnd(__FILE__, __LINE__); }
};

} // namespace shmverbs
#else
namespace shmverbs {
struct TsanIgnoreAccesses {};
struct TsanIgnoreAll {};
} // namespace shmverbs
#endif
