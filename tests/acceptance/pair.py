# SPDX-License-Identifier: MIT
"""Runs an unmodified client/server pair (ibv_*_pingpong, perftest) over the
emulated device: the server and the client as two processes that exchange
their QP information over TCP on 127.0.0.1, each bounded in time.

  pair.py MODE DROPIN_DIR PRELOAD_LIB BROKER PROGRAM [ARGS...]

The server runs `PROGRAM -p PORT ARGS`, the client the same plus 127.0.0.1.
Both must exit 0. Each pair gets its own broker runtime directory, so pairs
can run in parallel without seeing each other.
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
    port = str(free_port())
    server_cmd = [program, "-p", port] + args
    client_cmd = [program, "-p", port] + args + ["127.0.0.1"]
    print("server:", " ".join(server_cmd))
    print("client:", " ".join(client_cmd))
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    client = None
    deadline = time.monotonic() + TIMEOUT
    try:
        # The client fails at once if the server is not listening yet: retry.
        while True:
            time.sleep(0.2)
            client = subprocess.Popen(client_cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            try:
                client_out, _ = client.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print("FAIL: client timed out")
                print(stop(client))
                return 1
            if client.returncode == 0 or server.poll() is not None or \
                    "connect" not in client_out.lower() or time.monotonic() > deadline:
                break
        try:
            server_out, _ = server.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server_out = stop(server) + "\n(server timed out)"
        print("--- server output\n" + server_out)
        print("--- client output\n" + client_out)
        if server.returncode != 0 or client.returncode != 0:
            print(f"FAIL: server exit {server.returncode}, client exit {client.returncode}")
            return 1
        print("PASS")
        return 0
    finally:
        stop(server)
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
