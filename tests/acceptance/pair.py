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
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from shmv_acceptance import mode_env, skip

TIMEOUT = 60

# How each sanitizer runtime starts a report (ASan, TSan, UBSan, LSan).
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:", "ERROR: LeakSanitizer")


def sanitizer_reports(out):
    """The sanitizer reports in a program's output: from each line naming a
    marker to the next blank line or the end (a report's stack), or []."""
    lines = out.splitlines()
    reports = []
    i = 0
    while i < len(lines):
        if any(m in lines[i] for m in SANITIZER_MARKERS):
            j = i + 1
            while j < len(lines) and lines[j].strip() and \
                    not any(m in lines[j] for m in SANITIZER_MARKERS):
                j += 1
            reports.append("\n".join(lines[i:j]))
            i = j
        else:
            i += 1
    return reports


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
    port = str(free_port())
    server_cmd = [program, "-p", port] + args
    client_cmd = [program, "-p", port] + args + ["127.0.0.1"]
    print("server:", " ".join(server_cmd))
    print("client:", " ".join(client_cmd))
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, preexec_fn=pin)
    client = None
    client_attempts = []  # every client run's output: a failed attempt's report counts too
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
                print(f"FAIL: client timed out ({limit:g} s)")
                print(stop(client))
                return 1
            client_attempts.append(client_out)
            # Only a client that never reached the server tries again
            # (perftest and the pingpongs: "Couldn't connect to HOST:PORT").
            if client.returncode == 0 or server.poll() is not None or \
                    "couldn't connect to" not in client_out.lower() or \
                    time.monotonic() > deadline:
                break
        try:
            server_out, _ = server.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server_out = stop(server) + "\n(server timed out)"
        print("--- server output\n" + server_out)
        for i, out in enumerate(client_attempts[:-1]):
            print(f"--- client output (attempt {i + 1}, retried)\n" + out)
        print("--- client output\n" + client_out)
        reports = [("server", r) for r in sanitizer_reports(server_out)] + \
            [("client", r) for out in client_attempts for r in sanitizer_reports(out)]
        for side, report in reports:
            print(f"--- sanitizer report ({side})\n{report}")
        if server.returncode != 0 or client.returncode != 0:
            print(f"FAIL: server exit {server.returncode}, client exit {client.returncode}")
            return 1
        if reports:
            print(f"FAIL: {len(reports)} sanitizer report(s)")
            return 1
        print("PASS")
        return 0
    finally:
        stop(server)
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
