/* SPDX-License-Identifier: MIT */
#include "abi.h"

namespace shmverbs::abi {

void *next_symbol(const char *name, const char *version)
{
	void *sym = dlvsym(RTLD_NEXT, name, version);
	/* RTLD_NEXT can find ourselves again when the same definition is
	 * reachable twice (preload library also on the search path). */
	Dl_info here{}, there{};
	if (sym && dladdr(reinterpret_cast<void *>(&next_symbol), &here) &&
	    dladdr(sym, &there) && here.dli_fbase == there.dli_fbase)
		return nullptr;
	return sym;
}

} // namespace shmverbs::abi
