/* SPDX-License-Identifier: MIT */
/*
 * The forwarding path of the LD_PRELOAD library. This program is linked
 * against Debian's real libibverbs and run three ways:
 *
 *   forward_check preload   with LD_PRELOAD=libshmverbs.so: our exports win
 *                           (the emulated shm0 is listed), and a verb called
 *                           on an object we do not own reaches the real
 *                           libibverbs' definition (next_symbol found it);
 *   forward_check dropin    with LD_LIBRARY_PATH=<our drop-ins>: nothing to
 *                           forward to, so the foreign object is refused
 *                           with EINVAL;
 *   forward_check real      plain Debian libibverbs, as a reference.
 *
 * The foreign object is a device record of our own making: the real
 * ibv_get_device_name() just returns its name, so the name coming back
 * proves the call went through to Debian's library. For the direct verbs
 * the program also links Debian's libmlx5: a DR tag action is a pure software
 * object of the real libmlx5, so creating one succeeds exactly when the call
 * reaches it.
 */
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void check(const char *what, int ok)
{
	printf("%s %s\n", ok ? "ok  " : "FAIL", what);
	if (!ok)
		failures++;
}

static int lists_shm0(void)
{
	int n = 0, found = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		found |= strcmp(ibv_get_device_name(list[i]), "shm0") == 0;
	if (list)
		ibv_free_device_list(list);
	return found;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	/* Room behind the ibv_device for what a real verbs_device holds. */
	static struct {
		struct ibv_device dev;
		char provider_private[4096];
	} foreign;
	strcpy(foreign.dev.name, "foreign0");

	int ours_loaded = dlsym(RTLD_DEFAULT, "shmverbs_version") != NULL;
	errno = 0;
	const char *name = ibv_get_device_name(&foreign.dev);
	int err = errno;
	errno = 0;
	struct mlx5dv_dr_action *tag = mlx5dv_dr_action_create_tag(7);
	int tag_err = errno;
	int tag_destroyed = tag ? mlx5dv_dr_action_destroy(tag) == 0 : 0;

	if (!strcmp(mode, "preload")) {
		check("libshmverbs.so is loaded", ours_loaded);
		check("our ibv_get_device_list wins: shm0 listed", lists_shm0());
		check("foreign device forwarded to Debian's ibv_get_device_name",
		      name && !strcmp(name, "foreign0"));
		check("mlx5dv_dr_action_create_tag/destroy forwarded to Debian's libmlx5",
		      tag && tag_destroyed);
	} else if (!strcmp(mode, "dropin")) {
		check("our drop-in libibverbs is loaded", ours_loaded);
		check("shm0 listed", lists_shm0());
		check("foreign device refused with EINVAL", !name && err == EINVAL);
		check("our libmlx5: no real one to make a DR action", !tag && tag_err == EOPNOTSUPP);
	} else if (!strcmp(mode, "real")) {
		check("Debian's libibverbs alone", !ours_loaded && !lists_shm0());
		check("Debian's ibv_get_device_name returns the record's name",
		      name && !strcmp(name, "foreign0"));
		check("Debian's libmlx5 makes a DR tag action", tag && tag_destroyed);
	} else {
		fprintf(stderr, "usage: %s preload|dropin|real\n", argv[0]);
		return 2;
	}
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
