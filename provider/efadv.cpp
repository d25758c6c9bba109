/* SPDX-License-Identifier: MIT */
/*
 * libefa.so.1: the EFA direct verbs (<infiniband/efadv.h>), every name and
 * version of rdma-core 44's library. The emulated devices are not EFA
 * devices: on their objects every call fails with EOPNOTSUPP, as the real
 * libefa does for another vendor's device; other objects go to the real
 * libefa when there is one (provider/dv_common.h).
 */
#include "dv_common.h"

#include <infiniband/efadv.h>

/* EFA_1.0 */
SHMV_DV("EFA_1.0", struct ibv_qp *, efadv_create_driver_qp,
	(struct ibv_pd *ibvpd, struct ibv_qp_init_attr *attr, uint32_t driver_qp_type),
	(ibvpd, attr, driver_qp_type), ibvpd)

/* EFA_1.1 */
SHMV_DV("EFA_1.1", struct ibv_qp *, efadv_create_qp_ex,
	(struct ibv_context *ibvctx, struct ibv_qp_init_attr_ex *attr_ex,
	 struct efadv_qp_init_attr *efa_attr, uint32_t inlen),
	(ibvctx, attr_ex, efa_attr, inlen), ibvctx)
SHMV_DV("EFA_1.1", int, efadv_query_device,
	(struct ibv_context *ibvctx, struct efadv_device_attr *attr, uint32_t inlen),
	(ibvctx, attr, inlen), ibvctx)
SHMV_DV("EFA_1.1", int, efadv_query_ah,
	(struct ibv_ah *ibvah, struct efadv_ah_attr *attr, uint32_t inlen),
	(ibvah, attr, inlen), ibvah)

/* EFA_1.2 */
SHMV_DV("EFA_1.2", struct ibv_cq_ex *, efadv_create_cq,
	(struct ibv_context *ibvctx, struct ibv_cq_init_attr_ex *attr_ex,
	 struct efadv_cq_init_attr *efa_attr, uint32_t inlen),
	(ibvctx, attr_ex, efa_attr, inlen), ibvctx)
SHMV_DV("EFA_1.2", struct efadv_cq *, efadv_cq_from_ibv_cq_ex, (struct ibv_cq_ex *ibvcqx),
	(ibvcqx), ibvcqx)
