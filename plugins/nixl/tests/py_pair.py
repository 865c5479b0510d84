#!/usr/bin/python3
"""NIXL's Python API, two processes, one backend (nixl_agent_config(backends=[NAME])), DRAM to
DRAM; run by pair.py (the two roles joined by pipes, over shared memory or tcp between two
network namespaces). The target registers four buffers (4 KiB, 64 KiB, 1 MiB, 3 MiB + 7) and
hands over its agent metadata and their descriptors; the initiator, whose agent name is 75
bytes long with a space in it (longer than a kvx name: the plugin maps it, and the target must
still see it), loads it, sends a standalone notification (send_notif), WRITEs its buffers and a
sub-range of one (5 descriptors) with a 64 KiB notification, and the target, once that
notification arrived, checks every byte; then the initiator READs everything back with a
notification the target must receive (a READ's goes to the side read from), checks every
byte, posts the same READ handle again into zeroed buffers and checks again.

  pair.py --net shm -- py_pair.py --backend KVX
"""
import argparse
import os
import sys
import time

import numpy as np

from lineproto import protocol, recv, send  # noqa: E402

import nixl

SIZES = [4096, 65536, 1 << 20, 3 * (1 << 20) + 7]
SUB = (100, 1000)  # bytes [100, 1100) of the second buffer, into the same place
INITIATOR = "initiator of the kvx NIXL test: a name longer than kvx's 63 bytes, and a space"
TARGET = "nixl-test-target"
W_NOTIF = b"write-done:" + bytes(range(256)) * 256  # 64 KiB + 11, every byte value
R_NOTIF = b"read-done:req-7:1"
HELLO = b"hello from the initiator"
TIMEOUT = 30.0


def pattern(i, n, salt=0):
    return np.random.default_rng(1000 * salt + i).integers(0, 256, n, dtype=np.uint8)


def agent(name, backend):
    a = nixl.nixl_agent(name, nixl.nixl_agent_config(backends=[backend]))
    if backend not in a.backends:
        raise SystemExit(f"backend {backend} not created (plugins: {a.get_plugin_list()})")
    return a


def notifs_until(a, pred, timeout):
    got, end = [], time.monotonic() + timeout
    while time.monotonic() < end and not pred(got):
        for peer, msgs in a.get_new_notifs().items():
            got += [(peer, m) for m in msgs]
        time.sleep(0.0005)
    return got


def target(backend, out):
    a = agent(TARGET, backend)
    bufs = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    reg = a.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in bufs], "DRAM")
    send(out, {"md": a.get_agent_metadata().hex(),
               "descs": [[b.ctypes.data, b.nbytes, 0] for b in bufs]})
    got = notifs_until(a, lambda g: any(m == W_NOTIF for _, m in g) and
                       any(m == HELLO for _, m in g), TIMEOUT)
    # the write's notification comes after its bytes: they must all be in place now
    bad = [i for i, b in enumerate(bufs) if not np.array_equal(b, pattern(i, b.nbytes))]
    send(out, {"senders": sorted({p for p, _ in got}),
               "hello": any(m == HELLO for _, m in got),
               "write_notif": any(m == W_NOTIF for _, m in got), "bad": bad})
    recv()  # the READ is done
    got = notifs_until(a, lambda g: any(m == R_NOTIF for _, m in g), TIMEOUT)
    send(out, {"read_notif": [p for p, m in got if m == R_NOTIF]})
    recv()  # bye
    a.deregister_memory(reg)
    return 0


def wait_xfer(a, h, what):
    end = time.monotonic() + TIMEOUT
    st = a.transfer(h)
    while st == "PROC" and time.monotonic() < end:
        st = a.check_xfer_state(h)
    if st != "DONE":
        raise SystemExit(f"{what}: {st}")


def initiator(backend, out):
    a = agent(INITIATOR, backend)
    src = [pattern(i, n) for i, n in enumerate(SIZES)]
    back = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    reg = a.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in src + back], "DRAM")
    hello = recv()
    peer = a.add_remote_agent(bytes.fromhex(hello["md"]))
    peer = peer.decode() if isinstance(peer, bytes) else peer
    assert peer == TARGET, peer
    remote = [tuple(d) for d in hello["descs"]]
    a.send_notif(peer, HELLO)

    off, ln = SUB
    local = [(b.ctypes.data, b.nbytes, 0) for b in src] + [(src[1].ctypes.data + off, ln, 0)]
    rem = remote + [(remote[1][0] + off, ln, 0)]
    t0 = time.monotonic()
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(rem, "DRAM"), peer, W_NOTIF)
    wait_xfer(a, h, "WRITE")
    t_write = time.monotonic() - t0
    a.release_xfer_handle(h)
    rep = recv()

    back_descs = a.get_xfer_descs([(b.ctypes.data, b.nbytes, 0) for b in back], "DRAM")
    h = a.initialize_xfer("READ", back_descs, a.get_xfer_descs(remote, "DRAM"), peer, R_NOTIF)
    wait_xfer(a, h, "READ")
    bad_read = [i for i, b in enumerate(back) if not np.array_equal(b, src[i])]
    for b in back:
        b[:] = 0
    wait_xfer(a, h, "READ posted again")  # a handle is posted again once done
    bad_reread = [i for i, b in enumerate(back) if not np.array_equal(b, src[i])]
    a.release_xfer_handle(h)
    send(out, {"read": "done"})
    rep.update(recv())
    send(out, {"bye": 1})
    a.remove_remote_agent(peer)
    a.deregister_memory(reg)

    ok = (rep["senders"] == [INITIATOR] and rep["hello"] and rep["write_notif"] and
          not rep["bad"] and not bad_read and not bad_reread and
          rep["read_notif"][:1] == [INITIATOR])
    print(f"py_pair {backend} {os.environ.get('PAIR_NET', '?')}: WRITE of {len(local)} "
          f"descriptors ({sum(SIZES) + ln} bytes) in {t_write * 1e3:.1f} ms; the target saw "
          f"senders {rep['senders']}, hello {rep['hello']}, the write's notification "
          f"{rep['write_notif']} ({len(W_NOTIF)} bytes), bad buffers {rep['bad']}; READ back: "
          f"bad {bad_read}, posted again: bad {bad_reread}; the READ's notification at the "
          f"target from {rep['read_notif']}: {'PASS' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["initiator", "target"], required=True)
    ap.add_argument("--backend", default="UCX")
    a = ap.parse_args()
    out = protocol()
    return target(a.backend, out) if a.role == "target" else initiator(a.backend, out)


if __name__ == "__main__":
    sys.exit(main())
