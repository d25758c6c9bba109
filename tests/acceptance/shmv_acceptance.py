# SPDX-License-Identifier: MIT
"""Helpers shared by the acceptance tests: where Debian's reference libraries
are, what a shared object exports or imports (name@version, read with
objdump -T), and how to run an unmodified program in each of the two modes:

  dropin   LD_LIBRARY_PATH=<dir with our libibverbs.so.1, libmlx5.so.1, ...>
  preload  LD_PRELOAD=<libshmverbs.so>, Debian's real libraries underneath
  real     Debian's libraries alone (a reference)
"""
import glob
import os
import shutil
import subprocess
import sys

SKIP = 77  # meson's exit code for a skipped test


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def reference_lib(soname):
    """Path of Debian's own library with that SONAME (from the ld.so cache)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split()[0] == soname and "x86-64" in parts[0]:
            return parts[1]
    fallback = os.path.join("/usr/lib/x86_64-linux-gnu", soname)
    return fallback if os.path.exists(fallback) else None


def _dynamic_symbols(path):
    """(defined, undefined): sets of (name, version, hidden) of a shared object."""
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True,
                         check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6 or "DF" not in fields and "DO" not in fields:
            continue
        name, version = fields[-1], fields[-2]
        hidden = version.startswith("(")
        version = version.strip("()")
        if version in ("Base", name):  # version definitions, unversioned
            continue
        entry = (name, version, hidden)
        if "*UND*" in fields:
            undefined.add(entry)
        elif fields[1].startswith("g") or " g " in line:
            defined.add(entry)
    return defined, undefined


def exports(path):
    return _dynamic_symbols(path)[0]


def imports(path):
    return _dynamic_symbols(path)[1]


def perftest_binaries():
    return sorted(p for p in glob.glob("/usr/bin/ib_*_*")
                  if os.access(p, os.X_OK) and not os.path.islink(p))


def pyverbs_modules():
    return sorted(glob.glob("/usr/lib/python3/dist-packages/pyverbs/**/*.so", recursive=True))


def missing(reference, ours):
    """Reference name@version entries (with their hidden flag) absent from ours."""
    return sorted(reference - ours)


def fmt(entry):
    name, version, hidden = entry
    return f"{name}@{version}" if hidden else f"{name}@@{version}"


def clean_env(**extra):
    """The environment of a program under test: none of the developer's
    shmverbs or loader settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SHMVERBS_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env["SHMVERBS_CONFIG"] = ""
    env.update(extra)
    return env


def sanitizer_runtimes(lib):
    """The sanitizer runtimes a sanitizer build of our library needs. An
    unmodified program does not link them, so they must be preloaded ahead of
    everything else (ASan refuses to start otherwise)."""
    out = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    found = []
    for runtime in ("libasan.so", "libtsan.so", "libubsan.so"):
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0].startswith(runtime) and len(parts) > 2:
                found.append(parts[2])
    return found


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


def mode_env(mode, dropin_dir, preload_lib, **extra):
    """Environment of an unmodified program in `mode`. In a sanitizer build
    the runtimes come first and leak checking is off: the leaks of Debian's
    programs are not ours to judge (our own are checked by the unit tests)."""
    preload = sanitizer_runtimes(os.path.join(dropin_dir, "libibverbs.so.1"))
    if preload:
        extra.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    if mode == "dropin":
        if preload:
            extra["LD_PRELOAD"] = ":".join(preload)
        return clean_env(LD_LIBRARY_PATH=dropin_dir, **extra)
    if mode == "preload":
        return clean_env(LD_PRELOAD=":".join(preload + [preload_lib]), **extra)
    if mode == "real":
        if preload:
            extra["LD_PRELOAD"] = ":".join(preload)
        return clean_env(**extra)
    raise ValueError(mode)


def run(argv, env, timeout=30):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def missing_verbs(dropin_dir):
    """Debian libibverbs names our drop-in does not export yet."""
    ref = reference_lib("libibverbs.so.1")
    ours = os.path.join(dropin_dir, "libibverbs.so.1")
    return missing(exports(ref), exports(ours))


def require_tools(*tools):
    for t in tools:
        if not shutil.which(t) and not os.path.exists(t):
            skip(f"{t} is not installed")


class Checker:
    """Collects named checks and ends with meson's exit code and a summary."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed.append(name)
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        return ok

    def finish(self):
        print(f"{self.passed} passed, {len(self.failed)} failed")
        sys.exit(1 if self.failed else 0)
