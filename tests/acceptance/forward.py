#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Runs forward_check (a program linked against Debian's libibverbs and
libmlx5) in one mode, with the same environment as the other acceptance
tests. usage: forward.py <real|preload|dropin> <forward-check> <dir of the
drop-ins> <libshmverbs.so>"""
import sys

from shmv_acceptance import mode_env, run


def main():
    mode, program, dropin_dir, preload = sys.argv[1:5]
    p = run([program, mode], mode_env(mode, dropin_dir, preload))
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
