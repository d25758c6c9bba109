/* SPDX-License-Identifier: MIT */
/*
 * The copy of the data path's small payloads (lib/datapath.cpp, lib/ud.cpp)
 * and of the inline data ibv_wr_set_inline_data() takes (SmallVec, datapath.h);
 * the gather and scatter of local pieces to and from a contiguous range.
 */
#pragma once

#include "copy_helper.h"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace shmverbs {

/* memcpy() for the data path's payloads, which are mostly a few bytes: up
 * to 16 bytes in two overlapping moves of the compiler's own, without a
 * call into libc (a call and its size dispatch cost more than the copy of
 * a small message). */
[[gnu::always_inline]] inline void copy_payload(void *to, const void *from, size_t n)
{
	char *d = static_cast<char *>(to);
	const char *s = static_cast<const char *>(from);
	if (n > 16) {
		if (n >= copy_split_min) [[unlikely]]
			copy_split(d, s, n);
		else
			std::memcpy(d, s, n);
	} else if (n >= 8) {
		uint64_t a, b;
		std::memcpy(&a, s, 8);
		std::memcpy(&b, s + n - 8, 8);
		std::memcpy(d, &a, 8);
		std::memcpy(d + n - 8, &b, 8);
	} else if (n >= 4) {
		uint32_t a, b;
		std::memcpy(&a, s, 4);
		std::memcpy(&b, s + n - 4, 4);
		std::memcpy(d, &a, 4);
		std::memcpy(d + n - 4, &b, 4);
	} else if (n) {
		/* 1 to 3 bytes: first, middle, last (some the same). */
		const char a = s[0], b = s[n / 2], c = s[n - 1];
		d[0] = a;
		d[n / 2] = b;
		d[n - 1] = c;
	}
}

/* The bytes of `count` pieces. */
inline uint64_t iov_bytes(const struct iovec *v, int count)
{
	uint64_t total = 0;
	for (int i = 0; i < count; i++)
		total += v[i].iov_len;
	return total;
}

/* The pieces, in order, into the range at `to`. */
inline void gather(char *to, const struct iovec *v, int count)
{
	for (int i = 0; i < count; i++) {
		std::memcpy(to, v[i].iov_base, v[i].iov_len);
		to += v[i].iov_len;
	}
}

/* The range at `from`, in order, into the pieces. */
inline void scatter(const struct iovec *v, int count, const char *from)
{
	for (int i = 0; i < count; i++) {
		std::memcpy(v[i].iov_base, from, v[i].iov_len);
		from += v[i].iov_len;
	}
}

} // namespace shmverbs
