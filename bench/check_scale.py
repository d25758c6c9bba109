#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The CI smoke test of bench/scale.py: runs `scale.py --quick` and checks
that every measurement is present, well formed and sane (finite, positive,
consistent ratios), and that the functional ones passed. Performance targets
are not enforced here: on a loaded CI machine they are noise.

  check_scale.py BUILD_DIR
"""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = {"group", "name", "value", "unit", "reference", "ratio", "target", "pass"}
EXPECTED = ["rc_qps_with_traffic", "qps_messages_checked", "qps_create_time",
            "qps_connect_time", "qps_traffic_time", "qps_destroy_time", "qps_total_time",
            "qps_client_fds", "bw_write_1qp", "bw_write_256qp", "bw_write_1qp_per_cpu",
            "bw_write_256qp_per_cpu", "shm_queues_per_qp", "shm_per_qp",
            "shm_overhead_per_qp", "oversub_1pair_x8", "oversub_8pairs",
            "oversub_events_1pair_x8", "oversub_events_8pairs"]
# Functional results: these must pass even in the smoke test.
MUST_PASS = ["rc_qps_with_traffic", "shm_per_qp", "oversub_8pairs", "oversub_events_8pairs"]


def main():
    build = sys.argv[1]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "scale.py"), "--quick",
                           "--build", build], capture_output=True, text=True, timeout=600)
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    if proc.returncode != 0:
        print(f"FAIL: scale.py exited {proc.returncode}")
        return 1
    lines = {}
    for text in proc.stdout.splitlines():
        m = json.loads(text)
        if set(m) != KEYS or m["group"] != "scale" or m["name"] in lines:
            print(f"FAIL: malformed or repeated line: {text}")
            return 1
        lines[m["name"]] = m
    errors = [f"missing {n}" for n in EXPECTED if n not in lines]
    for n, m in lines.items():
        if not isinstance(m["value"], (int, float)) or not math.isfinite(m["value"]):
            errors.append(f"{n}: value {m['value']!r}")
        elif m["value"] < 0 or (m["value"] == 0 and not n.startswith("shm_overhead")):
            errors.append(f"{n}: value {m['value']} not positive")
        if m["reference"] is not None:
            ref = lines.get(m["reference"])
            if ref is None:
                errors.append(f"{n}: reference {m['reference']} missing")
            elif m["ratio"] is None or abs(m["ratio"] - m["value"] / ref["value"]) > \
                    1e-3 * max(1.0, m["ratio"]):
                errors.append(f"{n}: ratio {m['ratio']} is not value / reference")
        if (m["target"] is None) != (m["pass"] is None):
            errors.append(f"{n}: a target needs a verdict and a verdict a target")
    errors += [f"{n} did not pass" for n in MUST_PASS if n in lines and lines[n]["pass"] is not True]
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
