#!/usr/bin/env bash
# The benchmarks of issue 4: installs dependencies (perftest, UCX's
# ucx_perftest, libfabric's fi_pingpong, gnuplot), builds, then runs
# bench/run.py: shmverbs under unmodified perftest against UCX and libfabric
# over shared memory, memcpy and a cross-process ping-pong, the queue
# microbenchmarks and the fallback paths, interleaved and repeated nine times
# (about 10 minutes on a 2-core machine). Results: bench/results/<timestamp>/
# (results.md, runs.jsonl, summary.json, lat.png, bw.png).
#   scripts/bench.sh               the full run
#   scripts/bench.sh --smoke       every case once, tiny counts (under a minute)
#   scripts/bench.sh --publish     also copy the results to docs/bench/
# Other arguments go to bench/run.py (--reps N, --out DIR).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

args=()
for a in "$@"; do
	if [ "$a" = "--publish" ]; then
		args+=(--publish "$top/docs/bench")
	else
		args+=("$a")
	fi
done
exec python3 "$top/bench/run.py" --build "$top/build" "${args[@]}"
