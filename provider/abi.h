/* SPDX-License-Identifier: MIT */
/*
 * Helpers for the C ABI layer. Every exported verb follows the same shape:
 *
 *   validate arguments -> find our object (or forward a foreign one to the
 *   real library) -> call the engine -> translate the result
 *
 * and the translation is done here, once: pointer verbs return NULL and set
 * errno, int verbs return a positive errno (or whatever rdma-core 44 returns
 * for that verb), and no C++ exception ever crosses into the caller.
 */
#pragma once

#include "context.h"
#include "result.h"

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <new>

#define SHMV_EXPORT extern "C" __attribute__((visibility("default")))

namespace shmverbs::abi {

/* The next definition of a versioned symbol after ours: rdma-core's
 * libibverbs when we are LD_PRELOADed in front of it, nothing when we are the
 * drop-in libibverbs.so.1. Used to forward objects a real provider owns. */
void *next_symbol(const char *name, const char *version);

template <typename T>
T *fail_ptr(int err)
{
	errno = err;
	return nullptr;
}

/* Result<Engine> -> ABI pointer, or NULL with errno. */
template <typename T>
auto to_ptr(const Result<T> &r) -> decltype(r.get()->abi())
{
	if (!r) {
		errno = r.error();
		return nullptr;
	}
	return r.get()->abi();
}

/* Runs engine code for a pointer-returning verb; exceptions become errno. */
template <typename F>
auto guard_ptr(F &&f) noexcept -> decltype(f())
{
	try {
		return f();
	} catch (const std::bad_alloc &) {
		errno = ENOMEM;
	} catch (...) {
		errno = EIO;
	}
	return nullptr;
}

/* Runs engine code for an int verb (positive errno); exceptions become errno. */
template <typename F>
int guard_int(F &&f) noexcept
{
	try {
		return f();
	} catch (const std::bad_alloc &) {
		return ENOMEM;
	} catch (...) {
		return EIO;
	}
}

} // namespace shmverbs::abi

/*
 * Forwarding of objects we do not own. `SHMV_NEXT(ibv_alloc_pd, "IBVERBS_1.1")`
 * yields a pointer to the real function, or nullptr. The cache is per call site.
 */
#define SHMV_NEXT(name, version)                                                        \
	([]() -> decltype(&::name) {                                                     \
		static decltype(&::name) fp = reinterpret_cast<decltype(&::name)>(       \
			shmverbs::abi::next_symbol(#name, version));                     \
		return fp;                                                               \
	}())

/* Forward a pointer verb, or fail with EINVAL when no real library is there.
 * An object of a context inherited across fork() is not forwarded: EIO. */
#define SHMV_FORWARD_PTR(name, version, ...)                                            \
	do {                                                                             \
		if (::shmverbs::inherited_context_refused()) {                          \
			errno = EIO;                                                     \
			return nullptr;                                                  \
		}                                                                        \
		if (auto fp__ = SHMV_NEXT(name, version))                               \
			return fp__(__VA_ARGS__);                                        \
		errno = EINVAL;                                                          \
		return nullptr;                                                          \
	} while (0)

/* Forward an int verb, or return EINVAL when no real library is there (EIO
 * for an object of a context inherited across fork(); errno set too, for the
 * verbs whose convention is -1 and errno). */
#define SHMV_FORWARD_INT(name, version, ...)                                            \
	do {                                                                             \
		if (::shmverbs::inherited_context_refused()) {                          \
			errno = EIO;                                                     \
			return EIO;                                                      \
		}                                                                        \
		if (auto fp__ = SHMV_NEXT(name, version))                               \
			return fp__(__VA_ARGS__);                                        \
		return EINVAL;                                                           \
	} while (0)

/* The same for the verbs whose convention is -1 and errno (ibv_query_gid,
 * ibv_query_pkey, ibv_get_async_event, ibv_get_cq_event): a positive
 * return would read as success to code that checks for < 0. */
#define SHMV_FORWARD_NEG1(name, version, ...)                                           \
	do {                                                                             \
		if (::shmverbs::inherited_context_refused()) {                          \
			errno = EIO;                                                     \
			return -1;                                                       \
		}                                                                        \
		if (auto fp__ = SHMV_NEXT(name, version))                               \
			return fp__(__VA_ARGS__);                                        \
		errno = EINVAL;                                                          \
		return -1;                                                               \
	} while (0)
