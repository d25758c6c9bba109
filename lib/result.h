/* SPDX-License-Identifier: MIT */
/*
 * The engine's one error convention: a verb either produces an object or a
 * positive errno. The C ABI layer (provider/abi.h) turns this into the
 * convention of each exported verb, in exactly one place.
 */
#pragma once

#include <cerrno>
#include <utility>

namespace shmverbs {

/* A positive errno, spelled out so that `return Err{EINVAL};` reads well. */
struct Err {
	int code;
};

template <typename T>
class Result {
public:
	Result(T *value) : value_(value), error_(value ? 0 : ENOMEM) {}
	Result(Err e) : value_(nullptr), error_(e.code) {}

	explicit operator bool() const { return value_ != nullptr; }
	T *get() const { return value_; }
	T *operator->() const { return value_; }
	int error() const { return error_; }

private:
	T *value_;
	int error_;
};

} // namespace shmverbs
