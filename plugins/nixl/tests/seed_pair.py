#!/usr/bin/python3
"""The seed's class, vLLM's NixlTransport (seed/nixl_transport.py: ../shared/seed's text with its
indentation restored, checked line by line against it when that file is there), run unchanged
over NIXL's Python API with backends=[NAME], two processes, by pair.py.

What is stubbed, and only that: the vLLM modules it imports. vllm.distributed.nixl_utils gives
NixlWrapper = nixl._api.nixl_agent and nixl_agent_config = nixl._api.nixl_agent_config (what
vLLM's module resolves them to); vllm.logger.init_logger is logging.getLogger; and
vllm.v1.kv_offload.tiering.p2p.data.base gives CancelMode, PollResult and DataTransport, whose
constructor keeps the view's base address, block count and block length (vLLM's does that, and
computes the fingerprint, which the class does not use). The parent packages are empty modules.

The default run: the target process holds two transports (b1, b2), the initiator one (a). The
initiator adds both as peers and b1 adds a; a writes every block of its region to b1 and to b2
in a random order, polling per peer (a poll of one peer must never return the other's ids); b1
writes into a's second half; a READs blocks of b1 back through the class's own agent and
prepared lists (the class has no read); then cancel "immediate" and "wait" of writes in flight,
remove_remote_peer (a write to the removed peer returns None), close. Every byte is checked.

--stop: a writes its whole region (64 MiB) to b1 and stops the target process (SIGSTOP) at once;
the class's poll is called until --wait seconds pass. The class reports a failed transfer only
by logging "check_xfer_state failed" (its ERR branch is unreachable: NIXL raises), so that log
is the failure. With --bound-ms B it must come within B ms (kvx's stall limit); without, what
happened is printed (NIXL's UCX backend stays in progress).

--bench: the seed's workload: a 256 MiB region in 4 KiB, 64 KiB and 1 MiB blocks, each transfer
every block once in a random order, write_blocks to the poll that returns it; prints the GB/s
(median of --repeat transfers) as a line "SEEDBENCH {json}".

  pair.py --net shm -- seed_pair.py --backend KVX [--stop [--bound-ms 4000] | --bench]
"""
import argparse
import importlib.util
import json
import logging
import os
import re
import signal
import statistics
import sys
import time
import types
import typing
from typing import NamedTuple

import numpy as np

from lineproto import protocol, recv, send  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_FILE = os.path.join(HERE, "seed", "nixl_transport.py")
SEED_TEXT = "000_9117e50321713665.txt"
TIMEOUT = 60.0


# ---- the stubs ----------------------------------------------------------------------------------

def stub_vllm():
    import ctypes
    import nixl._api

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class PollResult(NamedTuple):
        done: typing.Sequence[int]
        failed: typing.Sequence[int]

    class DataTransport:
        def __init__(self, view, config_fields=None):
            self._view = view
            self._base_addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
            self._num_blocks = view.shape[0]
            self._block_len = view.shape[1]

    for name in ("vllm", "vllm.distributed", "vllm.v1", "vllm.v1.kv_offload",
                 "vllm.v1.kv_offload.tiering", "vllm.v1.kv_offload.tiering.p2p",
                 "vllm.v1.kv_offload.tiering.p2p.data"):
        module(name)
    module("vllm.distributed.nixl_utils", NixlWrapper=nixl._api.nixl_agent,
           nixl_agent_config=nixl._api.nixl_agent_config)
    module("vllm.logger", init_logger=logging.getLogger)
    module("vllm.v1.kv_offload.tiering.p2p.data.base",
           CancelMode=typing.Literal["immediate", "wait"], PollResult=PollResult,
           DataTransport=DataTransport)


def check_unchanged():
    """The class file is the seed's text, indentation aside, line for line."""
    for d in (os.environ.get("KVX_SEED_DIR"), os.path.join(HERE, *[".."] * 4, "shared", "seed"),
              "/work/shared/seed"):
        path = os.path.join(d, SEED_TEXT) if d else None
        if path and os.path.exists(path):
            seed = [re.match(r"^\| \d+ \|(.*)\|$", l).group(1).strip()
                    for l in open(path).read().splitlines()]
            ours = [l.strip() for l in open(SEED_FILE).read().splitlines()]
            if seed != ours:
                raise SystemExit(f"{SEED_FILE} differs from {path} beyond indentation")
            return path
    return None


