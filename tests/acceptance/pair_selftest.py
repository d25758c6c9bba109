# SPDX-License-Identifier: MIT
"""pair.py's own judgement: a pair whose programs exit 0 but print a
sanitizer report (server or client side, each runtime's marker) must fail
and show the report; a clean pair must pass. A client that could not
reach the server yet is run again; one that failed after reaching it is
not, and its output is shown. The programs are a stand-in script, so this
needs neither Debian's binaries nor a sanitizer build.

  pair_selftest.py PAIR_PY DROPIN_DIR PRELOAD_LIB BROKER
"""
import os
import stat
import subprocess
import sys
import tempfile

from shmv_acceptance import Checker

# Server: `prog -p PORT`; client: the same plus 127.0.0.1 (pair.py).
FAKE = """#!/usr/bin/env python3
import os, sys, time
side = "client" if sys.argv[-1] == "127.0.0.1" else "server"
runs = os.environ.get("FAKE_CLIENT_RUNS")
if side == "server" and runs:
    # Stays up (2 s at most) until a client has succeeded, as a
    # perftest server waits for its client.
    for _ in range(200):
        if os.path.exists(runs + ".ok"):
            break
        time.sleep(0.01)
if side == "client" and runs:
    with open(runs, "a") as f:
        f.write("x")
    n = len(open(runs).read())
    if os.environ.get("FAKE_CLIENT_FAIL"):
        print(os.environ["FAKE_CLIENT_FAIL"])
        sys.exit(1)
    if n == 1:
        print("Couldn't connect to 127.0.0.1:1")
        sys.exit(1)
    open(runs + ".ok", "w").close()
if os.environ.get("FAKE_REPORT_SIDE") == side:
    print(os.environ["FAKE_REPORT"])
    print("    #0 0x4242 in somewhere lib/somewhere.cpp:1")
    print("")
    print("after the report")
calib = os.environ.get("FAKE_CALIBRATION_RUNS")
if calib:
    # The first FAKE_CALIBRATION_FAILS pair runs fail as perftest does when
    # its clock calibration is spoiled; the server counts the runs.
    if side == "server":
        with open(calib, "a") as f:
            f.write("x")
    time.sleep(0.3)  # the client reads the count after the server wrote it
    if len(open(calib).read()) <= int(os.environ["FAKE_CALIBRATION_FAILS"]):
        # FAKE_CALIBRATION_SIDE: only that side's calibration fails; the
        # other loses it before the final exchange.
        only = os.environ.get("FAKE_CALIBRATION_SIDE")
        if only and only != side:
            print(" Failed to exchange data between server and clients")
            sys.exit(1)
        print("Correlation coefficient r^2: 0.838754 < 0.9")
        print("Can't produce a report")
        sys.exit(1)
print(side, "ran")
sys.exit(0)
"""

CASES = [
    ("clean", None, None, 0),
    ("asan-server", "server", "==1==ERROR: AddressSanitizer: heap-use-after-free on address", 1),
    ("tsan-client", "client", "WARNING: ThreadSanitizer: data race (pid=1)", 1),
    ("ubsan-server", "server", "lib/cq.cpp:10:5: runtime error: load of misaligned address", 1),
    ("lsan-client", "client", "==1==ERROR: LeakSanitizer: detected memory leaks", 1),
]


def main():
    pair_py, dropin, preload, broker = sys.argv[1:5]
    check = Checker()
    with tempfile.TemporaryDirectory(prefix="shmverbs-pair-selftest-") as tmp:
        prog = os.path.join(tmp, "fake-pair")
        with open(prog, "w") as f:
            f.write(FAKE)
        os.chmod(prog, stat.S_IRWXU)

        def run_pair(env):
            return subprocess.run([sys.executable, pair_py, "real", dropin, preload, broker, prog],
                                  env=env, capture_output=True, text=True, timeout=60)

        def runs_counted(path):
            """How many runs the fake counted in `path` (one byte each)."""
            return len(open(path).read()) if os.path.exists(path) else 0

        def run_counted(name, env, want, counter, what, runs):
            """run_pair(env): exit `want`, and `runs` runs of the `what`
            (the client, the pair) counted in `counter`."""
            r = run_pair(env)
            check.check(f"{name}: exit {want}", r.returncode == want,
                        f"exit {r.returncode}\n{r.stdout}{r.stderr}")
            got = runs_counted(counter)
            check.check(f"{name}: the {what} ran {runs} time(s)", got == runs,
                        f"{got} runs\n{r.stdout}")
            return r
        for name, side, report, want in CASES:
            env = dict(os.environ)
            env.pop("FAKE_REPORT_SIDE", None)
            if side:
                env["FAKE_REPORT_SIDE"] = side
                env["FAKE_REPORT"] = report
            r = run_pair(env)
            check.check(f"{name}: exit {want}", r.returncode == want,
                        f"exit {r.returncode}\n{r.stdout}{r.stderr}")
            if side:
                check.check(f"{name}: the report is printed as the {side}'s",
                            f"--- sanitizer report ({side})\n{report}\n    #0 0x4242" in r.stdout,
                            r.stdout)
                check.check(f"{name}: the report ends at the blank line",
                            "--- sanitizer report" in r.stdout and
                            r.stdout.split("--- sanitizer report")[1].count("after the report") == 0,
                            r.stdout)
        # Retries: the client's attempts are counted in a file.
        for name, fail, want, attempts in [
                ("not listening yet", None, 0, 2),
                ("failed after connecting", "Failed to close connection between server and client",
                 1, 1)]:
            runs = os.path.join(tmp, name.replace(" ", "-"))
            env = dict(os.environ, FAKE_CLIENT_RUNS=runs)
            if fail:
                env["FAKE_CLIENT_FAIL"] = fail
            r = run_counted(name, env, want, runs, "client", attempts)
            if fail:
                check.check(f"{name}: its output is shown", fail in r.stdout, r.stdout)
            else:
                check.check(f"{name}: the first attempt's output is shown",
                            "--- client output (attempt 1, retried)\nCouldn't connect" in r.stdout,
                            r.stdout)
        # perftest's clock calibration failed: the pair runs again, 3 runs
        # at most; a failure of any other kind is final.
        for name, fails, extra, want, pair_runs in [
                ("calibration failed once", 1, {}, 0, 2),
                ("calibration failed every time", 9, {}, 1, 3),
                ("calibration failed on the client, the server lost it", 1,
                 {"FAKE_CALIBRATION_SIDE": "client"}, 0, 2),
                ("calibration failed beside a sanitizer report", 1,
                 {"FAKE_REPORT_SIDE": "client", "FAKE_REPORT": "runtime error: shift"}, 1, 1)]:
            calib = os.path.join(tmp, name.replace(" ", "-"))
            env = dict(os.environ, FAKE_CALIBRATION_RUNS=calib,
                       FAKE_CALIBRATION_FAILS=str(fails), **extra)
            if "FAKE_REPORT" not in extra:
                env.pop("FAKE_REPORT_SIDE", None)
            r = run_counted(name, env, want, calib, "pair", pair_runs)
            if pair_runs > 1:
                sides = 1 if "FAKE_CALIBRATION_SIDE" in extra else 2
                check.check(f"{name}: every run's output is shown",
                            r.stdout.count("Can't produce a report") >=
                            sides * min(fails, pair_runs), r.stdout)
    check.finish()


if __name__ == "__main__":
    main()
