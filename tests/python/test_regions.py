"""Regions and ranges from Python (kvx.regions, KvxTransport.register_region ... read_ranges),
against a target in another process, over shared memory and over tcp: every transfer checked
byte for byte against a model of the memory, several regions, odd offsets and lengths, the
list, dict and NumPy forms of ranges; refused input changing nothing; deregistering as a fence
that a peer's later write runs into (ENOENT, the memory untouched); wrong blobs refused.

Run: PYTHONPATH=python /usr/bin/python3 -m pytest tests/python/test_regions.py
"""

import errno
import mmap
import multiprocessing
import os
import random
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvx  # noqa: E402
import rndv_env  # noqa: E402

rndv_env.apply()
from region_peer import region_bytes, region_target_main  # noqa: E402

CTX = multiprocessing.get_context("spawn")
MAIN = 4 * 4096  # both sides' main region: 4 blocks of 4 KiB


class Target:
    """The region target in a child process (region_peer.py)."""

    def __init__(self, name, env=None, secret=None):
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=region_target_main, daemon=True,
                                args=(child, name, env, secret))
        self.proc.start()
        self.md, self.base, self.nb, self.bl, self.pid = self.recv(60)
        self.name = name

    def recv(self, timeout=30):
        if not self.conn.poll(timeout):
            raise TimeoutError("target did not answer")
        r = self.conn.recv()
        if isinstance(r, Exception):
            raise r
        return r

    def ask(self, *cmd):
        self.conn.send(cmd)
        return self.recv()

    def register(self, size, seed, kind="bytearray", access="rw"):
        return self.ask("register", size, seed, kind, access)

    def quit(self):
        if self.proc.is_alive():
            self.conn.send(("quit",))
            assert self.recv() == "bye"  # its mmaps closed: nothing held them any more
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Pair:
    """This process's transport, paired with a Target as peer "T"."""

    def __init__(self, kind):
        self.kind = kind
        env = {"UCX_TLS": "tcp"} if kind == "tcp" else {}
        old = os.environ.get("UCX_TLS")
        os.environ.update(env)
        try:
            self.tg = Target(f"regions-target-{kind}", env)
            self.main = bytearray(region_bytes(1, MAIN))
            self.t = kvx.KvxTransport(f"regions-init-{kind}",
                                      memoryview(self.main).cast("B", (4, 4096)))
        finally:
            if kind == "tcp":
                if old is None:
                    del os.environ["UCX_TLS"]
                else:
                    os.environ["UCX_TLS"] = old
        self.t.add_remote_peer("T", self.tg.md, self.tg.base, self.tg.nb, self.tg.bl)
        if kind == "tcp":
            assert self.t.peer_info("T")["transport"] == "tcp"

    def close(self):
        self.t.close()
        self.tg.quit()


@pytest.fixture(scope="module", params=["shm", "tcp"])
def pair(request):
    p = Pair(request.param)
    yield p
    p.close()


def finish(t, tid, timeout=20.0):
    """Poll until tid comes out: None when it succeeded, else its Failure. Nothing else may
    come out meanwhile."""
    end = time.time() + timeout
    while time.time() < end:
        r = t.poll("T")
        assert set(r.done) | set(r.failed) <= {tid}, (r, tid)
        if tid in r.done:
            return None
        if tid in r.failed:
            return t.failure(tid)
        t.wait("T", timeout=0.05)
    raise TimeoutError(f"transfer {tid} did not finish")


def disjoint(rng, size, n):
    """n disjoint [offset, offset + length) pieces of size bytes, odd places and lengths, in a
    random order."""
    cuts = sorted(rng.sample(range(1, size), 2 * n))
    segs = [(cuts[2 * i], cuts[2 * i + 1] - cuts[2 * i]) for i in range(n)]
    rng.shuffle(segs)
    return segs


def apply(model, local, ranges, write=True):
    """What ranges do: model[remote region] (write) or local[local region] (read), as bytearrays
    by id."""
    for lr, lo, rr, ro, ln in ranges:
        if write:
            model[rr][ro:ro + ln] = local[lr][lo:lo + ln]
        else:
            local[lr][lo:lo + ln] = model[rr][ro:ro + ln]


