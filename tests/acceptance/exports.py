#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Export comparison: usage exports.py <dir of the drop-ins> <libshmverbs.so>

  1. every public symbol@version of Debian's libibverbs.so.1 (180 names,
     including IBVERBS_PRIVATE_34 and the hidden IBVERBS_1.0 compat names) is
     exported, with the same version and default/hidden status, by our
     libibverbs.so.1 and by libshmverbs.so;
  2. every mlx5dv_*/efadv_* name@version that perftest (/usr/bin/ib_*) and
     python3-pyverbs import is exported by our libmlx5.so.1 / libefa.so.1 and
     by libshmverbs.so, and so is the rest of Debian's libmlx5/libefa;
  3. the drop-ins carry the SONAMEs the loader looks for.
Missing names are printed; the test fails while any is missing.
"""
import os
import subprocess
import sys

from shmv_acceptance import (Checker, exports, fmt, imports, missing, perftest_binaries,
                             pyverbs_modules, reference_lib, require_tools, skip)


def soname(path):
    out = subprocess.run(["objdump", "-p", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.split()[:1] == ["SONAME"]:
            return line.split()[1]
    return None


def report_missing(checker, what, entries):
    ok = checker.check(f"{what}: nothing missing", not entries, f"{len(entries)} missing")
    for e in entries:
        print(f"       missing {fmt(e) if len(e) == 3 else e[0] + '@' + e[1]}")
    return ok


def main():
    dropin_dir, preload = sys.argv[1], sys.argv[2]
    require_tools("objdump")
    c = Checker()

    ours = {name: os.path.join(dropin_dir, name)
            for name in ("libibverbs.so.1", "libmlx5.so.1", "libefa.so.1")}
    refs = {name: reference_lib(name) for name in ours}
    if not refs["libibverbs.so.1"]:
        skip("Debian's libibverbs1 is not installed")

    for name, path in ours.items():
        c.check(f"{name} has SONAME {name}", soname(path) == name, str(soname(path)))

    # 1. libibverbs, exactly (name, version, default or hidden).
    ref_verbs = exports(refs["libibverbs.so.1"])
    c.check("Debian's libibverbs.so.1 exports the expected 180 names", len(ref_verbs) == 180,
            str(len(ref_verbs)))
    preload_exports = exports(preload)
    report_missing(c, "libibverbs.so.1 vs Debian", missing(ref_verbs, exports(ours["libibverbs.so.1"])))
    report_missing(c, "libshmverbs.so vs Debian libibverbs", missing(ref_verbs, preload_exports))

    # 2. What perftest and pyverbs import from the vendor libraries.
    users = perftest_binaries() + pyverbs_modules()
    if not users:
        skip("neither perftest nor python3-pyverbs is installed")
    wanted = {}
    for user in users:
        for name, version, _ in imports(user):
            for prefix, lib in (("MLX5_", "libmlx5.so.1"), ("EFA_", "libefa.so.1")):
                if version.startswith(prefix):
                    wanted.setdefault(lib, set()).add((name, version))
    c.check("perftest/pyverbs import mlx5dv names", bool(wanted.get("libmlx5.so.1")))
    c.check("perftest/pyverbs import efadv names", bool(wanted.get("libefa.so.1")))
    plain = lambda entries: {(n, v) for n, v, _ in entries}
    for lib, names in sorted(wanted.items()):
        report_missing(c, f"{lib}: names perftest/pyverbs import",
                       sorted(names - plain(exports(ours[lib]))))
        report_missing(c, f"libshmverbs.so: {lib} names perftest/pyverbs import",
                       sorted(names - plain(preload_exports)))
        if refs[lib]:
            report_missing(c, f"{lib} vs Debian (all names)",
                           missing(exports(refs[lib]), exports(ours[lib])))
            report_missing(c, f"libshmverbs.so vs Debian {lib} (all names)",
                           missing(exports(refs[lib]), preload_exports))
    c.finish()


if __name__ == "__main__":
    main()
