"""Regions and ranges: memory registered with kvx at any time, many per transport, and transfers
of lists of byte ranges between this transport's regions and a peer's (include/kvx.h, "Regions
and ranges"; docs/regions.md).

KvxTransport takes these methods from RegionsMixin:

    rid = t.register_region(buf)                   # any writable buffer, or (address, length)
    blob = t.region_blob(rid)                      # hand it to the peer, out of band
    h = peer.load_region("t", blob)                # the peer names the region by h
    tid = peer.write_ranges("t", [(1, 0, h, 100, 4096)])   # (local_region, local_offset,
                                                            #  remote_region, remote_offset, length)
    t.deregister_region(rid)                       # a fence: nothing lands in buf any more

Errors: what Python can check before the call (an argument's type, range, a range outside a
local region, ...) raises ValueError (TypeError for a value that is not an integer) naming the
argument and the rule, and changes nothing; what the core refuses raises KvxError, whose errno
is the core's (ENOENT, EACCES, EBADMSG, ...); RuntimeError("KvxTransport is closed") after
close(). Unlike write_blocks, whose None the serving engine's transport contract fixes,
write_ranges and read_ranges raise. docs/errors.md, "Regions and ranges", lists every case.

This module needs nothing beyond the standard library; NumPy arrays are taken when given (and
NumPy is then imported to read them).
"""

from __future__ import annotations

import ctypes
import errno
import operator
import threading
from typing import Any, NamedTuple, Optional

from . import _lib

#: What peers may do with a region (kvx.h enum kvx_region_access): their writes land in it ...
REGION_WRITE = _lib.REGION_WRITE
#: ... their reads are served from it.
REGION_READ = _lib.REGION_READ
#: The main region's id (the transport's view), and the handle of a peer's main region.
REGION_MAIN = _lib.REGION_MAIN

#: A range's fields, in the order of the 5-tuples write_ranges takes.
RANGE_FIELDS = ("local_region", "local_offset", "remote_region", "remote_offset", "length")

_ACCESS = {"rw": REGION_WRITE | REGION_READ, "wr": REGION_WRITE | REGION_READ,
           "w": REGION_WRITE, "r": REGION_READ}
_U32 = 2**32 - 1
_U64 = 2**64 - 1


class Range(NamedTuple):
    """One piece of a transfer: length bytes at local_offset of a region of this transport to
    (write) or from (read) remote_offset of a peer's region (a handle of load_region, or
    REGION_MAIN for its main region). A plain 5-tuple in this order is taken as well."""

    local_region: int
    local_offset: int
    remote_region: int
    remote_offset: int
    length: int


class _Region:
    """A registered region: its length, and what keeps its memory alive while kvx may touch it
    (the caller's buffer, through a ctypes array over it: the buffer cannot be resized or
    closed meanwhile; None for an address the caller gave)."""

    __slots__ = ("length", "hold", "addr")

    def __init__(self, length: int, hold: Any, addr: int) -> None:
        self.length = length
        self.hold = hold
        self.addr = addr


_dtype = None


def range_dtype():
    """The NumPy dtype laid out as kvx_range_t (local_region and remote_region uint32, then
    local_offset, remote_offset and length uint64; 32 bytes): a structured array of it goes to
    kvx with no conversion. Imports NumPy."""
    global _dtype
    if _dtype is None:
        import numpy as np
        _dtype = np.dtype({"names": ["local_region", "remote_region", "local_offset", "remote_offset",
                               "length"],
                     "formats": ["<u4", "<u4", "<u8", "<u8", "<u8"],
                           "offsets": [0, 4, 8, 16, 24], "itemsize": 32})
    return _dtype


