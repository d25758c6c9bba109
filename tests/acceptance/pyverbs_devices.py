#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Debian's pyverbs lists the emulated device.

usage: pyverbs_devices.py <dropin|preload> <dir of the drop-ins> <libshmverbs.so>
Runs python3 -c 'import pyverbs.device as d; print(d.get_device_list())' in
the given mode and checks that it lists shm0 (and shm1 with two devices).
"""
import os
import sys

from shmv_acceptance import Checker, missing_verbs, mode_env, run, skip

PYVERBS = "/usr/lib/python3/dist-packages/pyverbs"
SNIPPET = ("import pyverbs.device as d; l = d.get_device_list(); print(l); "
           "print(' '.join(x.name.decode() for x in l))")


def main():
    mode, dropin_dir, preload = sys.argv[1:4]
    if not os.path.isdir(PYVERBS):
        skip("python3-pyverbs is not installed")
    if mode == "dropin":
        absent = missing_verbs(dropin_dir)
        if absent:
            # pyverbs loads Debian's librdmacm, which needs the object verbs.
            skip(f"{len(absent)} libibverbs names are not exported yet, e.g. "
                 + ", ".join(n for n, _, _ in absent[:5]))
    c = Checker()
    for count, want in ((None, ["shm0"]), (2, ["shm0", "shm1"])):
        extra = {} if count is None else {"SHMVERBS_DEVICES": str(count)}
        p = run(["/usr/bin/python3", "-c", SNIPPET], mode_env(mode, dropin_dir, preload, **extra))
        label = f"{mode} get_device_list" + (f" with {count} devices" if count else "")
        ok = c.check(f"{label}: exit 0", p.returncode == 0, p.stderr.strip()[-500:])
        if ok:
            lines = p.stdout.strip().splitlines()
            c.check(f"{label}: a list of Device objects", lines[0].startswith("[<pyverbs.device.Device"),
                    lines[0])
            c.check(f"{label}: names {want}", lines[-1].split() == want, lines[-1])
    c.finish()


if __name__ == "__main__":
    main()
