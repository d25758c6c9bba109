/* SPDX-License-Identifier: MIT */
/*
 * Enum values that come from the application. A C caller may pass any int in
 * an enum ibv_* parameter or field (tests do, to check that we refuse it with
 * EINVAL). In C++ an enum without a fixed underlying type only holds the
 * values of its enumerators' bit range: loading anything else as the enum is
 * undefined behaviour (UBSan: "not a valid value for type"). So an enum that
 * has not been validated yet is read through its bytes, as its underlying
 * integer, and compared to the enumerators; only a valid one is converted.
 */
#pragma once

#include <cstring>
#include <type_traits>

namespace shmverbs {

template <typename E>
std::underlying_type_t<E> abi_enum_value(const E &e)
{
	static_assert(std::is_enum_v<E>);
	std::underlying_type_t<E> v;
	std::memcpy(&v, &e, sizeof v);
	return v;
}

} // namespace shmverbs
