#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Scale measurements of issue 4, driving build/bench/scale-bench (one
client process that re-executes itself as the server) with a private broker
runtime directory. Prints one JSON line per measurement:

  {"group": "scale", "name": str, "value": float, "unit": str,
   "reference": str or null, "ratio": float or null, "target": str or null,
   "pass": bool or null}

  scale.py [--quick] [--build DIR] [--repeat N]

Full mode takes the median of --repeat (default 3; bandwidth: at least 5)
runs of each figure;
--quick runs each once at smaller sizes (the CI smoke test). Ratios compare
figures of the same run. Every process is bounded in time and killed by PID
when it overruns. Exit status: 0 when every run completed (a missed target
is reported in its line, not in the status), 1 when a run failed.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class RunFailed(Exception):
    pass


def line(name, value, unit, reference=None, ratio=None, target=None, passed=None):
    print(json.dumps({"group": "scale", "name": name, "value": round(float(value), 6),
                      "unit": unit, "reference": reference,
                      "ratio": None if ratio is None else round(float(ratio), 4),
                      "target": target, "pass": passed}), flush=True)


class Runner:
    def __init__(self, build, timeout):
        self.exe = os.path.join(build, "bench", "scale-bench")
        broker = os.path.join(build, "daemon", "shmverbsd")
        for path in (self.exe, broker):
            if not os.access(path, os.X_OK):
                raise SystemExit(f"scale.py: {path} is not built")
        self.runtime = tempfile.mkdtemp(prefix="shmverbs-scale-")
        os.chmod(self.runtime, 0o700)
        self.env = dict(os.environ)
        self.env.update({"SHMVERBS_RUNTIME_DIR": self.runtime, "SHMVERBS_BROKER": broker,
                         "SHMVERBS_BROKER_IDLE_TIMEOUT": "1", "SHMVERBS_CONFIG": "",
                         "LD_PRELOAD": ""})
        self.timeout = timeout

    def close(self):
        shutil.rmtree(self.runtime, ignore_errors=True)

    def start(self, *args):
        cmd = [self.exe] + [str(a) for a in args] + ["--timeout", str(self.timeout)]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def finish(self, proc, deadline):
        """The JSON object the run printed; kills it (by PID) past deadline."""
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # the server child dies with it (PR_SET_PDEATHSIG)
            proc.communicate()
            raise RunFailed(f"{' '.join(proc.args)}: killed after its time limit")
        if proc.returncode != 0:
            raise RunFailed(f"{' '.join(proc.args)}: exit {proc.returncode}: {err.strip()}")
        return json.loads(out.strip().splitlines()[-1])

    def run(self, *args):
        # A little over the program's own limit: it reports its own timeouts.
        return self.finish(self.start(*args), time.monotonic() + self.timeout + 5)


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def measure_connect(r, qps, rounds, repeat):
    runs = [r.run("connect", "--qps", qps, "--rounds", rounds) for _ in range(repeat)]
    total = [x["create_s"] + x["connect_s"] + x["traffic_s"] + x["destroy_s"] for x in runs]
    ok = all(x["qps"] == qps and x["messages"] == 2 * qps * rounds for x in runs)
    line("rc_qps_with_traffic", qps, "QPs", target=f">= {qps} RC QPs, every QP and "
         "completion checked", passed=ok)
    line("qps_messages_checked", runs[0]["messages"], "messages")
    line("qps_create_time", median(runs, "create_s"), "s")
    line("qps_connect_time", median(runs, "connect_s"), "s")
    line("qps_traffic_time", median(runs, "traffic_s"), "s")
    line("qps_destroy_time", median(runs, "destroy_s"), "s")
    line("qps_total_time", statistics.median(total), "s")
    line("qps_client_fds", median(runs, "fds"), "fds")


