/* SPDX-License-Identifier: MIT */
/*
 * The drop-in libmlx5.so.1 and libefa.so.1 on the emulated devices: not mlx5
 * or EFA hardware, so every direct verb fails in the convention of its return
 * type, and NULL objects fail with EINVAL instead of crashing. With no real
 * library behind the drop-ins, provider-private objects cannot be forwarded
 * either: EOPNOTSUPP.
 */
#include <infiniband/efadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <dlfcn.h>

#include <cerrno>

namespace {

using shmv_test::OpenDevice;

} // namespace

TEST_CASE("mlx5dv: the emulated device is not an mlx5 device", "[dv][mlx5]")
{
	OpenDevice d;
	CHECK_FALSE(mlx5dv_is_supported(d.dev));
	CHECK_FALSE(mlx5dv_is_supported(nullptr));

	errno = 0;
	CHECK(mlx5dv_open_device(d.dev, nullptr) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_open_device(nullptr, nullptr) == nullptr);
	CHECK(errno == EINVAL);

	struct mlx5dv_context attrs {};
	CHECK(mlx5dv_query_device(d.ctx, &attrs) == EOPNOTSUPP);
	CHECK(mlx5dv_query_device(nullptr, &attrs) == EINVAL);
	struct mlx5dv_port port {};
	CHECK(mlx5dv_query_port(d.ctx, 1, &port) == EOPNOTSUPP);

	uint32_t in[4] = {}, out[4] = {};
	CHECK(mlx5dv_devx_general_cmd(d.ctx, in, sizeof(in), out, sizeof(out)) == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_devx_obj_create(d.ctx, in, sizeof(in), out, sizeof(out)) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	uint32_t eqn;
	CHECK(mlx5dv_devx_query_eqn(d.ctx, 0, &eqn) == EOPNOTSUPP);

	struct ibv_qp_init_attr_ex qp_attr {};
	struct mlx5dv_qp_init_attr dv_attr {};
	errno = 0;
	CHECK(mlx5dv_create_qp(d.ctx, &qp_attr, &dv_attr) == nullptr);
	CHECK(errno == EOPNOTSUPP);

	/* An fd-returning call: -1 with errno, never an errno posing as an fd. */
	errno = 0;
	CHECK(mlx5dv_vfio_get_events_fd(d.ctx) == -1);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_vfio_get_events_fd(nullptr) == -1);
	CHECK(errno == EINVAL);
}

TEST_CASE("mlx5dv: objects of the emulated device", "[dv][mlx5]")
{
	OpenDevice d;
	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);

	struct mlx5dv_pd dv_pd {};
	struct mlx5dv_obj obj {};
	obj.pd.in = pd;
	obj.pd.out = &dv_pd;
	CHECK(mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD) == EOPNOTSUPP);
	CHECK(mlx5dv_init_obj(nullptr, MLX5DV_OBJ_PD) == EINVAL);
	/* No object type selected: EINVAL whatever the device (libmlx5's
	 * get_context_from_obj). */
	CHECK(mlx5dv_init_obj(&obj, 0) == EINVAL);
	CHECK(mlx5dv_init_obj(&obj, 1ull << 20) == EINVAL);
	/* The MLX5_1.0 variant of mlx5dv_init_obj is a separate entry. */
	using InitObj = int (*)(struct mlx5dv_obj *, uint64_t);
	auto init_obj_1_0 =
		reinterpret_cast<InitObj>(dlvsym(RTLD_DEFAULT, "mlx5dv_init_obj", "MLX5_1.0"));
	REQUIRE(init_obj_1_0);
	CHECK(init_obj_1_0(&obj, MLX5DV_OBJ_PD) == EOPNOTSUPP);
	CHECK(init_obj_1_0(&obj, 0) == EINVAL);

	struct mlx5dv_mkey_init_attr mkey_attr {};
	mkey_attr.pd = pd;
	errno = 0;
	CHECK(mlx5dv_create_mkey(&mkey_attr) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_create_mkey(nullptr) == nullptr);
	CHECK(errno == EINVAL);

	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("mlx5dv: provider-private objects without a real libmlx5", "[dv][mlx5]")
{
	/* Only a real libmlx5 makes these; with none to forward to: EOPNOTSUPP
	 * for a non-NULL object, EINVAL for NULL. */
	errno = 0;
	CHECK(mlx5dv_dr_action_create_drop() == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(mlx5dv_dr_action_create_tag(1) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	CHECK(mlx5dv_dr_domain_destroy(nullptr) == EINVAL);
	/* A count or -errno: never a positive errno posing as a count. */
	CHECK(mlx5dv_qp_cancel_posted_send_wrs(nullptr, 7) == -EINVAL);
	errno = 0;
	CHECK(mlx5dv_devx_get_event(nullptr, nullptr, 0) == -1);
	CHECK(errno == EINVAL);
	mlx5dv_dr_domain_allow_duplicate_rules(nullptr, true); /* void: no crash */
	mlx5dv_devx_free_uar(nullptr);
	errno = 0;
	CHECK(mlx5dv_get_vfio_device_list(nullptr) == nullptr);
	CHECK(errno == EINVAL);
}

TEST_CASE("efadv: the emulated device is not an EFA device", "[dv][efa]")
{
	OpenDevice d;
	struct efadv_device_attr attr {};
	CHECK(efadv_query_device(d.ctx, &attr, sizeof(attr)) == EOPNOTSUPP);
	CHECK(efadv_query_device(nullptr, &attr, sizeof(attr)) == EINVAL);

	struct ibv_cq_init_attr_ex cq_attr {};
	struct efadv_cq_init_attr efa_cq {};
	errno = 0;
	CHECK(efadv_create_cq(d.ctx, &cq_attr, &efa_cq, sizeof(efa_cq)) == nullptr);
	CHECK(errno == EOPNOTSUPP);

	struct ibv_qp_init_attr_ex qp_attr {};
	struct efadv_qp_init_attr efa_qp {};
	errno = 0;
	CHECK(efadv_create_qp_ex(d.ctx, &qp_attr, &efa_qp, sizeof(efa_qp)) == nullptr);
	CHECK(errno == EOPNOTSUPP);

	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	struct ibv_qp_init_attr init {};
	errno = 0;
	CHECK(efadv_create_driver_qp(pd, &init, 0) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(efadv_create_driver_qp(nullptr, &init, 0) == nullptr);
	CHECK(errno == EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0);

	struct efadv_ah_attr ah_attr {};
	CHECK(efadv_query_ah(nullptr, &ah_attr, sizeof(ah_attr)) == EINVAL);
	errno = 0;
	CHECK(efadv_cq_from_ibv_cq_ex(nullptr) == nullptr);
	CHECK(errno == EINVAL);
}