def as_form(ranges, form):
    """The same ranges in each form write_ranges takes."""
    if form == "list":
        return list(ranges)
    if form == "Range":
        return [kvx.Range(*r) for r in ranges]
    if form == "structured":
        a = np.zeros(len(ranges), dtype=kvx.range_dtype())
        for f, col in zip(kvx.RANGE_FIELDS, zip(*ranges)):
            a[f] = col
        return a
    if form == "columns":  # a NumPy structured array of other types and field order
        dt = np.dtype([("length", "<i8"), ("remote_offset", "<u8"), ("remote_region", "<i4"),
                       ("local_offset", "<i8"), ("local_region", "<u2")])
        a = np.zeros(len(ranges), dtype=dt)
        for f, col in zip(kvx.RANGE_FIELDS, zip(*ranges)):
            a[f] = col
        return a
    if form == "2d":
        return np.array(ranges, dtype=np.uint64)
    if form == "dict":
        return {f: list(col) for f, col in zip(kvx.RANGE_FIELDS, zip(*ranges))}
    if form == "dict-numpy":
        return {f: np.array(col) for f, col in zip(kvx.RANGE_FIELDS, zip(*ranges))}
    raise AssertionError(form)


FORMS = ("list", "Range", "structured", "columns", "2d", "dict", "dict-numpy")


# ---- data, byte for byte -------------------------------------------------------------------


def test_write_ranges_every_byte(pair):
    """Writes from three local regions (bytearray, NumPy, mmap) into three of the target's (the
    same kinds) and its main region, odd offsets and lengths, in every form of ranges; after
    each, every byte of every target region equals the model."""
    t, tg = pair.t, pair.tg
    rng = random.Random(7)
    sizes = {"bytearray": 1_048_576 + 13, "numpy": 333_333, "mmap": 4097}
    remote, handles = {}, {}
    for k, (kind, size) in enumerate(sizes.items()):
        rid, blob = tg.register(size, 100 + k, kind)
        h = t.load_region("T", blob)
        assert h >= 2 and t.load_region("T", blob) == h  # loaded twice: the same handle
        handles[h] = rid
        remote[h] = bytearray(region_bytes(100 + k, size))
    remote[kvx.REGION_MAIN] = bytearray(region_bytes(0, MAIN))
    handles[kvx.REGION_MAIN] = kvx.REGION_MAIN
    lbufs = [bytearray(region_bytes(200, 700_001)),
             np.frombuffer(region_bytes(201, 65_537), dtype=np.uint8).copy(),
             mmap.mmap(-1, 123_457)]
    lbufs[2][:] = region_bytes(202, 123_457)
    local = {kvx.REGION_MAIN: bytearray(pair.main)}
    lids = []
    for b in lbufs:
        rid = t.register_region(b)
        lids.append(rid)
        local[rid] = bytearray(bytes(b))
    local_ids = lids + [kvx.REGION_MAIN]
    try:
        for form in FORMS:
            ranges = []
            for h in remote:
                for ro, ln in disjoint(rng, len(remote[h]), 3):
                    lr = rng.choice(local_ids)
                    ln = min(ln, len(local[lr]))
                    lo = rng.randrange(0, len(local[lr]) - ln + 1)
                    ranges.append((lr, lo, h, ro, ln))
            rng.shuffle(ranges)
            tid = t.write_ranges("T", as_form(ranges, form))
            assert finish(t, tid) is None, form
            apply(remote, local, ranges)
            for h, rid in handles.items():
                assert tg.ask("bytes", rid) == bytes(remote[h]), (form, h)
    finally:
        for rid in lids:
            t.deregister_region(rid)
        lbufs[2].close()  # held until deregistered


def test_read_ranges_every_byte(pair):
    """Reads of odd pieces of two target regions and its main region into two local regions and
    the main one, in every form; every byte of the local regions equals the model, and the
    target's regions stay as they were."""
    t, tg = pair.t, pair.tg
    rng = random.Random(11)
    remote, handles = {}, {}
    for k, size in enumerate((500_009, 77_777)):
        rid, blob = tg.register(size, 300 + k, ("numpy", "mmap")[k], access="r")
        h = t.load_region("T", blob)
        handles[h] = rid
        remote[h] = bytearray(region_bytes(300 + k, size))
    remote[kvx.REGION_MAIN] = bytearray(tg.ask("bytes", kvx.REGION_MAIN))
    a = bytearray(region_bytes(400, 600_011))
    b = np.frombuffer(region_bytes(401, 99_991), dtype=np.uint8).copy()
    la, lb = t.register_region(a), t.register_region(b, access="w")
    try:
        for form in FORMS:
            local = {la: bytearray(a), lb: bytearray(b.tobytes())}
            ranges = []
            for lr in (la, lb):
                for lo, ln in disjoint(rng, len(local[lr]), 4):
                    h = rng.choice(list(remote))
                    ln = min(ln, len(remote[h]))
                    ro = rng.randrange(0, len(remote[h]) - ln + 1)
                    ranges.append((lr, lo, h, ro, ln))
            tid = t.read_ranges("T", as_form(ranges, form))
            assert finish(t, tid) is None, form
            apply(remote, local, ranges, write=False)
            assert bytes(a) == bytes(local[la]), form
            assert b.tobytes() == bytes(local[lb]), form
        for h, rid in handles.items():
            assert tg.ask("bytes", rid) == bytes(remote[h])
    finally:
        t.deregister_region(la)
        t.deregister_region(lb)