def measure_bw(r, qps, msg, total, repeat):
    # Interleaved, so that both figures see the same machine state. The
    # target is passive: the client's CPU time is the whole cost, and bytes
    # per CPU-second is the same ratio without other programs' noise.
    single, many = [], []
    for _ in range(repeat):
        single.append(r.run("bw", "--qps", 1, "--msg", msg, "--total", total))
        many.append(r.run("bw", "--qps", qps, "--msg", msg, "--total", total))
    one, agg = median(single, "gbps"), median(many, "gbps")
    line("bw_write_1qp", one, "GB/s")
    ratio = agg / one if one else None
    line(f"bw_write_{qps}qp", agg, "GB/s", reference="bw_write_1qp", ratio=ratio,
         target=">= 0.7", passed=ratio is not None and ratio >= 0.7)
    one, agg = median(single, "gb_per_cpu_s"), median(many, "gb_per_cpu_s")
    line("bw_write_1qp_per_cpu", one, "GB/CPU-s")
    line(f"bw_write_{qps}qp_per_cpu", agg, "GB/CPU-s", reference="bw_write_1qp_per_cpu",
         ratio=agg / one if one else None)


def measure_mem(r, qps, repeat):
    runs = [r.run("mem", "--qps", qps) for _ in range(repeat)]
    per_qp = median(runs, "per_qp")
    queues = runs[0]["queues"]
    line("shm_queues_per_qp", queues, "B")
    line("shm_per_qp", per_qp, "B", reference="shm_queues_per_qp",
         ratio=per_qp / queues if queues else None, target="<= queues + 8192 B",
         passed=per_qp <= queues + 8192)
    line("shm_overhead_per_qp", per_qp - queues, "B", target="<= 8192 B",
         passed=per_qp - queues <= 8192)


def measure_oversubscribed(r, pairs, rounds, repeat, timeout, events):
    """The same total work as 1 pair and as `pairs` pairs at once, all
    started together once every pair is connected (a barrier directory);
    the time is from the start to the last pair's end. Both sides of a
    pair spin on their CQs, or (events) sleep on a completion channel."""
    mode = ["--events", 1] if events else []

    def group(n, work):
        barrier = tempfile.mkdtemp(prefix="barrier-", dir=r.runtime)
        t0 = time.monotonic()
        procs = [r.start("work", "--rounds", work, "--barrier", barrier, *mode)
                 for _ in range(n)]
        # Every client connected and waiting: go.
        while len([f for f in os.listdir(barrier) if f.startswith("ready.")]) < n:
            if time.monotonic() > t0 + timeout or any(p.poll() is not None for p in procs):
                break  # finish() below reports the failure
            time.sleep(0.005)
        start = time.monotonic()
        open(os.path.join(barrier, "go"), "w").close()
        results, failure = [], None
        for p in procs:
            try:
                results.append(r.finish(p, start + timeout))
            except RunFailed as e:
                failure = failure or e
        shutil.rmtree(barrier, ignore_errors=True)
        if failure:
            raise failure
        return max(x["end"] for x in results) - start

    single, many = [], []
    for _ in range(repeat):
        single.append(group(1, rounds * pairs))
        many.append(group(pairs, rounds))
    one, par = statistics.median(single), statistics.median(many)
    kind = "oversub_events" if events else "oversub"
    line(f"{kind}_1pair_x{pairs}", one, "s")
    line(f"{kind}_{pairs}pairs", par, "s", reference=f"{kind}_1pair_x{pairs}",
         ratio=par / one if one else None,
         target=f"all {pairs} pairs finish within {timeout:.0f} s (no livelock)", passed=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one run each")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    a = ap.parse_args()
    repeat = 1 if a.quick else max(1, a.repeat)
    r = Runner(a.build, a.timeout)
    try:
        if a.quick:
            measure_connect(r, 1024, 2, repeat)
            measure_bw(r, 256, 64 << 10, 256 << 20, repeat)
            measure_mem(r, 256, repeat)
            measure_oversubscribed(r, 8, 50, repeat, a.timeout, events=False)
            measure_oversubscribed(r, 8, 50, repeat, a.timeout, events=True)
        else:
            measure_connect(r, 4096, 4, repeat)
            measure_bw(r, 256, 64 << 10, 4 << 30, max(repeat, 5))
            measure_mem(r, 1024, repeat)
            measure_oversubscribed(r, 8, 500, repeat, a.timeout, events=False)
            measure_oversubscribed(r, 8, 500, repeat, a.timeout, events=True)
    except RunFailed as e:
        print(f"scale.py: {e}", file=sys.stderr)
        return 1
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
