/* SPDX-License-Identifier: MIT */
/*
 * A second process for the XRC domain tests (test_xrcd.cpp):
 *
 *   xrcd-helper <path> <oflags>
 *
 * opens the first emulated device, waits for one byte on stdin (so several
 * helpers can be started and then released together), calls ibv_open_xrcd()
 * on <path> with <oflags>, prints the result (0 or the errno) on a line of
 * its own, holds the domain until stdin reaches end of file, then closes it.
 * Exit status: 0, or 2 for a setup failure, 3 when closing failed.
 */
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 2;
	struct ibv_device **list = ibv_get_device_list(nullptr);
	if (!list || !list[0])
		return 2;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx)
		return 2;

	char go;
	if (read(STDIN_FILENO, &go, 1) != 1)
		return 2;
	struct ibv_xrcd_init_attr attr{};
	attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	attr.fd = fd;
	attr.oflags = std::atoi(argv[2]);
	errno = 0;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &attr);
	std::printf("%d\n", xrcd ? 0 : errno);
	std::fflush(stdout);

	char buf[64];
	while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
	}
	int status = 0;
	if (xrcd && ibv_close_xrcd(xrcd) != 0)
		status = 3;
	ibv_close_device(ctx);
	close(fd);
	return status;
}
