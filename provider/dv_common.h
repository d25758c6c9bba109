/* SPDX-License-Identifier: MIT */
/*
 * The shape of every direct-verbs entry point (mlx5dv_*, efadv_*) that our
 * libmlx5.so.1 / libefa.so.1 drop-ins and libshmverbs.so export.
 *
 * The emulated devices are not mlx5 or EFA hardware: we do not emulate the
 * vendors' queue formats, doorbells or firmware commands, so on our objects
 * these calls fail the way rdma-core 44's libraries fail on a device of
 * another vendor: EOPNOTSUPP in the convention of the return type (NULL with
 * errno, a positive errno, false, -1 with errno for ssize_t).
 *
 * On anything else - an object of a real provider, or a provider-private
 * object (a DR domain, a DEVX object, ...) that only the real library can
 * have made - the call is passed to the real libmlx5 / libefa when there is
 * one (LD_PRELOAD next to real libraries), and fails with EOPNOTSUPP when
 * there is not. A NULL object fails with EINVAL instead of crashing.
 *
 * Ownership is decided through shmverbs_is_emulated*() of libibverbs: these
 * libraries hold no engine of their own.
 */
#pragma once

#include <shmverbs/shmverbs.h>

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cerrno>
#include <sys/types.h>
#include <type_traits>

#define SHMV_DV_EXPORT extern "C" __attribute__((visibility("default")))

namespace shmverbs::dv {

enum class Owner { Null, Ours, Foreign };

/* For calls that take no verbs object at all: only the real provider can
 * make sense of them. */
struct NoObject {
};

inline Owner owner_of(NoObject) { return Owner::Foreign; }

inline Owner owner_of(struct ibv_context *ctx)
{
	if (!ctx)
		return Owner::Null;
	return shmverbs_is_emulated(ctx) ? Owner::Ours : Owner::Foreign;
}

inline Owner owner_of(struct ibv_device *dev)
{
	if (!dev)
		return Owner::Null;
	return shmverbs_is_emulated_device(dev) ? Owner::Ours : Owner::Foreign;
}

inline Owner owner_of(struct ibv_qp_ex *qpx)
{
	return qpx ? owner_of(qpx->qp_base.context) : Owner::Null;
}

/* Verbs objects (QP, CQ, SRQ, WQ, PD, AH, DM, ...) belong to their context;
 * any other pointer is a provider-private object. */
template <typename T>
Owner owner_of(T *obj)
{
	if (!obj)
		return Owner::Null;
	if constexpr (requires { obj->context; }) {
		if constexpr (std::is_convertible_v<decltype(obj->context), struct ibv_context *>)
			return owner_of(static_cast<struct ibv_context *>(obj->context));
	}
	return Owner::Foreign;
}

/* The failure of an unsupported call in the convention of its return type. */
template <typename R>
R unsupported(int err)
{
	if constexpr (std::is_void_v<R>) {
		return;
	} else if constexpr (std::is_pointer_v<R>) {
		errno = err;
		return nullptr;
	} else if constexpr (std::is_same_v<R, bool>) {
		return false;
	} else if constexpr (std::is_same_v<R, ssize_t>) {
		errno = err;
		return -1;
	} else {
		return static_cast<R>(err);
	}
}

/* The real library's definition of name@version, never our own. */
inline void *next_symbol(const char *name, const char *version)
{
	static const int here = 0;
	void *sym = dlvsym(RTLD_NEXT, name, version);
	Dl_info ours{}, theirs{};
	if (sym && dladdr(&here, &ours) && dladdr(sym, &theirs) &&
	    ours.dli_fbase == theirs.dli_fbase)
		return nullptr;
	return sym;
}

} // namespace shmverbs::dv

/* The real definition of an exported name. Found once per call site; a miss
 * is retried on the next call, since a program may dlopen() the real vendor
 * library (as pyverbs' provider modules do) after our first call. */
#define SHMV_DV_NEXT(name, version)                                                      \
	([]() -> decltype(&::name) {                                                     \
		static std::atomic<decltype(&::name)> fp{nullptr};                       \
		if (auto found = fp.load(std::memory_order_acquire))                     \
			return found;                                                    \
		auto found = reinterpret_cast<decltype(&::name)>(                        \
			shmverbs::dv::next_symbol(#name, version));                      \
		fp.store(found, std::memory_order_release);                              \
		return found;                                                            \
	}())

/*
 * Defines one entry point:
 *   SHMV_DV("MLX5_1.7", int, mlx5dv_devx_general_cmd,
 *           (struct ibv_context *context, ...), (context, ...), context)
 * The prototype must match the vendor header's declaration (the compiler
 * checks it); `owner` is the argument that tells whose object this is.
 */
#define SHMV_DV(version, ret, name, params, args, owner)                                 \
	SHMV_DV_EXPORT ret name params                                                  \
	{                                                                                \
		using namespace shmverbs::dv;                                            \
		switch (owner_of(owner)) {                                               \
		case Owner::Null:                                                        \
			return unsupported<ret>(EINVAL);                                 \
		case Owner::Foreign:                                                     \
			if (auto real = SHMV_DV_NEXT(name, version))                     \
				return real args;                                        \
			break;                                                           \
		case Owner::Ours:                                                        \
			break;                                                           \
		}                                                                        \
		return unsupported<ret>(EOPNOTSUPP);                                     \
	}
