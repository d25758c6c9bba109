#!/usr/bin/env bash
# The main job: an unmodified RDMA program pair over the emulated device.
# Installs dependencies, builds, then runs Debian's ib_write_bw (perftest) as a
# server and a client, two processes that exchange their QP information over
# TCP on 127.0.0.1 and then move data with RDMA WRITEs through shared memory.
# The broker daemon starts by itself on first use. Extra arguments go to both
# sides, e.g. `scripts/demo.sh -a` for all message sizes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

export LD_LIBRARY_PATH="$top/build/provider${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=(-d shm0 -p "$port" --use_old_post_send -n 2000 "$@")

echo "=== ibv_devices (unmodified, Debian's ibverbs-utils) over shmverbs"
ibv_devices
echo "=== ib_write_bw server and client (unmodified, Debian's perftest) on shm0"
timeout 120 ib_write_bw "${args[@]}" >/tmp/shmverbs-demo-server.$$ 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f /tmp/shmverbs-demo-server.$$' EXIT
status=1
for _ in $(seq 50); do
	sleep 0.2
	if timeout 120 ib_write_bw "${args[@]}" 127.0.0.1; then
		status=0
		break
	fi
	kill -0 "$server" 2>/dev/null || break
done
wait "$server" || status=1
exit $status
