/* SPDX-License-Identifier: MIT */
/*
 * Cross-memory attach blocked the way a container's default seccomp profile
 * blocks it, for the tests of the memory paths that do without it (the
 * memshare unit tests and the data path with real processes).
 */
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace shmv_test {

#if defined(__x86_64__)
inline constexpr uint32_t audit_arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
inline constexpr uint32_t audit_arch = AUDIT_ARCH_AARCH64;
#else
#error "add the AUDIT_ARCH of this architecture"
#endif

/* process_vm_readv/writev fail with EPERM from now on, in this process and
 * every process it starts. Returns 0 or the errno of prctl/seccomp. */
inline int block_cma_with_seccomp()
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, audit_arch, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	};
	struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return errno;
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
		return errno;
	return 0;
}

} // namespace shmv_test
