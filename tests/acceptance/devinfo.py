#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Debian's unmodified ibv_devices and ibv_devinfo on the emulated devices,
in both modes. usage: devinfo.py <dir of the drop-ins> <libshmverbs.so>

The default device is what a ConnectX-5 shows: vendor 0x02c9, part 4119,
max_qp_wr 32768, one active InfiniBand port with a LID and a link-local GID.
SHMVERBS_LINK_LAYER=eth turns the port into RoCE (no LID, RoCE v1/v2 GIDs);
SHMVERBS_DEVICES sets the number of devices, 0 included.
"""
import re
import sys

from shmv_acceptance import Checker, mode_env, require_tools, run

DEVICES = "/usr/bin/ibv_devices"
DEVINFO = "/usr/bin/ibv_devinfo"


def field(out, name):
    """Value of a 'name: value' line of ibv_devinfo, or None."""
    m = re.search(rf"^\s*{re.escape(name)}:\s*(.*?)\s*$", out, re.M)
    return m.group(1) if m else None


def clean(c, label, proc, want_rc=0):
    """The program exited normally with the expected code and said nothing on stderr."""
    ok = c.check(f"{label}: exit code {want_rc}", proc.returncode == want_rc,
                 f"got {proc.returncode}; stderr: {proc.stderr.strip()[:300]}")
    c.check(f"{label}: nothing on stderr", proc.stderr == "", proc.stderr.strip()[:300])
    return ok


def check_ib(c, mode, env):
    label = f"{mode} ibv_devinfo -v (IB)"
    p = run([DEVINFO, "-v"], env)
    if not clean(c, label, p):
        return
    out = p.stdout
    expect = {
        "hca_id": "shm0",
        "transport": "InfiniBand (0)",
        "vendor_id": "0x02c9",
        "vendor_part_id": "4119",
        "max_qp_wr": "32768",
        "phys_port_cnt": "1",
        "state": "PORT_ACTIVE (4)",
        "link_layer": "InfiniBand",
        "phys_state": "LINK_UP (5)",
    }
    for name, want in expect.items():
        got = field(out, name)
        c.check(f"{label}: {name} = {want}", got == want, f"got {got!r}")
    lid = field(out, "port_lid")
    c.check(f"{label}: port_lid is a unicast LID", lid is not None and lid.isdigit()
            and 0 < int(lid) < 0xc000, f"got {lid!r}")
    c.check(f"{label}: fw_ver present", bool(field(out, "fw_ver")))
    c.check(f"{label}: node_guid formatted", re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}",
                                                       field(out, "node_guid") or "") is not None)
    gid = re.search(r"GID\[\s*0\]:\s*(\S+)", out)
    c.check(f"{label}: GID[0] is link-local from the port GUID",
            gid is not None and gid.group(1).startswith("fe80:0000:0000:0000:"),
            gid.group(1) if gid else "no GID line")
    c.check(f"{label}: extended attributes printed", "max_cqe" in out and
            "completion timestamp_mask" in out and "num_comp_vectors" in out)


def check_eth(c, mode, env):
    label = f"{mode} ibv_devinfo -v (RoCE)"
    p = run([DEVINFO, "-v"], env)
    if not clean(c, label, p):
        return
    out = p.stdout
    c.check(f"{label}: link_layer Ethernet", field(out, "link_layer") == "Ethernet",
            field(out, "link_layer"))
    c.check(f"{label}: no LID", field(out, "port_lid") == "0", field(out, "port_lid"))
    c.check(f"{label}: PORT_ACTIVE", field(out, "state") == "PORT_ACTIVE (4)")
    gids = re.findall(r"GID\[\s*(\d+)\]:\s*(.*?), (RoCE v[12])$", out, re.M)
    kinds = [k for _, _, k in gids]
    c.check(f"{label}: RoCE v1 and v2 GIDs", "RoCE v1" in kinds and "RoCE v2" in kinds,
            str(gids))
    c.check(f"{label}: an IPv4-mapped RoCE v2 GID",
            any(k == "RoCE v2" and re.fullmatch(r"::ffff:\d+\.\d+\.\d+\.\d+", g)
                for _, g, k in gids), str(gids))


def check_count(c, mode, env, count):
    label = f"{mode} SHMVERBS_DEVICES={count}"
    names = [f"shm{i}" for i in range(count)]
    p = run([DEVICES], env)
    if clean(c, f"{label} ibv_devices", p):
        listed = re.findall(r"^\s+(shm\d+)\s+([0-9a-f]{16})\s*$", p.stdout, re.M)
        c.check(f"{label} ibv_devices lists {names}", [n for n, _ in listed] == names,
                p.stdout)
        c.check(f"{label} ibv_devices: distinct GUIDs",
                len({g for _, g in listed}) == len(listed))
    p = run([DEVINFO], env)
    if count == 0:
        # ibv_devinfo's own answer to an empty device list.
        c.check(f"{label} ibv_devinfo: no crash, 'No IB devices found'",
                p.returncode == 255 and "No IB devices found" in p.stdout + p.stderr,
                f"rc={p.returncode} {p.stdout!r} {p.stderr!r}")
    elif clean(c, f"{label} ibv_devinfo", p):
        c.check(f"{label} ibv_devinfo shows every device",
                re.findall(r"^hca_id:\s*(\S+)", p.stdout, re.M) == names)


def check_select(c, mode, env):
    p = run([DEVINFO, "-d", "shm0", "-i", "1"], env)
    if clean(c, f"{mode} ibv_devinfo -d shm0 -i 1", p):
        c.check(f"{mode} ibv_devinfo -d shm0: port 1 shown", "port:\t1" in p.stdout)
    p = run([DEVINFO, "-d", "nosuchdev"], env)
    c.check(f"{mode} ibv_devinfo -d nosuchdev fails cleanly",
            p.returncode not in (0,) and p.returncode > 0, f"rc={p.returncode}")


def main():
    dropin_dir, preload = sys.argv[1], sys.argv[2]
    require_tools(DEVICES, DEVINFO)
    c = Checker()
    for mode in ("dropin", "preload"):
        env = mode_env(mode, dropin_dir, preload)
        p = run([DEVICES], env)
        if clean(c, f"{mode} ibv_devices", p):
            c.check(f"{mode} ibv_devices lists shm0",
                    re.search(r"^\s+shm0\s+[0-9a-f]{16}\s*$", p.stdout, re.M) is not None,
                    p.stdout)
        check_ib(c, mode, env)
        check_eth(c, mode, mode_env(mode, dropin_dir, preload, SHMVERBS_LINK_LAYER="eth"))
        for count in (2, 0):
            check_count(c, mode, mode_env(mode, dropin_dir, preload,
                                          SHMVERBS_DEVICES=str(count)), count)
        check_select(c, mode, env)
    c.finish()


if __name__ == "__main__":
    main()
