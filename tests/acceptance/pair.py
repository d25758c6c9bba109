# SPDX-License-Identifier: MIT
"""Runs an unmodified client/server pair (ibv_*_pingpong, perftest) over the
emulated device: the server and the client as two processes that exchange
their QP information over TCP on 127.0.0.1, each bounded in time.

  pair.py MODE DROPIN_DIR PRELOAD_LIB BROKER PROGRAM [ARGS...]

The server runs `PROGRAM -p PORT ARGS`, the client the same plus 127.0.0.1.
Both must exit 0, and neither may print a sanitizer report: UBSan's
"runtime error:" is recoverable and leaves the exit status alone, and TSan
only changes it at exit, so exit codes alone would let them pass. Each pair gets its own broker runtime directory, so pairs
can run in parallel without seeing each other.

With PAIR_ONE_CPU=1 both run on one CPU (the first this process may use),
as on a host with more busy pollers than cores; PAIR_TIME_LIMIT=S then
bounds the whole pair to S seconds instead of the usual limit.

A pair that failed only because perftest could not calibrate its clock
runs again (see CALIBRATION_FAILURE); every run's output is shown.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from shmv_acceptance import mode_env, sanitizer_reports, skip

TIMEOUT = 60

# perftest fits get_cycles() against gettimeofday() over 200 busy waits
# (about 0.2 s) before each report, and when a preempted wait spoils the fit
# it prints "Correlation coefficient r^2: ... < 0.9" and "Can't produce a
# report" and exits 1. With -a it does so once per message size on each
# side, and on a loaded 2-CPU machine one of those can fail. That says
# nothing of the emulation, so such a pair runs again, up to PAIR_RUNS times.
CALIBRATION_FAILURE = "Can't produce a report"
# The other side of such a run, when the one that gave up left before the
# final exchange of results: what perftest prints then.
PEER_LEFT = "Failed to exchange data between server and clients"
PAIR_RUNS = 3


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        out = ""
    return out


def main():
    mode, dropin, preload, broker, program, *args = sys.argv[1:]
    if not shutil.which(program):
        skip(f"{program} is not installed")
    runtime = tempfile.mkdtemp(prefix="shmverbs-pair-")
    os.chmod(runtime, 0o700)
    env = mode_env(mode, dropin, preload, SHMVERBS_RUNTIME_DIR=runtime,
                   SHMVERBS_BROKER=broker, SHMVERBS_BROKER_IDLE_TIMEOUT="1",
                   SHMVERBS_LINK_LAYER=os.environ.get("SHMVERBS_LINK_LAYER", "ib"))
    one_cpu = os.environ.get("PAIR_ONE_CPU") == "1"
    limit = float(os.environ.get("PAIR_TIME_LIMIT", TIMEOUT))
    pin = None
    if one_cpu:
        cpu = min(os.sched_getaffinity(0))
        print(f"server and client on CPU {cpu}, within {limit:g} s")

        def pin():
            os.sched_setaffinity(0, {cpu})
    try:
        return run_attempts(program, args, env, pin, limit)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def run_attempts(program, args, env, pin, limit):
    runs = []
    for attempt in range(1, PAIR_RUNS + 1):
        result = run_pair(program, args, env, pin, limit)
        runs.append(result)
        if not result.calibration_failed() or attempt == PAIR_RUNS:
            break
        print(f"perftest could not calibrate its clock (run {attempt}): running the pair again")
    for i, result in enumerate(runs, 1):
        if len(runs) > 1:
            print(f"=== run {i} of the pair")
        result.show()
    # A sanitizer report of any run fails the test, as does the last run.
    reports = [r for result in runs for r in result.reports()]
    last = runs[-1]
    if last.error:
        print(f"FAIL: {last.error}")
        return 1
    if last.server_rc != 0 or last.client_rc != 0:
        print(f"FAIL: server exit {last.server_rc}, client exit {last.client_rc}")
        return 1
    if reports:
        print(f"FAIL: {len(reports)} sanitizer report(s)")
        return 1
    print("PASS")
    return 0


class PairRun:
    """One run of the server and its client: exit codes and outputs."""

    def __init__(self):
        self.server_rc = self.client_rc = None
        self.server_out = ""
        self.client_outs = []  # every client attempt: a failed one's report counts too
        self.error = None  # a time-out

    def calibration_failed(self):
        """A side that failed gave up on perftest's clock calibration, and
        the other, if it failed, gave up on it too or only lost its peer."""
        failed = [out for rc, out in [(self.server_rc, self.server_out),
                                      (self.client_rc, self.client_outs[-1] if self.client_outs else "")]
                  if rc != 0]
        return not self.error and not self.reports() and \
            any(CALIBRATION_FAILURE in out for out in failed) and \
            all(CALIBRATION_FAILURE in out or PEER_LEFT in out for out in failed)

    def reports(self):
        return [("server", r) for r in sanitizer_reports(self.server_out)] + \
            [("client", r) for out in self.client_outs for r in sanitizer_reports(out)]

    def show(self):
        print("--- server output\n" + self.server_out)
        for i, out in enumerate(self.client_outs[:-1]):
            print(f"--- client output (attempt {i + 1}, retried)\n" + out)
        if self.client_outs:
            print("--- client output\n" + self.client_outs[-1])
        for side, report in self.reports():
            print(f"--- sanitizer report ({side})\n{report}")


def run_pair(program, args, env, pin, limit):
    result = PairRun()
    port = str(free_port())
    server_cmd = [program, "-p", port] + args
    client_cmd = [program, "-p", port] + args + ["127.0.0.1"]
    print("server:", " ".join(server_cmd))
    print("client:", " ".join(client_cmd))
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, preexec_fn=pin)
    deadline = time.monotonic() + limit
    try:
        # The client fails at once if the server is not listening yet: retry.
        while True:
            time.sleep(0.2)
            client = subprocess.Popen(client_cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, preexec_fn=pin)
            try:
                client_out, _ = client.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                result.error = f"client timed out ({limit:g} s)"
                result.client_outs.append(stop(client))
                result.server_out = stop(server)
                return result
            result.client_outs.append(client_out)
            result.client_rc = client.returncode
            # Only a client that never reached the server tries again
            # (perftest and the pingpongs: "Couldn't connect to HOST:PORT").
            if client.returncode == 0 or server.poll() is not None or \
                    "couldn't connect to" not in client_out.lower() or \
                    time.monotonic() > deadline:
                break
        try:
            result.server_out, _ = server.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            result.server_out = stop(server) + "\n(server timed out)"
        result.server_rc = server.returncode
        return result
    finally:
        stop(server)


if __name__ == "__main__":
    sys.exit(main())
