/* SPDX-License-Identifier: MIT */
/*
 * The function tables of an emulated context. verbs.h's inline verbs
 * (ibv_post_send, ibv_poll_cq, ibv_create_qp_ex, ...) jump through
 * ibv_context::ops and struct verbs_context, so every slot is filled: first
 * with a default that fails with EOPNOTSUPP in the convention of the slot's
 * return type, then each object family overlays what it implements.
 */
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <type_traits>

namespace shmverbs::abi {

template <typename Fn, int Err = EOPNOTSUPP>
struct Unsupported;

template <typename R, typename... Args, int Err>
struct Unsupported<R (*)(Args...), Err> {
	static R call(Args...)
	{
		if constexpr (std::is_pointer_v<R>) {
			errno = Err;
			return nullptr;
		} else if constexpr (std::is_void_v<R>) {
			return;
		} else {
			return static_cast<R>(Err);
		}
	}
};

/* Sets a slot to its EOPNOTSUPP default. */
#define SHMV_UNSUPPORTED(slot) (slot) = &shmverbs::abi::Unsupported<decltype(slot)>::call

void install_default_ops(struct verbs_context &vctx);
/* Every slot failing with EIO: a context inherited across fork() (lib/fork.h). */
void install_inherited_ops(struct verbs_context &vctx);

/* One overlay per object family, each in that family's verbs_*.cpp. */
void install_device_ops(struct verbs_context &vctx);
void install_pd_ops(struct verbs_context &vctx);
void install_cq_ops(struct verbs_context &vctx);
void install_qp_ops(struct verbs_context &vctx);
void install_srq_ops(struct verbs_context &vctx);

inline void install_ops(struct verbs_context &vctx)
{
	install_default_ops(vctx);
	install_device_ops(vctx);
	install_pd_ops(vctx);
	install_cq_ops(vctx);
	install_qp_ops(vctx);
	install_srq_ops(vctx);
}

} // namespace shmverbs::abi
