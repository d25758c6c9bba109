/* SPDX-License-Identifier: MIT */
#include "abi.h"
#include "ops.h"

using namespace shmverbs;
using namespace shmverbs::abi;

namespace shmverbs::abi {

void install_srq_ops(struct verbs_context &)
{
}

} // namespace shmverbs::abi
