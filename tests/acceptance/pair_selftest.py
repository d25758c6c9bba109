# SPDX-License-Identifier: MIT
"""pair.py's own judgement: a pair whose programs exit 0 but print a
sanitizer report (server or client side, each runtime's marker) must fail
and show the report; a clean pair must pass. The programs are a stand-in
script, so this needs neither Debian's binaries nor a sanitizer build.

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
import os, sys
side = "client" if sys.argv[-1] == "127.0.0.1" else "server"
print(side, "ran")
if os.environ.get("FAKE_REPORT_SIDE") == side:
    print(os.environ["FAKE_REPORT"])
    print("    #0 0x4242 in somewhere lib/somewhere.cpp:1")
    print("")
    print("after the report")
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
        for name, side, report, want in CASES:
            env = dict(os.environ)
            env.pop("FAKE_REPORT_SIDE", None)
            if side:
                env["FAKE_REPORT_SIDE"] = side
                env["FAKE_REPORT"] = report
            r = subprocess.run([sys.executable, pair_py, "real", dropin, preload, broker, prog],
                               env=env, capture_output=True, text=True, timeout=60)
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
    check.finish()


if __name__ == "__main__":
    main()