def test_notify_tag_priority_deadline(pair):
    """write_ranges takes write_blocks' keywords: the target's notice names the tag and the
    bytes; read_ranges has no notify (TypeError, as read_blocks)."""
    t, tg = pair.t, pair.tg
    rid, blob = tg.register(10_000, 500)
    h = t.load_region("T", blob)
    src = bytearray(region_bytes(501, 10_000))
    lr = t.register_region(src)
    try:
        tg.ask("notices")  # drained
        tid = t.write_ranges("T", [(lr, 1, h, 3, 999), (lr, 5000, h, 5001, 4999)], tag=77,
                             notify=True, priority="high", deadline_ms=10_000)
        assert finish(t, tid) is None
        notes = tg.ask("notices")
        assert [(n.tag, n.bytes) for n in notes] == [(77, 999 + 4999)]
        want = bytearray(region_bytes(500, 10_000))
        want[3:1002] = src[1:1000]
        want[5001:10_000] = src[5000:9999]
        assert tg.ask("bytes", rid) == bytes(want)
        tid = t.read_ranges("T", [(lr, 0, h, 0, 10)], priority=kvx.PRIO_LOW, deadline_ms=5000)
        assert finish(t, tid) is None and src[:10] == want[:10]
        with pytest.raises(TypeError):
            t.read_ranges("T", [(lr, 0, h, 0, 10)], notify=True)
    finally:
        t.deregister_region(lr)
        tg.ask("deregister", rid)


# ---- refusals ------------------------------------------------------------------------------


