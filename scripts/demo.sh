#!/usr/bin/env bash
# The main job: an unmodified RDMA program over the emulated device.
# Installs dependencies, builds, and runs `ibv_devinfo -v` on shm0 through the
# drop-in libibverbs.so.1 (the data-path issue upgrades this to a client/server
# pair).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

export LD_LIBRARY_PATH="$top/build/provider${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "=== ibv_devices (unmodified, Debian's ibverbs-utils) over shmverbs"
ibv_devices
echo "=== ibv_devinfo -v -d shm0"
ibv_devinfo -v -d shm0
