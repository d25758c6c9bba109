#!/usr/bin/env bash
# Runs every test: installs dependencies, builds, and runs the whole meson test
# suite in the normal build and in the sanitizer builds (ASan+UBSan, TSan).
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the normal build only
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

"$top/scripts/install-deps.sh"

status=0
run_suite() {
	local name=$1 dir=$2
	shift 2
	echo "=== $name: build ($dir)"
	"$top/scripts/build.sh" "$dir" "$@"
	echo "=== $name: meson test"
	if ! meson test -C "$dir" --print-errorlogs --num-processes 2; then
		status=1
	fi
}

run_suite "default" "$top/build"
if [ "${1:-}" != "--quick" ]; then
	run_suite "asan+ubsan" "$top/build-asan" -Db_sanitize=address,undefined -Db_lundef=false \
		-Dbuildtype=debug
	run_suite "tsan" "$top/build-tsan" -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debug
fi

if [ $status -ne 0 ]; then
	echo "=== some tests FAILED" >&2
fi
exit $status