def test_bad_ranges_change_nothing(pair):
    """Every refused submission raises (ValueError naming the range and field before the call;
    KvxError with the core's errno after it) and changes nothing: no id comes out of poll, the
    target's bytes and counters stay."""
    t, tg = pair.t, pair.tg
    rid, blob = tg.register(4096, 600)
    h = t.load_region("T", blob)
    ro_rid, ro_blob = tg.register(4096, 601, access="r")
    ro_h = t.load_region("T", ro_blob)
    wo_rid, wo_blob = tg.register(4096, 602, access="w")
    wo_h = t.load_region("T", wo_blob)
    src = bytearray(8192)
    lr = t.register_region(src)
    before = tg.ask("counters")
    value_errors = [
        ([], "at least one range"),
        ([(lr, 0, h, 0, 0)], r"ranges\[0\].length"),
        ([(lr, 0, h, 0, 1), (lr, 8192, h, 0, 1)], r"ranges\[1\]: local_offset 8192"),
        ([(lr, 8000, h, 0, 193)], "beyond local region"),
        ([(99999, 0, h, 0, 1)], r"ranges\[0\].local_region: 99999 is no region"),
        ([(lr, 0, 0, 0, 1)], r"ranges\[0\].remote_region"),
        ([(lr, 0, h, 2**64 - 1, 2)], "past 2..64 - 1"),
        ([(lr, -1, h, 0, 1)], r"ranges\[0\].local_offset"),
        ([(lr, 0, h, 0)], "5 fields"),
        ([(lr, 0, 2**32, 0, 1)], r"remote_region: 1..4294967295"),
        (np.zeros((2, 4), dtype=np.uint64), r"shape \(n, 5\)"),
        (np.array([[lr, 0, h, 0, 1], [lr, 0, h, 0, 0]]), r"ranges\[1\].length"),
        (np.array([[lr, -5, h, 0, 1]]), r"ranges\[0\].local_offset"),
        ({"local_region": lr, "local_offset": [0, 1], "remote_region": h,
          "remote_offset": [0], "length": [1, 1]}, "different lengths"),
        ({"local_region": lr}, "missing"),
        (42, "a sequence"),
    ]
    for bad, why in value_errors:
        with pytest.raises(ValueError, match=why):
            t.write_ranges("T", bad)
    for kw, why in (({"deadline_ms": -1}, "deadline_ms"), ({"tag": 2**64}, "tag"),
                    ({"priority": "urgent"}, "priority"), ({"priority": 3}, "priority")):
        with pytest.raises(ValueError, match=why):
            t.write_ranges("T", [(lr, 0, h, 0, 1)], **kw)
    with pytest.raises(TypeError, match="integers"):
        t.write_ranges("T", np.array([[lr, 0.5, h, 0, 1]]))
    with pytest.raises(ValueError, match="peer_id"):
        t.write_ranges("", [(lr, 0, h, 0, 1)])
    core = [  # refused by the core at submission: nothing submitted
        ("write", "nobody", [(lr, 0, h, 0, 1)], errno.ENOENT),
        ("write", "T", [(lr, 0, 12345, 0, 1)], errno.ENOENT),  # no such handle
        ("write", "T", [(lr, 0, h, 4000, 97)], errno.EINVAL),  # beyond the remote region
        ("write", "T", [(lr, 0, ro_h, 0, 1)], errno.EACCES),  # read-only region
        ("read", "T", [(lr, 0, wo_h, 0, 1)], errno.EACCES),  # write-only region
    ]
    for op, peer, ranges, err in core:
        f = t.write_ranges if op == "write" else t.read_ranges
        with pytest.raises(kvx.KvxError) as e:
            f(peer, ranges)
        assert e.value.errno == err, (op, ranges, e.value)
    assert t.poll() == ((), ()) and t.poll("T") == ((), ())
    time.sleep(0.2)
    assert t.poll("T") == ((), ())
    assert tg.ask("counters") == before
    for r, seed in ((rid, 600), (ro_rid, 601), (wo_rid, 602)):
        assert tg.ask("bytes", r) == region_bytes(seed, 4096)
    assert src == bytearray(8192)
    t.deregister_region(lr)
    for r in (rid, ro_rid, wo_rid):
        tg.ask("deregister", r)


def test_deregister_fences_a_peers_writes(pair):
    """Once the target deregisters a region, the initiator's writes into it and reads of it
    fail with the core's ENOENT, the region's memory stays as it was, and the target counts
    them (drop_region); deregistering again is ENOENT; unloading the handle makes a later
    submission fail at once (ENOENT)."""
    t, tg = pair.t, pair.tg
    rid, blob = tg.register(65_536, 700, "mmap")
    h = t.load_region("T", blob)
    src = bytearray(region_bytes(701, 65_536))
    lr = t.register_region(src)
    try:
        tid = t.write_ranges("T", [(lr, 0, h, 0, 65_536)])
        assert finish(t, tid) is None
        assert tg.ask("bytes", rid) == bytes(src)
        assert tg.ask("deregister", rid) == 0
        drops = tg.ask("counters")["drop_region"]
        src[:] = region_bytes(702, 65_536)
        for ranges in ([(lr, 0, h, 0, 65_536)], [(lr, 1, h, 17, 3)]):
            tid = t.write_ranges("T", ranges)
            f = finish(t, tid)
            assert f is not None and f.status == -errno.ENOENT and f.name == "ENOENT", f
        tid = t.read_ranges("T", [(lr, 0, h, 0, 100)])
        f = finish(t, tid)
        assert f is not None and f.status == -errno.ENOENT, f
        assert src == bytearray(region_bytes(702, 65_536))  # nothing read into it
        assert tg.ask("bytes", rid) == region_bytes(701, 65_536)  # untouched since
        # counted per message: the 64 KiB write may be several
        assert tg.ask("counters")["drop_region"] >= drops + 3
        with pytest.raises(kvx.KvxError) as e:
            tg.ask("deregister", rid)
        assert e.value.errno == errno.ENOENT
        with pytest.raises(kvx.KvxError) as e:
            tg.ask("blob", rid)
        assert e.value.errno == errno.ENOENT
        t.unload_region("T", h)
        with pytest.raises(kvx.KvxError) as e:
            t.write_ranges("T", [(lr, 0, h, 0, 1)])
        assert e.value.errno == errno.ENOENT
        with pytest.raises(kvx.KvxError) as e:
            t.unload_region("T", h)
        assert e.value.errno == errno.ENOENT
    finally:
        t.deregister_region(lr)


