#!/usr/bin/env bash
# Runs every test: installs dependencies, builds, and runs the whole meson test
# suite in the normal build and in the sanitizer builds (ASan+UBSan, TSan).
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the normal build only
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

"$top/scripts/install-deps.sh"

# UBSan reports and carries on unless told otherwise: a finding must fail
# its test (the processes each test starts inherit this).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

status=0
passed=0
failed=0
skipped=0
# Adds one suite's results (meson's JSON test log) to the totals.
count_results() {
	local counts
	counts=$(python3 - "$1/meson-logs/testlog.json" <<'PY'
import json, sys
res = {"OK": 0, "FAIL": 0, "SKIP": 0}
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    key = "OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"
    res[key] += 1
print(res["OK"], res["FAIL"], res["SKIP"])
PY
)
	read -r p f s <<<"$counts"
	passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

# A sanitizer report anywhere in a suite's log fails the run, also one from
# a process whose exit status no test looks at (a test's helper processes,
# a peer it started): the log holds the output of every test, passed or not.
reports=0
report_pattern='WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:'
scan_reports() {
	local name=$1 log=$2/meson-logs/testlog.txt n
	n=$(grep -cE "$report_pattern" "$log" || true)
	if [ "$n" -gt 0 ]; then
		echo "=== $name: $n sanitizer report(s) in $log:" >&2
		grep -E -A12 "$report_pattern" "$log" | head -200 >&2
		reports=$((reports + n))
		status=1
	fi
}

run_suite() {
	local name=$1 dir=$2
	shift 2
	echo "=== $name: build ($dir)"
	"$top/scripts/build.sh" "$dir" "$@"
	echo "=== $name: meson test"
	if ! meson test -C "$dir" --print-errorlogs --num-processes 2; then
		status=1
	fi
	count_results "$dir"
	scan_reports "$name" "$dir"
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
echo "$passed passed, $failed failed, $skipped skipped, $reports sanitizer reports"
exit $status
