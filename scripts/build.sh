#!/usr/bin/env bash
# Configures (once) and builds one build directory.
#   scripts/build.sh [BUILD_DIR [meson setup options...]]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$top/build}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" "$top" "$@" >/dev/null
fi
ninja -C "$dir" -j"$(nproc)" >/dev/null