def test_local_deregister_ends_own_transfers(pair):
    """Deregistering a local region returns only when nothing of it is in flight: a read into
    it that was still moving either finished or failed (ECANCELED), and the buffer is free
    (an mmap closes)."""
    t, tg = pair.t, pair.tg
    rid, blob = tg.register(4 << 20, 800)
    h = t.load_region("T", blob)
    m = mmap.mmap(-1, 4 << 20)
    lr = t.register_region(m)
    with pytest.raises(BufferError):
        m.close()
    tid = t.read_ranges("T", [(lr, 0, h, 0, 4 << 20)])
    t.deregister_region(lr)
    f = finish(t, tid)
    assert f is None or f.status == -errno.ECANCELED, f
    if f is None:
        assert m[:] == region_bytes(800, 4 << 20)
    m.close()  # the transport let go of it
    tg.ask("deregister", rid)


def test_wrong_blobs_refused(pair):
    """A truncated, corrupted or foreign blob, another agent's blob, the peer's main region's
    blob, a blob for an unknown peer: each refused with the core's errno, nothing loaded."""
    t, tg = pair.t, pair.tg
    rid, blob = tg.register(4096, 900)
    other = kvx.KvxTransport("regions-other", memoryview(bytearray(4096)).cast("B", (1, 4096)))
    try:
        obuf = bytearray(4096)
        oblob = other.region_blob(other.register_region(obuf))
        cases = [
            ("T", blob[:-1], errno.EBADMSG),
            ("T", blob + b"\0", errno.EBADMSG),
            ("T", bytes([blob[0] ^ 0xFF]) + blob[1:], errno.EBADMSG),
            ("T", b"KVXR" + b"\0" * 60, errno.EPROTONOSUPPORT),  # format 0
            ("T", oblob, errno.EINVAL),  # another agent's
            ("T", tg.ask("blob", kvx.REGION_MAIN), errno.EINVAL),  # its main region
            ("nobody", blob, errno.ENOENT),
        ]
        for k in range(len(blob)):  # any byte flipped: refused, whatever the byte holds
            bad = bytearray(blob)
            bad[k] ^= 0x40
            cases.append(("T", bytes(bad), None))
        for peer, b, err in cases:
            with pytest.raises(kvx.KvxError) as e:
                t.load_region(peer, b)
            if err is not None:
                assert e.value.errno == err, (peer, b, e.value)
            else:
                assert e.value.errno in (errno.EBADMSG, errno.EINVAL, errno.EPROTONOSUPPORT,
                                         errno.ESTALE, errno.EACCES), e.value
        for bad, why in ((b"", "1..256 bytes"), (b"x" * 257, "1..256 bytes"),
                         (None, "blob: bytes")):
            with pytest.raises(ValueError, match=why):
                t.load_region("T", bad)
        h = t.load_region("T", blob)  # the right one still loads
        src = bytearray(b"\x5a" * 4096)
        lr = t.register_region(src)
        tid = t.write_ranges("T", [(lr, 0, h, 0, 4096)])
        assert finish(t, tid) is None
        assert tg.ask("bytes", rid) == bytes(src)
        t.deregister_region(lr)
    finally:
        other.close()
        tg.ask("deregister", rid)


def test_secret_blobs():
    """With a secret, a blob is signed: a peer with the same secret loads it and writes; one
    without a secret cannot even pair (add_remote_peer), and a blob of a transport with another
    secret is refused."""
    tg = Target("regions-secret", secret=b"s3cret")
    t = kvx.KvxTransport("regions-secret-init", memoryview(bytearray(4096)).cast("B", (1, 4096)),
                         secret=b"s3cret")
    try:
        t.add_remote_peer("T", tg.md, tg.base, tg.nb, tg.bl)
        rid, blob = tg.register(1000, 950)
        h = t.load_region("T", blob)
        src = bytearray(region_bytes(951, 1000))
        lr = t.register_region(src)
        tid = t.write_ranges("T", [(lr, 0, h, 0, 1000)])
        assert finish(t, tid) is None
        assert tg.ask("bytes", rid) == bytes(src)
        # the same blob with its signature altered
        bad = bytearray(blob)
        bad[-1] ^= 1
        with pytest.raises(kvx.KvxError) as e:
            t.load_region("T", bytes(bad))
        assert e.value.errno in (errno.EACCES, errno.EBADMSG), e.value
    finally:
        t.close()
        tg.quit()


