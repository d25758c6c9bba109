#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every object type through Debian's unmodified pyverbs, on shm0.

usage: pyverbs_objects.py <dropin|preload> <dir of the drop-ins> <libshmverbs.so>

The script re-runs itself with Debian's /usr/bin/python3 in the requested mode (drop-in libraries on
LD_LIBRARY_PATH, or libshmverbs.so preloaded over Debian's libraries) and
then opens the device and creates, modifies and destroys a PD, an MR, a
completion channel and a CQ, an SRQ, RC and UD QPs (RESET->INIT->RTR->RTS),
an AH and an XRCD, checking what comes back. It works for either link layer
(SHMVERBS_LINK_LAYER=ib|eth): addressing uses a LID or a GRH accordingly.
"""
import os
import sys
import tempfile

CHILD_FLAG = "SHMV_PYVERBS_CHILD"


def parent():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from shmv_acceptance import mode_env, missing_verbs, run, skip
    mode, dropin_dir, preload = sys.argv[1:4]
    if not os.path.exists("/usr/lib/python3/dist-packages/pyverbs"):
        skip("python3-pyverbs is not installed")
    absent = missing_verbs(dropin_dir)
    if absent:
        # The object families live on other branches; exports.py lists them.
        skip(f"{len(absent)} libibverbs names are not exported yet, e.g. "
             + ", ".join(n for n, _, _ in absent[:5]))
    extra = {CHILD_FLAG: "1"}
    if "SHMVERBS_LINK_LAYER" in os.environ:
        extra["SHMVERBS_LINK_LAYER"] = os.environ["SHMVERBS_LINK_LAYER"]
    p = run(["/usr/bin/python3", os.path.abspath(__file__)],
            mode_env(mode, dropin_dir, preload, **extra), timeout=60)
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    sys.exit(p.returncode)


def child():
    import pyverbs.enums as e
    from pyverbs.addr import AH, AHAttr, GlobalRoute
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.device import Context, get_device_list
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
    from pyverbs.xrcd import XRCD, XRCDInitAttr

    passed, failed = 0, []

    def check(name, ok, detail=""):
        nonlocal passed
        if ok:
            passed += 1
            print(f"ok   {name}")
        else:
            failed.append(name)
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))

    def step(name, fn):
        """Runs one object's scenario; an exception is a failure, not a crash."""
        try:
            fn()
        except Exception as exc:  # pyverbs raises PyverbsRDMAError & co.
            check(f"{name}: created, used and destroyed", False, f"{type(exc).__name__}: {exc}")
        else:
            check(f"{name}: created, used and destroyed", True)

    names = [d.name.decode() for d in get_device_list()]
    check("get_device_list lists shm0", "shm0" in names, str(names))
    ctx = Context(name="shm0")
    dev_attr = ctx.query_device()
    check("query_device: vendor 0x02c9", dev_attr.vendor_id == 0x02c9, hex(dev_attr.vendor_id))
    port = ctx.query_port(1)
    check("query_port: active", port.state == e.IBV_PORT_ACTIVE, str(port.state))
    roce = port.link_layer == e.IBV_LINK_LAYER_ETHERNET
    # RoCE needs a GRH: use the RoCE v2 IPv4 GID when there is one, else 0.
    gid_index = 0
    if roce:
        for i in range(port.gid_tbl_len):
            if ctx.query_gid_type(1, i) == 1 and "ffff" in str(ctx.query_gid(1, i)):
                gid_index = i
                break

    def ah_attr():
        if roce:
            gr = GlobalRoute(dgid=ctx.query_gid(1, gid_index), sgid_index=gid_index)
            return AHAttr(port_num=1, is_global=1, gr=gr)
        return AHAttr(dlid=port.lid, port_num=1)

    def pd_case():
        first, second = PD(ctx), PD(ctx)
        check("PD: distinct handles", first.handle != second.handle,
              f"{first.handle} {second.handle}")
        first.close()
        second.close()

    def mr_case():
        pd = PD(ctx)
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        mr = MR(pd, 8192, access)
        check("MR: length kept", mr.length == 8192, str(mr.length))
        check("MR: lkey/rkey set", mr.lkey != 0 and mr.rkey != 0, f"{mr.lkey} {mr.rkey}")
        mr.write(b"shmverbs", 8)
        check("MR: buffer readable", mr.read(8, 0) == b"shmverbs")
        mr.close()
        pd.close()

    def cq_case():
        channel = CompChannel(ctx)
        cq = CQ(ctx, 100, None, channel, 0)
        check("CQ: at least the requested cqe", cq.cqe >= 100, str(cq.cqe))
        cq.req_notify()
        npolled, _ = cq.poll(4)
        check("CQ: empty poll", npolled == 0, str(npolled))
        cq.resize(300)
        check("CQ: resized", cq.cqe >= 300, str(cq.cqe))
        cq.close()
        channel.close()

    def srq_case():
        pd = PD(ctx)
        srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=64, max_sge=1)))
        attr = srq.query()
        check("SRQ: at least the requested max_wr", attr.max_wr >= 64, str(attr.max_wr))
        srq.modify(SrqAttr(srq_limit=10), e.IBV_SRQ_LIMIT)
        check("SRQ: limit armed", srq.query().srq_limit == 10)
        srq.close()
        pd.close()

    def qp_state(qp):
        return qp.query(e.IBV_QP_STATE)[0].qp_state

    def rc_case():
        pd = PD(ctx)
        cq = CQ(ctx, 64, None, None, 0)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        check("RC QP: created in RESET", qp_state(qp) == e.IBV_QPS_RESET)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        qp.to_init(attr)
        check("RC QP: RESET->INIT", qp_state(qp) == e.IBV_QPS_INIT)
        attr.dest_qp_num = qp.qp_num  # loopback onto itself
        attr.ah_attr = ah_attr()
        attr.path_mtu = e.IBV_MTU_1024
        attr.rq_psn = 0
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        qp.to_rtr(attr)
        check("RC QP: INIT->RTR", qp_state(qp) == e.IBV_QPS_RTR)
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.sq_psn = 0
        attr.max_rd_atomic = 1
        qp.to_rts(attr)
        check("RC QP: RTR->RTS", qp_state(qp) == e.IBV_QPS_RTS)
        ece = qp.query_ece()
        check("RC QP: ECE vendor is Mellanox", ece.vendor_id == 0x15b3, hex(ece.vendor_id))
        check("RC QP: data in order not promised",
              qp.query_data_in_order(e.IBV_WR_RDMA_WRITE) == 0)
        qp.close()
        cq.close()
        pd.close()

    def ud_case():
        pd = PD(ctx)
        cq = CQ(ctx, 64, None, None, 0)
        attr = QPAttr(port_num=1)
        attr.qkey = 0x11111111
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq), attr)
        check("UD QP: driven to RTS", qp_state(qp) == e.IBV_QPS_RTS)
        check("UD QP: qkey kept", qp.query(e.IBV_QP_QKEY)[0].qkey == 0x11111111)
        ah = AH(pd, attr=ah_attr())  # raises on failure
        ah.close()
        qp.close()
        cq.close()
        pd.close()

    def xrcd_case():
        with tempfile.TemporaryFile() as f:
            init = XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS,
                                os.O_CREAT, f.fileno())
            xrcd = XRCD(ctx, init)  # raises on failure
            # The same file opens the same domain again (O_CREAT, no O_EXCL).
            again = XRCD(ctx, init)
            again.close()
            xrcd.close()

    for name, case in (("PD", pd_case), ("MR", mr_case), ("CQ", cq_case), ("SRQ", srq_case),
                       ("RC QP", rc_case), ("UD QP and AH", ud_case), ("XRCD", xrcd_case)):
        step(name, case)
    ctx.close()
    print(f"{passed} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG):
        child()
    else:
        parent()