def load_class():
    stub_vllm()
    spec = importlib.util.spec_from_file_location("vllm_p2p_nixl_transport", SEED_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.NixlTransport


class Failures(logging.Handler):
    """The class's own report of a failed transfer: its 'check_xfer_state failed' warning."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []

    def emit(self, rec):
        msg = rec.getMessage()
        if "check_xfer_state failed" in msg:
            self.seen.append((time.monotonic(), msg))


# ---- regions and their patterns --------------------------------------------------------------

def region(nb, bl):
    return np.zeros((nb, bl), dtype=np.uint8)


def fill(arr, salt):
    arr[:] = np.random.default_rng(salt).integers(0, 256, arr.shape, dtype=np.uint8)


def perm(n, seed):
    return np.random.default_rng(seed).permutation(n).tolist()


def wait_ids(t, peer, ids, timeout=TIMEOUT):
    """Poll one peer until every id came out; returns (done, failed, ids of other peers seen)."""
    done, failed, end = set(), set(), time.monotonic() + timeout
    while ids - done - failed and time.monotonic() < end:
        r = t.poll(peer)
        done |= set(r.done)
        failed |= set(r.failed)
        time.sleep(0.0005)
    return done, failed, (done | failed) - ids


# ---- the default run ----------------------------------------------------------------------------

NB, BL = 256, 65536  # 16 MiB regions


def target(cls, backend, out):
    v1, v2 = region(NB, BL), region(NB, BL)
    t1 = cls("seed-target-b1", memoryview(v1), backends=[backend])
    t2 = cls("seed-target-b2", memoryview(v2), backends=[backend])
    assert t1.available and t2.available
    send(out, {"md1": t1.get_agent_metadata().hex(), "base1": t1._base_addr,
               "md2": t2.get_agent_metadata().hex(), "base2": t2._base_addr})
    a = recv()
    assert recv()["written"]
    # b1 adds a once a's writes are done: NIXL's UCX backend (UCX 1.19.1, tcp between two
    # namespaces) crashed in its progress thread (SIGSEGV in uct_tcp) in 3 runs of 6 when the
    # add, which connects to a, met a's writes arriving
    t1.add_remote_peer("a", bytes.fromhex(a["md"]), a["base"], 2 * NB, BL)
    src = region(NB, BL)
    fill(src, 1)
    exp1, exp2 = region(NB, BL), region(NB, BL)
    exp1[perm(NB, 11)] = src[perm(NB, 10)]
    exp2[perm(NB, 13)] = src[perm(NB, 12)]
    bad = [int(np.count_nonzero(v1 != exp1)), int(np.count_nonzero(v2 != exp2))]
    # b1 writes its blocks into a's second half
    fill(v1, 2)
    tid = t1.write_blocks("a", list(range(NB)), [NB + i for i in perm(NB, 14)])
    done, failed, _ = wait_ids(t1, "a", {tid})
    send(out, {"bad": bad, "b1_write": [len(done), len(failed)]})
    recv()  # a read b1 back, canceled, removed b2, closed
    t1.close()
    t2.close()
    return 0


def initiator(cls, backend, out):
    va = region(2 * NB, BL)
    fill(va[:NB], 1)
    a = cls("seed-initiator-a", memoryview(va), backends=[backend])
    assert a.available
    t = recv()
    a.add_remote_peer("b1", bytes.fromhex(t["md1"]), t["base1"], NB, BL)
    a.add_remote_peer("b2", bytes.fromhex(t["md2"]), t["base2"], NB, BL)
    send(out, {"md": a.get_agent_metadata().hex(), "base": a._base_addr})

    t0 = time.monotonic()
    w1 = a.write_blocks("b1", perm(NB, 10), perm(NB, 11))
    w2 = a.write_blocks("b2", perm(NB, 12), perm(NB, 13))
    d1, f1, other1 = wait_ids(a, "b1", {w1})
    d2, f2, other2 = wait_ids(a, "b2", {w2})
    t_write = time.monotonic() - t0
    send(out, {"written": True})
    rep = recv()
    b1_src = region(NB, BL)
    fill(b1_src, 2)
    exp = region(NB, BL)
    exp[perm(NB, 14)] = b1_src
    bad_a = int(np.count_nonzero(va[NB:] != exp))

    # READ back through the class's agent and prepared lists: b1's blocks into a's second half
    va[NB:] = 0
    ag = a._agent
    h = ag.make_prepped_xfer("READ", a._local_dlist, np.arange(NB, 2 * NB, dtype=np.int32),
                             a._remote_dlists["b1"], np.array(perm(NB, 15), dtype=np.int32))
    st, end = ag.transfer(h), time.monotonic() + TIMEOUT
    while st == "PROC" and time.monotonic() < end:
        st = ag.check_xfer_state(h)
    ag.release_xfer_handle(h)
    exp = b1_src[perm(NB, 15)]
    bad_read = int(np.count_nonzero(va[NB:] != exp))

    # cancel: immediate (the id never comes out of poll) and wait (what the class returns)
    c1 = a.write_blocks("b1", perm(NB, 16), perm(NB, 17))
    imm = a.cancel([c1], "immediate")
    c2 = a.write_blocks("b1", perm(NB, 18), perm(NB, 19))
    wait = a.cancel([c2], "wait")
    d, f, _ = wait_ids(a, "b1", set(wait), timeout=10)
    leaked = c1 in a._inflight or (c2 in a._inflight and c2 not in wait)
    extra = a.poll("b1")
    # remove b2: a write to it returns None
    a.remove_remote_peer("b2")
    after_remove = a.write_blocks("b2", [0], [0])
    a.close()
    send(out, {"bye": 1})

    ok = (d1 == {w1} and d2 == {w2} and not f1 and not f2 and not other1 and not other2 and
          rep["bad"] == [0, 0] and rep["b1_write"] == [1, 0] and bad_a == 0 and st == "DONE" and
          bad_read == 0 and imm == [] and not leaked and c1 not in list(extra.done) + list(extra.failed) and
          after_remove is None)
    print(f"seed_pair {backend} {os.environ.get('PAIR_NET', '?')}: writes to b1 and b2 "
          f"({2 * NB} blocks of {BL >> 10} KiB, random order) done {sorted(d1 | d2)} failed "
          f"{sorted(f1 | f2)} in {t_write * 1e3:.1f} ms, other peer's ids in a scoped poll "
          f"{sorted(other1 | other2)}; bytes wrong at b1, b2: {rep['bad']}; b1's write into a: "
          f"done/failed {rep['b1_write']}, bytes wrong {bad_a}; READ through the class's "
          f"agent {st}, bytes wrong {bad_read}; cancel immediate -> {imm}, wait -> {wait} "
          f"(then done {sorted(d)} failed {sorted(f)}); write after remove -> {after_remove}: "
          f"{'PASS' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok else 1


# ---- --stop -------------------------------------------------------------------------------------

SNB, SBL = 1024, 65536  # 64 MiB


def target_stop(cls, backend, out):
    v = region(SNB, SBL)
    t = cls("seed-target-b1", memoryview(v), backends=[backend])
    send(out, {"md": t.get_agent_metadata().hex(), "base": t._base_addr, "pid": os.getpid()})
    recv()  # bye, after SIGCONT
    t.close()
    return 0


def initiator_stop(cls, backend, out, wait_s, bound_ms):
    v = region(SNB, SBL)
    fill(v, 3)
    fails = Failures()
    logging.getLogger("vllm_p2p_nixl_transport").addHandler(fails)
    a = cls("seed-initiator-a", memoryview(v), backends=[backend])
    t = recv()
    a.add_remote_peer("b1", bytes.fromhex(t["md"]), t["base"], SNB, SBL)
    first = a.write_blocks("b1", [0], [0])
    d, f, _ = wait_ids(a, "b1", {first})
    if d != {first}:
        raise SystemExit(f"the first write did not complete: done {d} failed {f}")
    tid = a.write_blocks("b1", perm(SNB, 20), perm(SNB, 21))
    t0 = time.monotonic()
    os.kill(t["pid"], signal.SIGSTOP)
    done = failed = []
    while time.monotonic() - t0 < wait_s and not fails.seen and not done and not failed:
        r = a.poll("b1")
        done, failed = list(r.done), list(r.failed)
        time.sleep(0.001)
    ms = (time.monotonic() - t0) * 1e3
    outcome = ("done" if done else "failed (poll)" if failed else
               f"failed: {fails.seen[0][1]}" if fails.seen else "still in progress")
    if fails.seen:
        ms = (fails.seen[0][0] - t0) * 1e3
    still = tid in a._inflight
    os.kill(t["pid"], signal.SIGCONT)
    a.cancel([tid], "immediate")
    a.close()
    send(out, {"bye": 1})
    ok = bound_ms is None or (bool(fails.seen or failed) and ms <= bound_ms)
    print(f"seed_pair --stop {backend} {os.environ.get('PAIR_NET', '?')}: a 64 MiB write to a "
          f"peer stopped (SIGSTOP) right after it was posted: {outcome} after {ms:.0f} ms; the "
          f"class still holds it in _inflight: {still}: "
          f"{'shown' if bound_ms is None else 'PASS' if ok else 'FAIL'}"
          f"{'' if bound_ms is None else f' (bound {bound_ms} ms)'}", file=sys.stderr)
    return 0 if ok else 1


# ---- --bench ------------------------------------------------------------------------------------

BENCH_LEN = 256 << 20
BENCH_BLOCKS = [4096, 65536, 1 << 20]


def target_bench(cls, backend, out):
    for bl in BENCH_BLOCKS:
        v = region(BENCH_LEN // bl, bl)
        t = cls(f"seed-bench-b-{bl}", memoryview(v), backends=[backend])
        send(out, {"md": t.get_agent_metadata().hex(), "base": t._base_addr})
        recv()  # this block size is done
        t.close()
    return 0


def initiator_bench(cls, backend, out, repeat):
    rows = {}
    for bl in BENCH_BLOCKS:
        nb = BENCH_LEN // bl
        v = region(nb, bl)
        fill(v, 4)
        a = cls(f"seed-bench-a-{bl}", memoryview(v), backends=[backend])
        t = recv()
        a.add_remote_peer("b", bytes.fromhex(t["md"]), t["base"], nb, bl)
        gbps = []
        for r in range(repeat + 1):  # the first one warms up
            loc, rem = perm(nb, 100 + r), perm(nb, 200 + r)
            t0 = time.perf_counter()
            tid = a.write_blocks("b", loc, rem)
            d, f, _ = wait_ids(a, "b", {tid}, timeout=120)
            dt = time.perf_counter() - t0
            if d != {tid}:
                raise SystemExit(f"bench write {bl}: done {d} failed {f}")
            if r:
                gbps.append(BENCH_LEN / dt / 1e9)
        rows[bl] = gbps
        a.close()
        send(out, {"next": 1})
    print("SEEDBENCH " + json.dumps({"backend": backend, "net": os.environ.get("PAIR_NET"),
                                     "gbps": {str(k): v for k, v in rows.items()}}),
          file=sys.stderr)
    for bl, g in rows.items():
        print(f"seed bench {backend} {os.environ.get('PAIR_NET')}: {bl >> 10} KiB blocks, "
              f"{BENCH_LEN >> 20} MiB per transfer: {statistics.median(g):.2f} GB/s median "
              f"({min(g):.2f}-{max(g):.2f}, {len(g)} transfers)", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["initiator", "target"], required=True)
    ap.add_argument("--backend", default="UCX")
    ap.add_argument("--stop", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--wait", type=float, default=10.0)
    ap.add_argument("--bound-ms", type=int, default=None)
    a = ap.parse_args()
    seed = check_unchanged()
    out = protocol()
    cls = load_class()
    if a.role == "initiator" and not (a.stop or a.bench):
        print(f"seed_pair: the class of {seed or SEED_FILE} (unchanged), vLLM stubbed",
              file=sys.stderr)
    if a.bench:
        return (target_bench(cls, a.backend, out) if a.role == "target" else
                initiator_bench(cls, a.backend, out, a.repeat))
    if a.stop:
        return (target_stop(cls, a.backend, out) if a.role == "target" else
                initiator_stop(cls, a.backend, out, a.wait, a.bound_ms))
    return target(cls, a.backend, out) if a.role == "target" else initiator(cls, a.backend, out)


if __name__ == "__main__":
    sys.exit(main())
