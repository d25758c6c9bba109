/* SPDX-License-Identifier: MIT */
/*
 * shmverbs public header.
 *
 * Programs use the ordinary <infiniband/verbs.h> API; this header only adds a
 * few queries that let a program (or a test suite) find out whether it runs on
 * shmverbs and on which emulated device.
 */
#ifndef SHMVERBS_SHMVERBS_H
#define SHMVERBS_SHMVERBS_H

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHMVERBS_VERSION_MAJOR 0
#define SHMVERBS_VERSION_MINOR 1

/* Returns the shmverbs version string, e.g. "0.1.0". */
const char *shmverbs_version(void);

/* Returns 1 when @context was opened on an emulated shmverbs device, 0 otherwise. */
int shmverbs_is_emulated(struct ibv_context *context);

/* Returns 1 when @device is an emulated shmverbs device, 0 otherwise. */
int shmverbs_is_emulated_device(struct ibv_device *device);

#ifdef __cplusplus
}
#endif

#endif /* SHMVERBS_SHMVERBS_H */
