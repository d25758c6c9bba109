#!/usr/bin/env bash
# Installs everything shmverbs needs to build, test and run its demo, from
# Debian 12 packages. Safe to run repeatedly; does nothing when all is there.
set -euo pipefail

packages=(
	# build
	g++ meson ninja-build pkg-config
	libibverbs-dev libboost-dev libboost-program-options-dev catch2
	# unmodified clients the tests and the demo run
	ibverbs-utils perftest python3 python3-pyverbs
	# tools the tests use
	binutils procps
	# the benchmarks' references and plots (scripts/bench.sh)
	ucx-utils libfabric-bin gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "shmverbs: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null; then
		sudo="sudo"
	else
		echo "shmverbs: need root to install: apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