# ---- this process only ---------------------------------------------------------------------


@pytest.fixture
def lone():
    t = kvx.KvxTransport("regions-lone", memoryview(bytearray(MAIN)).cast("B", (4, 4096)))
    yield t
    t.close()


def test_register_errors_name_the_argument(lone):
    t = lone
    before = t.regions
    cases = [
        ((b"read-only",), {}, ValueError, "writable"),
        ((bytearray(0),), {}, ValueError, "at least one byte"),
        ((np.zeros((4, 4), order="F"),), {}, ValueError, "C-contiguous"),
        ((bytearray(10),), {"length": 11}, ValueError, "length: 1..10"),
        ((bytearray(10),), {"length": 0}, ValueError, "length: 1..10"),
        ((bytearray(10),), {"access": "x"}, ValueError, "access"),
        ((bytearray(10),), {"access": 4}, ValueError, "access"),
        ((bytearray(10),), {"access": 0}, ValueError, "access"),
        ((0x1000,), {}, ValueError, "length: required"),
        ((0,), {"length": 1}, ValueError, "address"),
        ((2**64 - 10,), {"length": 11}, ValueError, "wraps"),
        (("text",), {}, ValueError, "writable"),
        ((1.5,), {}, ValueError, "buf_or_addr"),
        ((bytearray(10),), {"length": 2.5}, TypeError, "length"),
    ]
    for args, kw, exc, why in cases:
        with pytest.raises(exc, match=why):
            t.register_region(*args, **kw)
    for bad in (0, -1, 2**32):
        with pytest.raises(ValueError, match="region"):
            t.deregister_region(bad)
        with pytest.raises(ValueError, match="region"):
            t.region_blob(bad)
    assert t.regions == before
    assert t.region_counters()["registrations"] == 0


def test_registered_buffers_are_held(lone):
    """While registered, a bytearray cannot be resized nor an mmap closed (the transport holds
    them); deregistering (or close()) lets go. An address and a length register memory the
    caller keeps; length registers a prefix."""
    t = lone
    ba, m = bytearray(100), mmap.mmap(-1, 8192)
    a, b = t.register_region(ba), t.register_region(m, length=4097, access="w")
    assert t.regions[a] == 100 and t.regions[b] == 4097
    with pytest.raises(BufferError):
        ba.append(1)
    with pytest.raises(BufferError):
        m.close()
    keep = np.zeros(1000, dtype=np.uint8)
    c = t.register_region(keep.ctypes.data, 1000, access=kvx.REGION_READ)
    c2 = t.register_region(memoryview(ba)[10:20])  # overlapping regions are fine
    counters = t.region_counters()
    assert counters["registered"] == 5 and counters["registrations"] == 4
    assert t.counters()["registered"] == 5
    assert len(t.region_blob(a)) <= 256 and t.region_blob(a) == t.region_blob(a)
    t.deregister_region(a)
    t.deregister_region(c2)
    ba.append(1)  # free again
    with pytest.raises(kvx.KvxError) as e:
        t.deregister_region(a)
    assert e.value.errno == errno.ENOENT and "deregistered already" in str(e.value)
    t.deregister_region(c)
    assert set(t.regions) == {kvx.REGION_MAIN, b}
    t.close()
    m.close()  # close() let go of the rest
    with pytest.raises(RuntimeError, match="closed"):
        t.register_region(bytearray(1))
    with pytest.raises(RuntimeError, match="closed"):
        t.write_ranges("T", [(1, 0, 1, 0, 1)])


def test_region_ids_are_not_reused(lone):
    t = lone
    seen = set()
    for _ in range(50):
        rid = t.register_region(bytearray(16))
        assert rid >= 2 and rid not in seen
        seen.add(rid)
        t.deregister_region(rid)


def test_region_api_has_docstrings():
    import inspect
    import kvx.regions
    missing = [n for n, v in vars(kvx.regions.RegionsMixin).items()
               if not n.startswith("_") and not inspect.getdoc(
                   v.fget if isinstance(v, property) else v)]
    missing += [n for n in ("Range", "range_dtype") if not inspect.getdoc(getattr(kvx, n))]
    assert missing == []
    assert set(kvx.regions.RegionsMixin.__dict__) & set(dir(kvx.KvxTransport)) >= {
        "register_region", "deregister_region", "region_blob", "load_region", "unload_region",
        "write_ranges", "read_ranges", "region_counters", "regions"}
    assert kvx.range_dtype().itemsize == 32