def _int(name: str, value, lo: int, hi: int) -> int:
    """value as an int in lo..hi, or ValueError (TypeError for a non-integer) naming it."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: an integer, got {type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name}: {lo}..{hi}, got {v}")
    return v


def _access_arg(what: str, access) -> int:
    if isinstance(access, str):
        bits = _ACCESS.get(access)
        if bits is None:
            raise ValueError(f"{what}: access: 'rw', 'r' or 'w' (or kvx.REGION_READ | "
                             f"kvx.REGION_WRITE), got {access!r}")
        return bits
    bits = _int(f"{what}: access", access, 1, REGION_WRITE | REGION_READ)
    return bits


def _peer_arg(what: str, peer_id) -> bytes:
    b = str(peer_id).encode()
    if not 1 <= len(b) <= _lib.PEER_ID_MAX or b"\0" in b:
        raise ValueError(f"{what}: peer_id: 1..{_lib.PEER_ID_MAX} bytes without NUL, got "
                         f"{peer_id!r}")
    return b


def _xfer_params(what: str, deadline_ms, tag, notify, priority):
    """kvx_xfer_params_t for the keywords, or None when none is set; ValueError naming one that
    kvx would refuse."""
    if deadline_ms is None and tag is None and not notify and priority is None:
        return None
    xp = _lib.XferParams()
    if priority is not None:
        level = _lib.PRIO_NAMES.get(priority) if isinstance(priority, str) else None
        if level is None:
            if isinstance(priority, str):
                raise ValueError(f"{what}: priority: 'low', 'normal', 'high' or "
                                 f"kvx.PRIO_LOW..PRIO_HIGH, got {priority!r}")
            level = _int(f"{what}: priority", priority, _lib.PRIO_LOW, _lib.PRIO_HIGH)
        xp.field_mask |= _lib.XFER_PARAM_PRIORITY
        xp.priority = level
    if deadline_ms is not None:
        xp.field_mask |= _lib.XFER_PARAM_DEADLINE
        xp.deadline_ms = _int(f"{what}: deadline_ms", deadline_ms, 0, _lib.MS_MAX)
    if tag is not None:
        xp.field_mask |= _lib.XFER_PARAM_TAG
        xp.tag = _int(f"{what}: tag", tag, 0, _U64)
    if notify:
        xp.field_mask |= _lib.XFER_PARAM_FLAGS
        xp.flags = _lib.XFER_NOTIFY
    return xp


def _is_numpy(x) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and type(x).__module__.startswith("numpy")


class RegionsMixin:
    """The region methods of KvxTransport (see the module's docstring). They use the
    transport's _h(), _check(), _lib and thread-local buffers; _regions_init() is called by its
    constructor and _regions_forget() by its close()."""

    # ---- bookkeeping -----------------------------------------------------------------------

    def _regions_init(self, main_len: int) -> None:
        self._regions_lock = threading.Lock()
        # id -> _Region: the regions this transport registered (the main region as id 1)
        self._regions: dict = {REGION_MAIN: _Region(main_len, None, 0)} if main_len else {}

    def _regions_forget(self) -> None:
        """close(): kvx_transport_close deregistered every region: release the buffers."""
        with self._regions_lock:
            self._regions.clear()

    def _region_fn(self, name: str):
        f = getattr(self._lib, name, None)
        if f is None or f.argtypes is None:
            raise RuntimeError(f"this libkvx has no {name} (regions need a newer libkvx)")
        return f

    @property
    def regions(self) -> dict:
        """The regions this transport registered and has not deregistered, id -> length in bytes
        (the main region, id REGION_MAIN, included). A snapshot."""
        with self._regions_lock:
            return {rid: r.length for rid, r in self._regions.items()}

    # ---- register, deregister, the blob ----------------------------------------------------

    def register_region(self, buf_or_addr, length: Optional[int] = None, access="rw") -> int:
        """Register memory as a region peers may address (kvx_region_register): any number, at
        any time, overlapping allowed. Returns its id (>= 2, never reused in this transport's
        life), which names it in ranges and region_blob.

        buf_or_addr: a writable, C-contiguous buffer (bytearray, memoryview, mmap, NumPy array,
        ...) of at least one byte, of which length bytes (default: all of it) are registered;
        the transport holds the buffer until deregister_region or close() returns, so it cannot
        be freed under kvx meanwhile (a bytearray cannot be resized, an mmap not closed:
        BufferError). Or an integer address, with length required: the caller keeps that memory
        valid until deregister_region or close() returns.
        access: "rw" (the default), "w" (peers' writes only) or "r" (peers' reads only), or
        kvx.REGION_WRITE | kvx.REGION_READ.

        ValueError naming the argument (an empty or read-only or non-contiguous buffer, a length
        of 0 or beyond the buffer, an address range that wraps, a bad access); KvxError for
        the core's refusals (ENOSPC: KVX_REGIONS_MAX regions; ENOMEM)."""
        h = self._h()
        what = "register_region"
        bits = _access_arg(what, access)
        if isinstance(buf_or_addr, int) and not isinstance(buf_or_addr, bool):
            addr = _int(f"{what}: address", buf_or_addr, 1, _U64)
            if length is None:
                raise ValueError(f"{what}: length: required with an address")
            n = _int(f"{what}: length", length, 1, _U64)
            if addr + n - 1 > _U64:
                raise ValueError(f"{what}: address {addr:#x} + length {n} wraps the address space")
            hold = None
        else:
            try:
                mv = memoryview(buf_or_addr)
            except TypeError:
                raise ValueError(f"{what}: buf_or_addr: a writable buffer or an integer "
                                 f"address, got {type(buf_or_addr).__name__}") from None
            if mv.readonly:
                raise ValueError(f"{what}: buf_or_addr: a writable buffer (kvx writes peers' "
                                 f"bytes into it), got a read-only "
                                 f"{type(buf_or_addr).__name__}")
            if not mv.c_contiguous:
                raise ValueError(f"{what}: buf_or_addr: a C-contiguous buffer, got a "
                                 f"non-contiguous {type(buf_or_addr).__name__}")
            if mv.nbytes == 0:
                raise ValueError(f"{what}: buf_or_addr: at least one byte, got an empty buffer")
            n = mv.nbytes if length is None else _int(f"{what}: length", length, 1, mv.nbytes)
            hold = (ctypes.c_char * mv.nbytes).from_buffer(mv)  # pins the buffer
            addr = ctypes.addressof(hold)
        p = _lib.RegionParams(_lib.REGION_PARAM_ACCESS, bits)
        rid = ctypes.c_uint32()
        rc = self._region_fn("kvx_region_register")(h, addr, n, ctypes.byref(p),
                                                    ctypes.byref(rid))
        self._check(what, rc)
        with self._regions_lock:
            self._regions[rid.value] = _Region(n, hold, addr)
        return rid.value

    def deregister_region(self, region: int) -> None:
        """Deregister a region (kvx_region_deregister): a fence. When it returns, no byte of any
        peer lands in the region and none is read out of it any more, whatever was in flight,
        and this transport's own transfers that named it as their local region have ended
        (those it ended fail with ECANCELED in poll/failure()); the transport lets go of the
        buffer, which may be freed or reused at once. Peers' later transfers naming it fail
        (ENOENT). It may wait, for at most about 1.2 s, for what UCX still holds of the region;
        connections still holding it then are closed (their other transfers fail).

        ValueError for a region that is not an integer 1..2**32-1; KvxError ENOENT (unknown or
        already deregistered), EBUSY (the main region of an owned transport), ETIMEDOUT (UCX
        still held it: the region stays registered and its buffer held, call again)."""
        h = self._h()
        rid = _int("deregister_region: region", region, 1, _U32)
        rc = self._region_fn("kvx_region_deregister")(h, rid)
        _region_check(self, f"deregister_region({rid})", rc, {
            errno.ENOENT: "no such region (unknown, or deregistered already)",
            errno.EBUSY: "the main region of an owned transport stays: peers on this host "
                         "copy into it directly",
            errno.ETIMEDOUT: "UCX still holds the region: it stays registered and its buffer "
                             "held; call again"})
        with self._regions_lock:
            self._regions.pop(rid, None)

    def region_blob(self, region: int) -> bytes:
        """The region's blob (kvx_region_blob, at most 256 bytes): what a peer passes to
        load_region to address it. It holds this transport's agent name and generation, the
        region's id, address, length, access and capability (signed with the secret, if one is
        set): whoever holds it and the metadata may write and read the region as its access
        allows. Stable for the region's life. ValueError for a bad region; KvxError ENOENT for
        one unknown or deregistered."""
        h = self._h()
        rid = _int("region_blob: region", region, 1, _U32)
        f = self._region_fn("kvx_region_blob")
        buf = ctypes.create_string_buffer(_lib.REGION_BLOB_MAX)
        n = ctypes.c_size_t(len(buf))
        rc = f(h, rid, buf, ctypes.byref(n))
        if rc == -errno.ENOSPC:  # a core whose blobs grew: ask again with its size
            buf = ctypes.create_string_buffer(n.value)
            rc = f(h, rid, buf, ctypes.byref(n))
        _region_check(self, f"region_blob({rid})", rc, {
            errno.ENOENT: "no such region (unknown, or deregistered)"})
        return buf.raw[:n.value]

    # ---- a peer's regions ------------------------------------------------------------------

    def load_region(self, peer_id: str, blob) -> int:
        """Load a peer's region blob (kvx_region_load) for peer_id, a peer already added:
        returns the handle that names that region in ranges to that peer, until unload_region
        or the peer's removal. The same blob loaded twice gives the same handle. Nothing goes
        over the network. ValueError for a bad peer_id or an empty blob (or one over 256
        bytes); KvxError for the core's refusals: ENOENT (unknown peer), EBADMSG (not a region
        blob, or corrupted), EPROTONOSUPPORT (a blob format this kvx does not know), EINVAL (the
        blob is of another agent than the peer's, or names its main region: that is
        REGION_MAIN already), ESTALE (of the peer's earlier process), EACCES (a secret
        mismatch), ENOSPC."""
        h = self._h()
        pid = _peer_arg("load_region", peer_id)
        try:
            b = bytes(blob)
        except TypeError:
            raise ValueError(f"load_region: blob: bytes, got {type(blob).__name__}") from None
        if not 1 <= len(b) <= _lib.REGION_BLOB_MAX:
            raise ValueError(f"load_region: blob: 1..{_lib.REGION_BLOB_MAX} bytes, got {len(b)}")
        handle = ctypes.c_uint32()
        rc = self._region_fn("kvx_region_load")(h, pid, b, len(b), ctypes.byref(handle))
        _region_check(self, f"load_region({peer_id!r})", rc, _LOAD_TEXTS)
        return handle.value

    def unload_region(self, peer_id: str, handle: int) -> None:
        """Forget a handle of load_region (kvx_region_unload); transfers in flight naming it go
        on. ValueError for a bad peer_id or handle; KvxError ENOENT for an unknown peer or
        handle (REGION_MAIN cannot be unloaded)."""
        h = self._h()
        pid = _peer_arg("unload_region", peer_id)
        hd = _int("unload_region: handle", handle, 1, _U32)
        _region_check(self, f"unload_region({peer_id!r}, {hd})",
                      self._region_fn("kvx_region_unload")(h, pid, hd),
                      {errno.ENOENT: "unknown peer, or no such handle loaded for it "
                                     "(REGION_MAIN cannot be unloaded)"})

    # ---- transfers -------------------------------------------------------------------------

    def write_ranges(self, peer_id: str, ranges, deadline_ms: Optional[int] = None,
                     tag: Optional[int] = None, notify: bool = False, priority=None) -> int:
        """Write ranges to a peer as one transfer (kvx_xfer_write_ranges): each range's length
        bytes at local_offset of a region of this transport to remote_offset of the peer's
        region (a handle of load_region, or REGION_MAIN). Returns the transfer id, which poll()
        reports once, as for write_blocks; deadline_ms, tag, notify and priority are
        write_blocks'. Any offsets and lengths; ranges consecutive on both sides are coalesced.

        ranges, any of:
          - a sequence of 5-tuples (local_region, local_offset, remote_region, remote_offset,
            length), or of Range;
          - a NumPy structured array with those field names (range_dtype() is kvx_range_t's
            layout, taken with no conversion), or a 2-D integer array of shape (n, 5) in the
            5-tuple's column order;
          - a dict of the five columns by name, each a sequence or NumPy array, or one integer
            for every range (e.g. {"local_region": rid, "local_offset": offs, ...}).
        The memory of the ranges need only stay valid until the transfer completes; ranges
        themselves only during the call.

        ValueError naming the range and field, with nothing submitted: an empty list, a length
        of 0, a local region this transport has not registered (or deregistered), a range
        beyond its local region, an offset + length past 2**64 - 1, a field out of 32 or 64
        bits, a bad keyword. KvxError for the core's refusals: ENOENT (unknown peer or remote
        handle), EACCES (the remote region does not grant writes), EINVAL (a range beyond its
        remote region), ESTALE, ENOTCONN (the peer's connection failed), ENOSPC, EOPNOTSUPP.
        A run the receiver refuses fails the transfer (failure(id): ENOENT when the region was
        deregistered, EACCES, EINVAL)."""
        return self._ranges_submit(True, "write_ranges", peer_id, ranges, deadline_ms, tag,
                                   notify, priority)

    def read_ranges(self, peer_id: str, ranges, deadline_ms: Optional[int] = None,
                    priority=None) -> int:
        """Read ranges from a peer as one transfer (kvx_xfer_read_ranges): each range's length
        bytes at remote_offset of the peer's region land at local_offset of this transport's
        region. As write_ranges otherwise (EACCES: the remote region does not grant reads;
        no notify: notices are for writes)."""
        return self._ranges_submit(False, "read_ranges", peer_id, ranges, deadline_ms, None,
                                   False, priority)

    def _ranges_submit(self, write: bool, what: str, peer_id, ranges, deadline_ms, tag, notify,
                       priority) -> int:
        h = self._h()
        pid = _peer_arg(what, peer_id)
        xp = _xfer_params(what, deadline_ms, tag, notify, priority)
        with self._regions_lock:
            known = {rid: r.length for rid, r in self._regions.items()}
        arr, n, keep = _ranges_arg(what, ranges, known)
        fn = self._region_fn("kvx_xfer_write_ranges" if write else "kvx_xfer_read_ranges")
        try:
            idp = self._tls.id
        except AttributeError:
            idp = self._buffers()[0]
        rc = fn(h, pid, arr, n, None if xp is None else ctypes.byref(xp), ctypes.byref(idp))
        del keep
        _region_check(self, f"{what}({peer_id!r})", rc, _XFER_TEXTS)
        return idp.value

    def region_counters(self) -> dict:
        """This transport's regions and what kvx refused peers' messages naming them
        (kvx_region_counters_t): registered (now, the main region included), registrations
        (life long), drop_region (a region unknown or deregistered), drop_region_capability,
        drop_access, dereg_closed. counters() holds them too."""
        h = self._h()
        a = _lib.TransportAttr()
        a.field_mask = _lib.TRANSPORT_ATTR_REGIONS
        self._check("region_counters", self._lib.kvx_transport_query(h, ctypes.byref(a)))
        return {name: getattr(a.regions, name) for name in _lib.REGION_COUNTERS}


def _lib_error(msg: str, rc: int, text: Optional[str] = None):
    from .transport import KvxError
    return KvxError(msg, rc, text)


def _region_check(t, what: str, rc: int, texts: dict) -> int:
    """rc, or the exception for a failed region call: KvxError with this call's meaning of the
    errno (texts), RuntimeError("KvxTransport is closed") for ESHUTDOWN."""
    if rc >= 0 or rc == -errno.ESHUTDOWN or -rc not in texts:
        return t._check(what, rc)
    raise _lib_error(what, rc, texts[-rc])


_LOAD_TEXTS = {
    errno.ENOENT: "unknown peer (add it first)",
    errno.EBADMSG: "not a region blob (truncated, corrupted or foreign)",
    errno.EPROTONOSUPPORT: "a region blob format this kvx does not know",
    errno.EINVAL: "the blob is of another agent than the peer's, or names its main region "
                  "(that is REGION_MAIN already)",
    errno.ESTALE: "the blob is of the peer's earlier process: load its new blob",
    errno.EACCES: "the blob's signature does not match this transport's secret",
    errno.ENOSPC: "KVX_REGIONS_MAX handles loaded for the peer",
}
_XFER_TEXTS = {
    # every local rule was checked before the call
    errno.EINVAL: "a range beyond its remote region (the local side was checked)",
    errno.ENOENT: "unknown peer, or a remote handle not loaded for it",
    errno.EACCES: "the remote region does not grant this access (registered 'r' or 'w' only)",
    errno.ESTALE: "a remote handle of the peer's earlier process: load its new blob",
    errno.ENOTCONN: "the peer's connection failed",
    errno.EOPNOTSUPP: "a remote region other than the main one of a peer whose owned region "
                      "is mapped here",
}


# ---- ranges: checked here, so that an error names the range, the field and the rule ----------


def _ranges_arg(what: str, ranges, known: dict):
    """(ctypes array of kvx_range_t, count, what keeps its memory alive), or ValueError naming
    the first range and field at fault. known: the local regions, id -> length."""
    if _is_numpy(ranges):
        return _ranges_numpy(what, ranges, known)
    if isinstance(ranges, dict):
        missing = [f for f in RANGE_FIELDS if f not in ranges]
        extra = [f for f in ranges if f not in RANGE_FIELDS]
        if missing or extra:
            raise ValueError(f"{what}: ranges: a dict of the columns {', '.join(RANGE_FIELDS)}"
                             f"{'; missing ' + ', '.join(missing) if missing else ''}"
                             f"{'; unknown ' + ', '.join(map(str, extra)) if extra else ''}")
        if any(_is_numpy(ranges[f]) for f in RANGE_FIELDS):
            return _ranges_numpy(what, ranges, known)
        cols = []
        n = None
        for f in RANGE_FIELDS:
            c = ranges[f]
            if isinstance(c, int) and not isinstance(c, bool):
                cols.append(None)
                continue
            c = list(c)
            if n is not None and len(c) != n:
                raise ValueError(f"{what}: ranges: columns of different lengths ({f}: {len(c)}, "
                                 f"earlier ones: {n})")
            n = len(c)
            cols.append(c)
        if n is None:
            n = 1
        rows = list(zip(*[[ranges[f]] * n if c is None else c
                          for f, c in zip(RANGE_FIELDS, cols)]))
        return _ranges_rows(what, rows, known)
    try:
        rows = list(ranges)
    except TypeError:
        raise ValueError(f"{what}: ranges: a sequence of (local_region, local_offset, "
                         f"remote_region, remote_offset, length), a NumPy array or a dict of "
                         f"columns, got {type(ranges).__name__}") from None
    return _ranges_rows(what, rows, known)


def _check_count(what: str, n: int) -> None:
    if n == 0:
        raise ValueError(f"{what}: ranges: at least one range, got none")
    if n > _lib.RANGES_MAX:
        raise ValueError(f"{what}: ranges: at most {_lib.RANGES_MAX}, got {n}")


def _ranges_rows(what: str, rows: list, known: dict):
    n = len(rows)
    _check_count(what, n)
    arr = (_lib.Range * n)()
    limits = ((1, _U32), (0, _U64), (1, _U32), (0, _U64), (1, _U64))
    for i, row in enumerate(rows):
        try:
            vals = tuple(row)
        except TypeError:
            raise ValueError(f"{what}: ranges[{i}]: a 5-tuple (local_region, local_offset, "
                             f"remote_region, remote_offset, length), got {row!r}") from None
        if len(vals) != 5:
            raise ValueError(f"{what}: ranges[{i}]: 5 fields (local_region, local_offset, "
                             f"remote_region, remote_offset, length), got {len(vals)}")
        lr, lo, rr, ro, ln = (_int(f"{what}: ranges[{i}].{f}", v, a, b)
                              for f, v, (a, b) in zip(RANGE_FIELDS, vals, limits))
        size = known.get(lr)
        if size is None:
            raise ValueError(f"{what}: ranges[{i}].local_region: {lr} is no region of this "
                             f"transport (registered: {sorted(known)})")
        if lo + ln > size:
            raise ValueError(f"{what}: ranges[{i}]: local_offset {lo} + length {ln} beyond "
                             f"local region {lr} of {size} bytes")
        if ro + ln - 1 > _U64:
            raise ValueError(f"{what}: ranges[{i}]: remote_offset {ro} + length {ln} past "
                             f"2**64 - 1")
        r = arr[i]
        r.local_region, r.local_offset, r.remote_region, r.remote_offset, r.len = \
            lr, lo, rr, ro, ln
    return arr, n, None


def _ranges_numpy(what: str, ranges, known: dict):
    """The NumPy forms: a structured array, an (n, 5) integer array, a dict with NumPy
    columns. Checked with whole-array operations."""
    import numpy as np
    if isinstance(ranges, dict):
        cols = {}
        n = None
        for f in RANGE_FIELDS:
            c = np.asarray(ranges[f])
            if c.ndim > 1:
                raise ValueError(f"{what}: ranges: column {f}: 1-D, got shape {c.shape}")
            if c.ndim == 1:
                if n is not None and len(c) != n:
                    raise ValueError(f"{what}: ranges: columns of different lengths ({f}: "
                                     f"{len(c)}, earlier ones: {n})")
                n = len(c)
            cols[f] = c
        n = 1 if n is None else n
        cols = {f: np.broadcast_to(c, (n,)) for f, c in cols.items()}
    elif ranges.dtype.names is not None:
        if ranges.ndim != 1:
            raise ValueError(f"{what}: ranges: a 1-D structured array, got shape {ranges.shape}")
        names = ranges.dtype.names
        missing = [f for f in RANGE_FIELDS if f not in names]
        if missing:
            raise ValueError(f"{what}: ranges: a structured array with the fields "
                             f"{', '.join(RANGE_FIELDS)} (range_dtype()); missing "
                             f"{', '.join(missing)}")
        if ranges.dtype == range_dtype() and ranges.flags.c_contiguous:
            cols = None  # kvx_range_t's layout already
        else:
            cols = {f: ranges[f] for f in RANGE_FIELDS}
        n = len(ranges)
    else:
        if ranges.ndim != 2 or ranges.shape[1] != 5:
            raise ValueError(f"{what}: ranges: a NumPy array of shape (n, 5) (local_region, "
                             f"local_offset, remote_region, remote_offset, length) or a "
                             f"structured one (range_dtype()), got shape {ranges.shape}")
        cols = {f: ranges[:, k] for k, f in enumerate(RANGE_FIELDS)}
        n = ranges.shape[0]
    _check_count(what, n)
    if cols is not None:
        for f, c in cols.items():
            if c.dtype.kind not in "iu":
                raise TypeError(f"{what}: ranges: column {f}: integers, got dtype {c.dtype}")
            if c.dtype.kind == "i" and n and (c < 0).any():
                i = int(np.flatnonzero(c < 0)[0])
                lo = 0 if f.endswith("offset") else 1
                raise ValueError(f"{what}: ranges[{i}].{f}: {lo}.., got {int(c[i])}")
        rec = np.empty(n, dtype=range_dtype())
        for f in RANGE_FIELDS:
            rec[f] = cols[f].astype(np.uint64, copy=False)
            if f in ("local_region", "remote_region"):
                big = cols[f].astype(np.uint64, copy=False) > _U32
                if big.any():
                    i = int(np.flatnonzero(big)[0])
                    raise ValueError(f"{what}: ranges[{i}].{f}: 1..{_U32}, got {int(cols[f][i])}")
    else:
        rec = ranges if ranges.flags.writeable else ranges.copy()
    lr = rec["local_region"]
    lo = rec["local_offset"]
    rr = rec["remote_region"]
    ro = rec["remote_offset"]
    ln = rec["length"]

    def first(mask):
        return int(np.flatnonzero(mask)[0])

    for f, col in (("local_region", lr), ("remote_region", rr), ("length", ln)):
        bad = col == 0
        if bad.any():
            i = first(bad)
            raise ValueError(f"{what}: ranges[{i}].{f}: at least 1, got 0")
    ids = np.array(sorted(known), dtype=np.uint64)
    sizes = np.array([known[k] for k in sorted(known)], dtype=np.uint64)
    pos = np.minimum(np.searchsorted(ids, lr), max(len(ids) - 1, 0))
    unknown = (ids[pos] != lr) if len(ids) else np.ones(n, dtype=bool)
    if unknown.any():
        i = first(unknown)
        raise ValueError(f"{what}: ranges[{i}].local_region: {int(lr[i])} is no region of this "
                         f"transport (registered: {sorted(known)})")
    size = sizes[pos]
    beyond = (lo > size) | (ln > size - np.minimum(lo, size))  # lo + ln > size, without overflow
    if beyond.any():
        i = first(beyond)
        raise ValueError(f"{what}: ranges[{i}]: local_offset {int(lo[i])} + length {int(ln[i])} "
                         f"beyond local region {int(lr[i])} of {int(size[i])} bytes")
    wraps = ro > np.uint64(_U64) - (ln - np.uint64(1))
    if wraps.any():
        i = first(wraps)
        raise ValueError(f"{what}: ranges[{i}]: remote_offset {int(ro[i])} + length "
                         f"{int(ln[i])} past 2**64 - 1")
    arr = (_lib.Range * n).from_buffer(rec)
    return arr, n, rec
