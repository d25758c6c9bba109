/* SPDX-License-Identifier: MIT */
/*
 * Numbers that name objects on the fabric: QP numbers and SRQ numbers are
 * 24-bit and unique per device. For now they are unique within this process;
 * the broker (daemon/, data-path issue) will hand them out per device across
 * processes behind this same interface.
 */
#pragma once

#include <cstdint>

namespace shmverbs {

struct Device;

enum class IdKind { Qp, Srq };

/* Returns a free number (never 0 or 1: QP0 and QP1 are the special QPs), or
 * 0 when the 24-bit space is exhausted. */
uint32_t allocate_id(Device &dev, IdKind kind);
void release_id(Device &dev, IdKind kind, uint32_t id);

} // namespace shmverbs
