"""KvxTransport: kvx as a drop-in data transport for a Python serving engine's P2P KV tier.

It has the constructor shape and the methods of the NIXL-based transport it replaces, and
follows the transport contract: None (never an exception) from write_blocks/read_blocks when a
transfer cannot be submitted, ValueError from add_remote_peer for incompatible peers, per-peer
poll isolation, honest cancel, idempotent close, the NIXL-based transport's answers after close
(None, the empty result, []), and adds and removes of one peer id in call order. Every method
may be called from any number of threads at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import errno
import hashlib
import json
import operator
import os
import threading
import warnings
from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple, Optional

from . import _lib
from .regions import RegionsMixin

try:  # the serving engine's interface, when it is installed
    from vllm.v1.kv_offload.tiering.p2p.data.base import (  # type: ignore
        DataTransport as _Base,
        PollResult,
    )
except Exception:  # pragma: no cover - depends on the environment
    _Base = object

    class PollResult(NamedTuple):
        """Transfer ids finished since the previous poll."""

        done: Any
        failed: Any


# Returned by poll() whenever nothing finished: the steady state allocates nothing. done and
# failed are always tuples.
_EMPTY_POLL_RESULT = PollResult(done=(), failed=())


class Failure(NamedTuple):
    """Why a transfer failed: status is its negative errno (-errno.ETIMEDOUT, -kvx.EFENCED,
    ...), name its symbol ("ETIMEDOUT", "KVX_EFENCED"), text kvx's description."""

    status: int
    name: str
    text: str


# How many failed ids failure() remembers, per transport: the most recent ones poll() returned.
FAILURES_KEPT = 4096


class Notice(NamedTuple):
    """A peer's write (sent with notify=True) landed whole in this transport's region."""

    writer: str  # the writer's agent name
    tag: int
    blocks: int
    bytes: int


_NOTICE_BATCH = 64

_POLL_BATCH = 256
_SMALL = 64
_U32 = [ctypes.c_uint32 * n for n in range(_SMALL + 1)]

# Errors of add_remote_peer that mean "this peer is not acceptable": ValueError. The others
# (the peer is unreachable) are ConnectionError.
_VALUE_ERRORS = {errno.EINVAL, errno.EBADMSG, errno.EPROTONOSUPPORT, errno.EEXIST, errno.EACCES,
                 errno.ESTALE, errno.EKEYREVOKED, _lib.EINCOMPAT}


class KvxError(RuntimeError):
    """A kvx call failed; errno is the positive error code."""

    def __init__(self, what: str, rc: int, text: Optional[str] = None):
        # text: what the error means for this call, when kvx_strerror's general one would
        # mislead (ENOENT of a region call is no unknown peer)
        super().__init__(f"{what}: {text or _lib.strerror(rc)} ({_lib.errno_name(rc)}, {rc})"
                         if text else f"{what}: {_lib.strerror(rc)} ({rc})")
        self.errno = -rc
        self._args = (what, rc, text)

    def __reduce__(self):  # picklable (multiprocessing), with its errno
        return (type(self), self._args)


class PeerUnreachableError(ConnectionError, ValueError):
    """add_remote_peer could not reach the peer (its process is gone, the address does not
    answer). It is a ConnectionError and, since a serving engine's session layer rejects a peer
    on ValueError, a ValueError too."""


def _closed_error() -> RuntimeError:
    return RuntimeError("KvxTransport is closed")


class _Turns:
    """Call order of the adds and removes of each peer id: a call takes a ticket when it is
    made and acts once every call made before it on that id has acted (the per-peer generation
    of the NIXL-based transport, with the same effect: a late add cannot revive a peer removed
    after it was called)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._ids: dict = {}  # peer id -> [next ticket, ticket now acting]

    def take(self, pid: str) -> int:
        with self._cv:
            e = self._ids.setdefault(pid, [0, 0])
            e[0] += 1
            return e[0] - 1

    def begin(self, pid: str, ticket: int) -> None:
        with self._cv:
            e = self._ids[pid]
            while e[1] != ticket:
                self._cv.wait()

    def latest(self, pid: str, ticket: int) -> bool:
        """No call on pid was made after this ticket's."""
        with self._cv:
            e = self._ids.get(pid)  # gone: nothing outstanding, so none came after
            return e is None or e[0] == ticket + 1

    def end(self, pid: str, ticket: int) -> None:
        with self._cv:
            e = self._ids[pid]
            e[1] = ticket + 1
            if e[1] == e[0]:
                del self._ids[pid]  # nothing outstanding: tickets start again at 0
            self._cv.notify_all()


# ---- arguments: checked here, before libkvx sees them, so that an error names the argument and
# the rule (kvx.h's -EINVAL says neither) ----------------------------------------------------


def _text_arg(name: str, value, lo: int, hi: int) -> bytes:
    """value as the bytes kvx takes for a name (kvx.h: lo..hi printable ASCII characters, no
    spaces), or ValueError naming the argument and the rule."""
    b = value.encode() if isinstance(value, str) else bytes(value) \
        if isinstance(value, (bytes, bytearray)) else str(value).encode()
    if len(b) < lo:
        raise ValueError(f"{name}: at least {lo} byte{'s' if lo > 1 else ''}, got {len(b)}")
    if len(b) > hi:
        raise ValueError(f"{name}: at most {hi} bytes, got {len(b)} ({value!r})")
    bad = next((i for i, c in enumerate(b) if not 0x21 <= c <= 0x7E), None)
    if bad is not None:
        raise ValueError(f"{name}: printable ASCII without spaces (0x21..0x7e), got byte "
                         f"{b[bad]:#04x} at {bad} in {value!r}")
    return b


def _peer_id_arg(what: str, peer_id) -> bytes:
    """A peer id as kvx takes it: 1..255 bytes (kvx.h KVX_PEER_ID_MAX), no NUL."""
    b = str(peer_id).encode()
    if not 1 <= len(b) <= _lib.PEER_ID_MAX:
        raise ValueError(f"{what}: peer_id: 1..{_lib.PEER_ID_MAX} bytes, got {len(b)}")
    if b"\0" in b:
        raise ValueError(f"{what}: peer_id: no NUL byte, got {peer_id!r}")
    return b


def _int_arg(name: str, value, lo: int, hi: int) -> int:
    """value as an int in lo..hi, or ValueError (TypeError for a non-integer) naming it."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5000.0 was always taken
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: an integer, got {type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name}: {lo}..{hi}, got {v}")
    return v


def _addr_arg(what: str, addr, any_port: bool) -> bytes:
    """An address as kvx_transport_listen / kvx_peer_connect take it: "host:port", an IPv6
    host in brackets, at most 95 bytes, a port of 1..65535 (0 too for listen: any)."""
    b = str(addr).encode()
    rule = (f'"host:port" (IPv6 as "[addr]:port") of at most {_lib.ADDR_MAX - 1} bytes, port '
            f'{"0" if any_port else "1"}..65535{" (0: any)" if any_port else ""}')
    if b.startswith(b"["):
        host, sep, port = b[1:].partition(b"]:")
    else:
        host, sep, port = b.rpartition(b":")
        if b":" in host:
            sep = b""  # an IPv6 address without brackets
    if not (1 <= len(b) < _lib.ADDR_MAX and sep and host and port.isdigit() and len(port) <= 5
            and (1 if not any_port else 0) <= int(port) <= 65535 and b"\0" not in b):
        raise ValueError(f"{what}: addr must be {rule}, got {addr!r}")
    return b


def _region_args(what: str, pid: str, base_addr, num_blocks, block_len) -> tuple:
    """add_remote_peer's checks before the call: peer_id's length, the region's integers."""
    _peer_id_arg(what, pid)
    return tuple(_int_arg(f"{what}: {n}", v, 0, 2**64 - 1) for n, v in
                 (("base_addr", base_addr), ("num_blocks", num_blocks), ("block_len", block_len)))


def _superseded(pid) -> RuntimeError:
    return RuntimeError(f"registration for peer {pid} was superseded (a later "
                        f"remove_remote_peer or add of that id was called before it took effect)")


# How long close() lets registrations already requested (add_remote_peer_async) finish.
CLOSE_WAIT_S = 5.0

# The backends kvx moves data over (NIXL's names).
SUPPORTED_BACKENDS = ("UCX",)


class _Handle:
    """The C transport's handle, destroyed (kvx_transport_destroy) when its last holder goes:
    the KvxTransport, and for an owned region every array and view of the region too. The
    transport's own __del__ only closes it, so that nothing of the transport has to wait for the
    cyclic GC: no view refers back to the KvxTransport object."""

    __slots__ = ("lib", "h")

    def __init__(self, lib, h: int) -> None:
        self.lib = lib
        self.h = h

    def __del__(self):
        h, self.h = self.h, None
        if h is not None:
            try:
                self.lib.kvx_transport_destroy(h)
            except Exception:
                pass


def config_fingerprint(config_fields: Optional[dict]) -> str:
    """First 16 hex digits of sha256 of the config serialized as compact, key-sorted JSON; ""
    (compatible with every peer) when there are no fields."""
    if not config_fields:
        return ""
    blob = json.dumps(config_fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _index_array(idxs) -> Optional[tuple]:
    """(ctypes buffer, length) of 32-bit indices, or None when they cannot be indices.

    Buffers of 4-byte integers (array('i'/'I'), NumPy int32/uint32, memoryviews of them) are
    taken as they are, with one copy; anything else (lists, int64 arrays) goes through
    array('I'), which checks every value. Negative int32 values become huge uint32 ones, which
    kvx rejects as out of range.
    """
    if type(idxs) in (list, tuple) and len(idxs) <= _SMALL:
        # the common case of a few indices: a ctypes array straight from the list (4x faster
        # than through array()), range-checked first since ctypes would wrap silently
        n = len(idxs)
        try:
            if n and (min(idxs) < 0 or max(idxs) > 0xFFFFFFFF):
                return None
            return (_U32[n](*idxs) if n else None), n
        except TypeError:
            return None
    try:
        mv = memoryview(idxs)
    except TypeError:
        mv = None
    if mv is not None and mv.itemsize == 4 and mv.format in ("i", "I", "=i", "=I", "<i", "<I"):
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes()).cast(mv.format[-1])
        n = mv.nbytes // 4
        if n == 0:
            return None, 0
        if not mv.readonly:  # no copy: kvx copies what it keeps during the call
            return (ctypes.c_uint32 * n).from_buffer(mv), n
        return (ctypes.c_uint32 * n).from_buffer_copy(mv), n
    try:
        a = array("I", idxs)
    except (OverflowError, TypeError, ValueError):
        return None
    n = len(a)
    if n == 0:
        return None, 0
    return (ctypes.c_uint32 * n).from_buffer(a), n


class KvxTransport(RegionsMixin, _Base):  # type: ignore[misc, valid-type]
    """Registers one region (a 2-D memoryview, num_blocks x block_len bytes) with kvx and moves
    blocks of it to and from peers.

    Threading: every method may be called from any number of threads at once: each call has its
    own buffers, and kvx serializes what must be. A slow peer in add_remote_peer or
    remove_remote_peer holds up no other call (but the later adds and removes of that same id,
    which take effect in call order). close() may be called while other threads are inside
    methods: those calls (a wait() or poll() asleep, a write_blocks() in progress) end as if
    they had been made after close() (see close()); a second close() returns once the first
    has finished.

    backends: None or ["UCX"]; any other backend (NIXL's "MOONCAKE", "LIBFABRIC", "GDS", ...)
    is refused with ValueError naming it. num_threads (NIXL: UCX worker threads): 0 runs no
    progress thread, so peers' writes into this region and reads from it move only while this
    process calls kvx (poll, wait, poll_notices, ...); any value > 0 runs one progress thread,
    which lets peers write and read while this process never calls kvx (UCX drives one worker
    per transport, so more threads would not help). add_remote_peer_async has its own pool of 4
    threads either way.

    deadline_ms (5000), stall_ms (2000) and keepalive_ms (1000) are kvx_params_t's: a transfer
    fails at its deadline (0: none), a connection that heard nothing from its peer for stall_ms
    while waiting for it fails (0: never), a dead peer is noticed within about 1.5 x keepalive_ms.
    secret (bytes): a shared secret; metadata is then signed with it and peers must hold it.
    net_devices: the network devices UCX may use ("lo", "eth0"). integrity: CRC-32C of every
    piece of data this transport sends as an initiator, checked by the side that receives it.
    notice_queue: how many arrival notices may wait (1024).
    rndv: how data travels (docs/guide.md, "Rendezvous modes"): "auto" (the default: by rendezvous only on
    lanes where UCX moves it by zero-copy RMA, RDMA's rc, dc and gga, for runs of at least
    rndv_thresh or UCX's own threshold; eager on tcp and shared memory), "eager" (never, and
    this transport takes no rendezvous payload from peers) or "always" (every run of at least
    rndv_thresh, on every lane). Peers agree in their handshake: a side sends by rendezvous only
    to a peer that takes it, so any two modes work together. By rendezvous the receiver checks
    the header, then UCX moves the run into its place; on an RDMA lane UCX gives the peer a
    remote key for the memory it registered for that transfer (docs/security.md).
    rndv_thresh: the smallest run in bytes that goes by rendezvous.
    thread_mode: "yields" (kvx's default: the progress thread steps aside for a millisecond after
    each poll()/wait(), for a caller that spins on poll()) or "drives" (it drives throughout: for
    a caller that polls with gaps, once per step of a serving loop; docs/guide.md, "Threading
    model").

    Unavailable (UCX could not start, or libkvx is missing; available is False): the
    constructor warns (RuntimeWarning) with the cause, which unavailable_reason holds;
    write_blocks and read_blocks return None, poll returns the empty result, every other
    method raises RuntimeError saying why.
    """

    def __init__(
        self,
        agent_name: Optional[str],
        view: memoryview,
        config_fields: Optional[dict] = None,
        backends: Optional[list] = None,
        num_threads: int = 4,
        deadline_ms: Optional[int] = None,
        stall_ms: Optional[int] = None,
        keepalive_ms: Optional[int] = None,
        secret: Optional[bytes] = None,
        net_devices: Optional[str] = None,
        integrity: bool = False,
        notice_queue: Optional[int] = None,
        rndv: Optional[str] = None,
        rndv_thresh: Optional[int] = None,
        thread_mode: Optional[str] = None,
    ) -> None:
        owned = getattr(self, "_owned", None)  # set by KvxTransport.owned()
        self._owned_region = owned is not None
        if owned is not None:
            self._view = None  # kvx allocates the region: _init makes the view
            self._num_blocks, self._block_len = owned
            self._region = None
            self._base_addr = 0
        else:
            mv = self._check_view(view)
            self._view = mv
            self._num_blocks = mv.shape[0]
            self._block_len = mv.shape[1] * mv.itemsize
            self._region = (ctypes.c_char * mv.nbytes).from_buffer(mv)
            self._base_addr = ctypes.addressof(self._region)
        self._config_fingerprint = config_fingerprint(config_fields)
        self._backends = list(backends) if backends else ["UCX"]
        unsupported = [b for b in self._backends if b not in SUPPORTED_BACKENDS]
        if unsupported:
            raise ValueError(f"KvxTransport: backend{'s' if len(unsupported) > 1 else ''} "
                             f"{', '.join(map(repr, unsupported))} not supported: kvx moves data "
                             f"over UCX only (backends=None or ['UCX'])")
        self._num_threads = num_threads
        self._agent_name = agent_name
        self._handle: Optional[int] = None
        self._hold: Optional[_Handle] = None
        self._lib = None
        #: why this transport is unavailable (libkvx not found, UCX could not start), or None
        self.unavailable_reason: Optional[str] = None
        self._closed = False
        self._tls = threading.local()  # each thread's id and completion buffers
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closing = False  # close() has begun: no new registration is taken
        self._turns = _Turns()
        self._pending: set = set()  # futures of add_remote_peer_async not finished yet
        self._failures: "collections.OrderedDict[int, int]" = collections.OrderedDict()
        self._failures_lock = threading.Lock()
        self._regions_init(self._num_blocks * self._block_len)  # regions.py
        if _Base is not object and owned is None:
            try:
                super().__init__(view, config_fields=config_fields)
            except Exception:  # the base's own bookkeeping is optional to kvx
                pass
        self._init(deadline_ms, stall_ms, keepalive_ms, secret, net_devices, integrity,
                   notice_queue, rndv, rndv_thresh, thread_mode)
        if self._handle is None:
            warnings.warn(f"KvxTransport {agent_name!r} is unavailable: {self.unavailable_reason}",
                          RuntimeWarning, stacklevel=3 if owned is not None else 2)
        if _Base is not object and owned is not None and self._view is not None:
            try:
                super().__init__(self._view, config_fields=config_fields)
            except Exception:
                pass

    @classmethod
    def owned(cls, agent_name: Optional[str], num_blocks: int, block_len: int,
              **kwargs) -> "KvxTransport":
        """A transport whose region kvx allocates: num_blocks x block_len bytes of shared
        memory, zero-filled, available as .view (a 2-D memoryview of bytes). A peer on this host
        that holds the metadata maps it and writes and reads it with one copy of its own, with
        no work by this process (its progress thread may sleep). Other keyword arguments are
        __init__'s. The region stays valid while this object or any view of it is alive, after
        close() included; it is freed once all are gone. Unavailable (no UCX): .view is None."""
        nb = _int_arg("KvxTransport.owned: num_blocks", num_blocks, 1, _lib.BLOCKS_MAX)
        bl = _int_arg("KvxTransport.owned: block_len", block_len, 1, 2**64 - 1)
        t = cls.__new__(cls)
        t._owned = (nb, bl)
        t.__init__(agent_name, None, **kwargs)
        return t

    @property
    def view(self) -> Optional[memoryview]:
        """The region as a 2-D memoryview, num_blocks x block_len bytes. A 2-D memoryview takes
        view[i, j] (one byte) but not view[i]: use block(i) for a block. An owned region's view
        stays valid after close() (the region stays mapped, as in C, until this object and all
        of its views are gone); for a region the caller provided it is None once closed (the
        transport no longer holds the caller's buffer). None for an unavailable owned one."""
        return self._view

    def block(self, i: int) -> memoryview:
        """Block i of the region as a writable 1-D memoryview of block_len bytes (no NumPy
        needed; bytes(t.block(i)) copies it out, t.block(i)[:] = data writes it). It keeps the
        region alive like .view does. An owned region's blocks stay readable after close();
        for a region the caller provided, RuntimeError once closed (use the caller's buffer).
        IndexError for i outside 0..num_blocks-1."""
        region = self._region
        if region is None:
            if self._closed:
                raise _closed_error()
            raise RuntimeError("KvxTransport is not available: " + self._why())
        i = int(i)
        if not 0 <= i < self._num_blocks:
            raise IndexError(f"block {i} outside 0..{self._num_blocks - 1}")
        bl = self._block_len
        return memoryview(region).cast("B")[i * bl:(i + 1) * bl]

    @staticmethod
    def _check_view(view) -> memoryview:
        try:
            mv = view if isinstance(view, memoryview) else memoryview(view)
        except TypeError:
            raise ValueError(f"view must be a buffer (a 2-D memoryview), not {type(view).__name__}")
        if mv.ndim != 2:
            raise ValueError(f"view must be 2-D (num_blocks x block_len), not {mv.ndim}-D")
        if mv.readonly:
            raise ValueError("view must be writable: peers write into it")
        if not mv.c_contiguous:
            raise ValueError("view must be C-contiguous: one region of num_blocks x block_len")
        if mv.shape[0] == 0 or mv.shape[1] == 0:
            raise ValueError(f"view must hold at least one byte per block, shape {mv.shape}")
        return mv

    def _init(self, deadline_ms: Optional[int], stall_ms: Optional[int],
              keepalive_ms: Optional[int], secret, net_devices, integrity, notice_queue,
              rndv=None, rndv_thresh=None, thread_mode=None) -> None:
        # every argument kvx_transport_create would refuse (-EINVAL) is refused here first, by
        # name and rule, whether or not libkvx can be loaded
        if self._num_blocks > _lib.BLOCKS_MAX:
            raise ValueError(f"KvxTransport: num_blocks: at most {_lib.BLOCKS_MAX} (block "
                             f"indices are 32-bit), got {self._num_blocks}")
        if self._num_blocks * self._block_len >= 2**64:
            raise ValueError(f"KvxTransport: num_blocks x block_len: under 2**64 bytes, got "
                             f"{self._num_blocks} x {self._block_len}")
        name = None if self._agent_name is None else \
            _text_arg("KvxTransport: agent_name", self._agent_name, 1, _lib.NAME_MAX)
        durations = [(bit, n, _int_arg(f"KvxTransport: {n}", v, 0, _lib.MS_MAX))
                     for n, v, bit in (("deadline_ms", deadline_ms, _lib.PARAM_DEADLINE),
                                       ("stall_ms", stall_ms, _lib.PARAM_STALL),
                                       ("keepalive_ms", keepalive_ms, _lib.PARAM_KEEPALIVE))
                     if v is not None]
        sec = None
        if secret is not None:
            sec = secret.encode() if isinstance(secret, str) else bytes(secret)
            if not 1 <= len(sec) <= _lib.SECRET_MAX:
                raise ValueError(f"KvxTransport: secret: 1..{_lib.SECRET_MAX} bytes, got "
                                 f"{len(sec)}")
        devices = None if net_devices is None else \
            _text_arg("KvxTransport: net_devices", net_devices, 1, _lib.NET_DEVICES_MAX)
        notices = None if notice_queue is None else \
            _int_arg("KvxTransport: notice_queue", notice_queue, 1, _lib.NOTICES_MAX)
        mode = thresh = None
        if rndv is not None or rndv_thresh is not None:
            mode = "auto" if rndv is None else str(rndv)
            if mode not in _lib.RNDV_MODES:
                raise ValueError(f"KvxTransport: rndv: one of {sorted(_lib.RNDV_MODES)}, got "
                                 f"{rndv!r}")
            thresh = 0 if rndv_thresh is None else \
                _int_arg("KvxTransport: rndv_thresh", rndv_thresh, 0, 0xFFFFFFFF)
        if thread_mode is not None and str(thread_mode) not in _lib.THREAD_MODES:
            raise ValueError(f"KvxTransport: thread_mode: one of {sorted(_lib.THREAD_MODES)}, "
                             f"got {thread_mode!r}")
        lib = _lib.load()
        if lib is None:
            # available stays False, as the NIXL transport does when NIXL is missing
            self.unavailable_reason = _lib.load_error()
            return
        p = _lib.Params()
        p.field_mask = _lib.PARAM_REGION | _lib.PARAM_FINGERPRINT | _lib.PARAM_BACKENDS | \
            _lib.PARAM_NUM_THREADS
        if self._region is None:
            p.field_mask |= _lib.PARAM_OWN_REGION
        p.base = self._base_addr or None
        p.num_blocks = self._num_blocks
        p.block_len = self._block_len
        p.fingerprint = self._config_fingerprint.encode()
        backends = [b.encode() for b in self._backends]
        arr = (ctypes.c_char_p * len(backends))(*backends)
        p.backends = arr
        p.num_backends = len(backends)
        p.num_threads = max(0, int(self._num_threads))
        if name is not None:
            p.field_mask |= _lib.PARAM_AGENT_NAME
            p.agent_name = name
        for bit, n, v in durations:
            p.field_mask |= bit
            setattr(p, n, v)
        if sec is not None:
            p.field_mask |= _lib.PARAM_SECRET
            p.secret = sec
            p.secret_len = len(sec)
        if devices is not None:
            p.field_mask |= _lib.PARAM_NET_DEVICES
            p.net_devices = devices
        if integrity:
            p.field_mask |= _lib.PARAM_INTEGRITY
            p.integrity = 1
        if notices is not None:
            p.field_mask |= _lib.PARAM_NOTICES
            p.notice_queue = notices
        if mode is not None:
            p.field_mask |= _lib.PARAM_RNDV
            p.rndv_mode = _lib.RNDV_MODES[mode]
            p.rndv_thresh = thresh
        if thread_mode is not None:
            p.field_mask |= _lib.PARAM_THREAD_MODE
            p.thread_mode = _lib.THREAD_MODES[str(thread_mode)]
        h = ctypes.c_void_p()
        rc = lib.kvx_transport_create(ctypes.byref(p), ctypes.byref(h))
        if rc == -errno.EINVAL:  # every rule is checked above: a libkvx with other rules
            raise ValueError(f"KvxTransport: kvx_transport_create refused the arguments "
                             f"(agent_name {self._agent_name!r}, backends {self._backends}, "
                             f"region {self._num_blocks} x {self._block_len}, net_devices "
                             f"{net_devices!r}, notice_queue {notice_queue!r}): "
                             f"{_lib.strerror(rc)}")
        if rc < 0:  # UCX could not start here: available is False
            self.unavailable_reason = (
                f"kvx_transport_create: {_lib.strerror(rc)} ({rc}) in this environment "
                f"(UCX_TLS={os.environ.get('UCX_TLS', '(unset)')}, "
                f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '(unset)')}, net_devices="
                f"{net_devices!r}); libkvx's log on stderr says more")
            return
        self._handle = h.value
        self._lib = lib
        self._hold = _Handle(lib, h.value)
        if self._region is None:  # owned: the view is of kvx's memory
            a = _lib.TransportAttr()
            a.field_mask = _lib.TRANSPORT_ATTR_REGION
            self._check("owned region", lib.kvx_transport_query(self._handle, ctypes.byref(a)))
            self._base_addr = a.base
            region = (ctypes.c_char * (self._num_blocks * self._block_len)).from_address(a.base)
            # every view keeps the region's array alive, and the array keeps the handle (whose
            # kvx_transport_destroy frees the memory) alive; not this object, which would then
            # be part of a reference cycle and wait for the cyclic GC
            region._kvx_owner = self._hold
            self._region = region
            self._view = memoryview(region).cast("B", (self._num_blocks, self._block_len))

    # ---- properties ------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """True while this transport can move data: libkvx was loaded, UCX started, and close()
        has not been called. False once closed, and from the start when unavailable
        (unavailable_reason says why)."""
        return self._handle is not None and not self._closed

    @property
    def base_addr(self) -> int:
        """The region's address in this process, as peers pass it to add_remote_peer (which
        checks it against the metadata). For an owned region, where kvx mapped it (0 when
        unavailable). Unchanged by close()."""
        return self._base_addr

    @property
    def num_blocks(self) -> int:
        """How many blocks the region holds (the view's first dimension); block indices run
        0..num_blocks-1."""
        return self._num_blocks

    @property
    def block_len(self) -> int:
        """Bytes per block (the view's second dimension times its item size). Peers must use
        the same block length: add_remote_peer refuses another (ValueError)."""
        return self._block_len

    @property
    def config_fingerprint(self) -> str:
        """config_fingerprint(config_fields): 16 hex digits of the config's sha256, or "" when
        none was given. Two transports whose fingerprints are both non-empty and differ refuse
        to pair (add_remote_peer and connect raise ValueError)."""
        return self._config_fingerprint

    def _why(self) -> str:
        return self.unavailable_reason or "UCX could not start"

    def _h(self) -> int:
        if self._closed:
            raise _closed_error()
        if self._handle is None:
            raise RuntimeError("KvxTransport is not available: " + self._why())
        return self._handle

    def _check(self, what: str, rc: int) -> int:
        """rc, or the exception for a failed call (-ESHUTDOWN: close() overlapped it)."""
        if rc >= 0:
            return rc
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        raise KvxError(what, rc)

    def _buffers(self):
        """This thread's id cell and completion array: calls on other threads never share
        them (ctypes releases the GIL during each C call)."""
        tls = self._tls
        try:
            return tls.id, tls.comps
        except AttributeError:
            tls.id = ctypes.c_uint64()
            tls.comps = (_lib.Completion * _POLL_BATCH)()
            return tls.id, tls.comps

    # ---- metadata and peers ----------------------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        """The bytes a peer passes to add_remote_peer to reach this transport
        (kvx_transport_metadata): UCX's address of this transport's worker, the region's
        geometry, the config fingerprint, a generation and the capability that lets a peer
        write into and read from the region, signed with the secret when one is set. About 360
        bytes (docs/guide.md, "Python"), whatever num_blocks. Hand them only to peers that may use the
        region. After fence(retire=True) it returns the new metadata. RuntimeError when the
        transport is closed or unavailable."""
        h = self._h()
        n = ctypes.c_size_t(0)
        rc = self._lib.kvx_transport_metadata(h, None, ctypes.byref(n))
        if rc != -errno.ENOSPC:
            self._check("get_agent_metadata", rc)
        buf = ctypes.create_string_buffer(n.value)
        self._check("get_agent_metadata", self._lib.kvx_transport_metadata(h, buf, ctypes.byref(n)))
        return buf.raw[: n.value]

    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                        num_blocks: int, block_len: int) -> None:
        """Connect to a peer. ValueError when the peer is incompatible (block length,
        fingerprint), the metadata is malformed or our own, is not signed with this transport's
        secret (or is signed and this transport has none), disagrees with the arguments, or
        is older than the metadata peer_id already has (a stale copy of a restarted peer);
        PeerUnreachableError (a ConnectionError and a ValueError) when it cannot be reached, for
        instance because its process is gone. On error nothing changes. Waits up to 200 ms for
        the peer to answer, without holding up other calls (and, when it replaces a connection of
        that id, up to 2 s more for the old one to close). Re-adding an id replaces its
        connection and purges the old connection's transfers, as remove_remote_peer does: their
        ids never come out of poll.
        Adds and removes of one id take effect in the order they were called, whatever thread
        calls them and however long each takes: a call waits for the earlier ones on that id.
        An add that a later call on its id superseded before it took effect raises
        RuntimeError("registration for peer ... was superseded ..."): that later call decides
        what the peer is. RuntimeError("KvxTransport is closed") after close(). ValueError, with
        nothing done, for a peer_id that is not 1..255 bytes, or a base_addr, num_blocks or
        block_len outside 0..2**64-1."""
        self._h()
        pid = str(peer_id)
        region = _region_args("add_remote_peer", pid, base_addr, num_blocks, block_len)
        ticket = self._turns.take(pid)
        self._registration(pid, ticket, bytes(agent_metadata), *region)

    def _registration(self, pid: str, ticket: int, md: bytes, base_addr, num_blocks,
                      block_len) -> None:
        """One add of pid, in its turn (ticket), which it ends whatever happens."""
        later = True
        try:
            self._turns.begin(pid, ticket)
            if not self._turns.latest(pid, ticket):
                raise _superseded(pid)
            h = self._h()
            # a re-add forgets the old connection's transfers, as remove does (C purges them)
            pp = _lib.PeerParams(_lib.PEER_PARAM_EXPECT_REGION | _lib.PEER_PARAM_FLAGS,
                                 base_addr, num_blocks, block_len, _lib.PEER_ADD_PURGE)
            rc = self._lib.kvx_peer_add(h, pid.encode(), md, len(md), ctypes.byref(pp))
            # asked while the turn is ours: once it ends, a later call may run and be gone
            later = not self._turns.latest(pid, ticket)
        finally:
            self._turns.end(pid, ticket)
        if rc == 0:
            if later:
                raise _superseded(pid)  # a later call on this id acts next
            return
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        if rc == -errno.EINVAL:  # the arguments' own rules were checked before the call
            raise ValueError(f"add_remote_peer({pid!r}): base_addr {base_addr:#x}, num_blocks "
                             f"{num_blocks} or block_len {block_len} disagree with the metadata's "
                             f"region: {_lib.strerror(rc)}")
        if -rc in _VALUE_ERRORS:
            raise ValueError(f"add_remote_peer({pid!r}): {_lib.strerror(rc)}")
        raise PeerUnreachableError(-rc, f"add_remote_peer({pid!r}): {_lib.strerror(rc)}")

    def listen(self, addr: str) -> str:
        """Listen for peers that pair by address (connect) at "host:port" (port 0: any), on
        UCX's connection manager; binds only there. Returns the address bound, with its port.
        A connecting transport receives this one's metadata (only after proving the shared
        secret, if one is set). KvxError if the address is bad (its message names the rule;
        errno EINVAL), taken, or already listening."""
        h = self._h()
        try:
            b = _addr_arg("listen", addr, True)
        except ValueError as e:
            raise KvxError(str(e), -errno.EINVAL) from None
        rc = self._lib.kvx_transport_listen(h, b)
        if rc == -errno.EINVAL:  # the form is right: the host is no address of this machine's
            raise KvxError(f"listen: addr {addr!r}: the host does not resolve", rc)
        self._check("listen", rc)
        a = _lib.TransportAttr()
        a.field_mask = _lib.TRANSPORT_ATTR_LISTEN
        self._check("listen", self._lib.kvx_transport_query(h, ctypes.byref(a)))
        return a.listen_addr.decode()

    def connect(self, peer_id: str, addr: str) -> None:
        """Pair with the transport listening at addr and call it peer_id: its metadata comes
        over UCX's connection manager, then the peer is added as add_remote_peer does (the same
        checks: ValueError when incompatible, or refused; PeerUnreachableError when
        nothing answers there, or not within 5 s). Such a peer heals: when its connection fails,
        kvx pairs with the address again by itself (peer_info's state is "reconnecting"
        meanwhile, and transfers submitted then wait, within their deadlines), and
        poll_peer_events() tells what happened. ValueError, with nothing done, for a peer_id
        that is not 1..255 bytes or an addr not of the form "host:port" (port 1..65535)."""
        h = self._h()
        pid = str(peer_id)
        _peer_id_arg("connect", pid)
        baddr = _addr_arg(f"connect({peer_id!r})", addr, False)
        ticket = self._turns.take(pid)
        try:
            self._turns.begin(pid, ticket)
            pp = _lib.PeerParams(_lib.PEER_PARAM_FLAGS, 0, 0, 0, _lib.PEER_ADD_PURGE)
            rc = self._lib.kvx_peer_connect(h, pid.encode(), baddr, ctypes.byref(pp))
        finally:
            self._turns.end(pid, ticket)
        if rc == 0:
            return
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        if rc == -errno.EINVAL:  # the form was checked: the name did not resolve
            raise ValueError(f"connect({peer_id!r}): addr {addr!r}: the host does not resolve: "
                             f"{_lib.strerror(rc)}")
        if -rc in _VALUE_ERRORS:
            raise ValueError(f"connect({peer_id!r}, {addr!r}): {_lib.strerror(rc)}")
        raise PeerUnreachableError(-rc, f"connect({peer_id!r}, {addr!r}): {_lib.strerror(rc)}")

    def add_remote_peer_async(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                              num_blocks: int, block_len: int) -> concurrent.futures.Future:
        """add_remote_peer on a worker thread of this transport (a pool of 4, whatever
        num_threads is): returns a concurrent.futures.Future whose result() is None or raises
        what add_remote_peer would. Other calls, and adds of other ids, go on meanwhile. Its
        place in the call order of its id is taken now, at the call: a remove_remote_peer (or
        another add) of that id called afterwards supersedes it, and the future raises
        RuntimeError("registration for peer ... was superseded ...") while the peer stays as
        that later call leaves it (removed). close() lets registrations already requested
        finish, for up to CLOSE_WAIT_S (5 s) in all; one still running then fails with
        RuntimeError("KvxTransport is closed"). Called after close() has begun, it raises
        RuntimeError at once, as the NIXL-based transport's executor does; on an unavailable transport the future holds the RuntimeError saying
        why, as the NIXL-based transport's does."""
        if self._handle is None and not self._closed:
            f: concurrent.futures.Future = concurrent.futures.Future()
            f.set_exception(RuntimeError("KvxTransport is not available: " + self._why()))
            return f
        self._h()
        pid = str(peer_id)
        md = bytes(agent_metadata)
        try:
            region = _region_args("add_remote_peer_async", pid, base_addr, num_blocks, block_len)
        except (TypeError, ValueError) as e:  # the future holds it, as add_remote_peer's outcome
            f = concurrent.futures.Future()
            f.set_exception(e)
            return f
        with self._executor_lock:
            if self._closing:
                raise _closed_error()
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="kvx-add-peer")
            # the ticket and the submission together: tickets of one id reach the pool in
            # their order, so a worker never waits for one queued behind it
            ticket = self._turns.take(pid)
            try:
                f = self._executor.submit(self._registration, pid, ticket, md, *region)
            except BaseException:
                self._turns.begin(pid, ticket)
                self._turns.end(pid, ticket)
                raise
            self._pending.add(f)
        f.add_done_callback(self._pending.discard)
        return f

    def remove_remote_peer(self, peer_id: str) -> None:
        """Release the peer's connection and purge its transfers: their ids never come out of
        poll (finished ones not yet polled included), as the seed's transport does; cancel
        them first to learn their fate. Bytes of a purged transfer may still be moving until
        the connection has closed (a purged read's local blocks, a purged write's remote
        blocks). Unknown peer: nothing happens. It takes effect after the adds of that id
        called before it (an add_remote_peer_async still queued or running is superseded: its
        future raises, and the peer stays removed). Other calls go on meanwhile. After close():
        returns None, as the NIXL-based transport does."""
        if self._closed:
            return None
        self._h()
        pid = str(peer_id)
        _peer_id_arg("remove_remote_peer", pid)
        ticket = self._turns.take(pid)
        try:
            self._turns.begin(pid, ticket)
            if self._closed:
                return None
            rc = self._lib.kvx_peer_remove_ex(self._handle, pid.encode(), _lib.PEER_REMOVE_PURGE)
        finally:
            self._turns.end(pid, ticket)
        if rc == -errno.ESHUTDOWN:
            return None
        self._check("remove_remote_peer", rc)
        return None

    def peer_info(self, peer_id: str) -> Optional[dict]:
        """Transport in use, state and counters of a peer; None if unknown. state is
        "connected", "wiring" (added, its handshake not answered yet: transfers wait behind
        it), "reconnecting" (paired by address, pairing again), "failed" or "removed"."""
        if self._closed:
            return None
        h = self._h()
        a = _lib.PeerAttr()
        a.field_mask = _lib.PEER_ATTR_ALL
        rc = self._lib.kvx_peer_query(h, str(peer_id).encode(), ctypes.byref(a))
        if rc < 0:  # unknown, or -ESHUTDOWN: close() overlapped it
            return None
        return {
            "agent_name": a.agent_name.decode(),
            "transport": a.transport.decode(),
            "rma_hw": bool(a.rma_hw),
            "state": _lib.PEER_STATES.get(a.state, str(a.state)),
            "error": a.error,
            "remote_base": a.remote_base,
            "remote_num_blocks": a.remote_num_blocks,
            "block_len": a.block_len,
            "bytes_written": a.bytes_written,
            "bytes_read": a.bytes_read,
            "xfers_done": a.xfers_done,
            "xfers_failed": a.xfers_failed,
            "xfers_inflight": a.xfers_inflight,
            "latency_sum_ns": a.latency_sum_ns,
            "latency_max_ns": a.latency_max_ns,
            "recv": {name: getattr(a.recv, name) for name in _lib.RECV_COUNTERS},
            "generation": a.generation,
        }

    # ---- transfers -------------------------------------------------------------------------

    def _submit(self, write, peer_id, local_idxs, remote_idxs, deadline_ms, tag=None,
                notify=False, priority=None) -> Optional[int]:
        h = self._handle
        if h is None or self._closed:
            return None  # unavailable, or closed (as the NIXL-based transport after close())
        loc = _index_array(local_idxs)
        rem = _index_array(remote_idxs)
        if loc is None or rem is None or loc[1] != rem[1]:
            return None
        params = None
        if deadline_ms is not None or tag is not None or notify or priority is not None:
            xp = _lib.XferParams()
            try:
                if priority is not None:
                    level = _lib.PRIO_NAMES.get(priority) if isinstance(priority, str) \
                        else operator.index(priority)
                    if level is None or isinstance(priority, bool) or \
                            not 0 <= level <= _lib.PRIO_HIGH:
                        return None
                    xp.field_mask |= _lib.XFER_PARAM_PRIORITY
                    xp.priority = level
                if deadline_ms is not None:
                    xp.field_mask |= _lib.XFER_PARAM_DEADLINE
                    xp.deadline_ms = int(deadline_ms)
                if tag is not None:
                    if not 0 <= int(tag) < 2**64:
                        return None
                    xp.field_mask |= _lib.XFER_PARAM_TAG
                    xp.tag = int(tag)
            except (TypeError, ValueError, OverflowError):
                return None
            if notify:
                xp.field_mask |= _lib.XFER_PARAM_FLAGS
                xp.flags = _lib.XFER_NOTIFY
            params = ctypes.byref(xp)
        try:
            idp = self._tls.id
        except AttributeError:
            idp = self._buffers()[0]
        fn = self._lib.kvx_xfer_write if write else self._lib.kvx_xfer_read
        rc = fn(h, str(peer_id).encode(), loc[0], rem[0], loc[1], params, ctypes.byref(idp))
        return None if rc < 0 else idp.value  # -ESHUTDOWN: close() overlapped this call

    def write_blocks(self, peer_id: str, local_idxs, remote_idxs,
                     deadline_ms: Optional[int] = None, tag: Optional[int] = None,
                     notify: bool = False, priority=None) -> Optional[int]:
        """Submit a write of local_idxs[i] into the peer's remote_idxs[i]. Returns a transfer id
        that poll() reports once, or None when the peer is unknown or failed, the lists differ
        in length, an index is out of range, deadline_ms is out of 0..10**12, submission fails,
        or the transport is unavailable or closed. Never blocks, never raises for a dead peer.
        tag (0..2**64-1): seen by the receiver in notices, and what it may fence by. notify: the
        receiver gets an arrival notice (poll_notices) once all of the blocks landed, and only
        then does the write complete here. priority: "low", "normal" (the default), "high", or
        kvx.PRIO_LOW/PRIO_NORMAL/PRIO_HIGH; transfers to a peer go highest first, a low one
        still gets its share (kvx.h, enum kvx_priority); anything else returns None."""
        return self._submit(True, peer_id, local_idxs, remote_idxs, deadline_ms, tag, notify,
                            priority)

    def read_blocks(self, peer_id: str, local_idxs, remote_idxs,
                    deadline_ms: Optional[int] = None, priority=None) -> Optional[int]:
        """Submit a read of the peer's remote_idxs[i] into local_idxs[i]; as write_blocks (the
        target answers waiting reads by their priority too)."""
        return self._submit(False, peer_id, local_idxs, remote_idxs, deadline_ms,
                            priority=priority)

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        """Drive progress; return the ids that finished since the last poll, each once, as
        PollResult(done, failed) of two tuples. With a peer_id, only that peer's transfers,
        leaving the others' for their own polls; None takes them all (shutdown drain). Each id
        is returned to exactly one caller, whichever thread polls; failure(id) tells why a
        failed one failed. Ids of transfers purged (remove_remote_peer, or a re-add of their
        peer id) never come out. The empty result when unavailable or closed."""
        h = self._handle
        if h is None or self._closed:
            return _EMPTY_POLL_RESULT  # unavailable, or closed
        pid = None if peer_id is None else str(peer_id).encode()
        try:
            comps = self._tls.comps
        except AttributeError:
            comps = self._buffers()[1]
        done = failed = statuses = None
        while True:
            n = self._lib.kvx_transport_poll(h, pid, comps, _POLL_BATCH)
            if n <= 0:
                if n < 0 and n != -errno.ESHUTDOWN:  # -ESHUTDOWN: close() overlapped it
                    self._check("poll", n)
                break
            for i in range(n):
                c = comps[i]
                st = c.status
                if st == 0:
                    if done is None:
                        done = []
                    done.append(c.id)
                else:
                    if failed is None:
                        failed = []
                    failed.append(c.id)
                    why = (c.id, st)
                    if statuses is None:
                        statuses = [why]
                    else:
                        statuses.append(why)
            if n < _POLL_BATCH:
                break
        if statuses is not None:
            self._remember(statuses)
        if done is None and failed is None:
            return _EMPTY_POLL_RESULT
        return PollResult(done=tuple(done) if done is not None else (),
                          failed=tuple(failed) if failed is not None else ())

    def _remember(self, statuses) -> None:
        with self._failures_lock:
            f = self._failures
            for tid, st in statuses:
                f[tid] = st
            while len(f) > FAILURES_KEPT:
                f.popitem(last=False)

    def failure(self, transfer_id: int) -> Optional[Failure]:
        """Why a transfer that poll() returned as failed failed: Failure(status, name, text),
        e.g. (-kvx.EFENCED, "KVX_EFENCED", ...) for a write the receiver fenced, (-ETIMEDOUT,
        "ETIMEDOUT", ...) for one past its deadline, -ECANCELED for one canceled ("wait"),
        -ECONNRESET for a peer that failed. poll() itself is unchanged (ids only); this
        remembers the last FAILURES_KEPT (4096) failed ids poll() returned on this transport,
        whichever thread polled (measured: 180 bytes each, 720 KiB when full). None for an id
        that succeeded, has not come out of poll() yet, is unknown, or is older than those.
        Works after close()."""
        with self._failures_lock:
            st = self._failures.get(int(transfer_id))
        if st is None:
            return None
        return Failure(st, _lib.errno_name(st), _lib.strerror(st))

    def fence(self, writer: Optional[str] = None, tags: Optional[Iterable[int]] = None,
              retire: bool = False) -> int:
        """Fence writes into this region. What it guarantees: when this returns, no byte of a
        write that writer (a peer id of this transport, or the writer's agent name; None: every
        writer) submitted before the call lands here any more, on every connection of that
        writer this transport has already heard from (whose HELLO it has processed); with tags,
        only writes carrying one of them. Bytes that landed before the call stay. What it does
        not cover: a connection whose HELLO had not yet arrived when fence() was called is a new
        connection, and its writes land, those submitted before the call included (a writer
        that added this peer just before, or whose handshake is still under way: peer_info()'s
        state "wiring" on its side). Returns the number of the writer's connections fenced
        (0: none heard from, nothing fenced).
        The writer's fenced transfers fail (a failed id in its poll, whose failure() is
        KVX_EFENCED) and it need not re-add anything: writes it submits once it heard of the
        fence land (kvx tells it at once; one submitted before that fails too and may simply be
        submitted again). Never waits on the network.
        retire=True is the stronger form (kvx_fence_ex, KVX_FENCE_RETIRE): it also retires this
        transport's capability, so that a connection whose HELLO arrives after the call is
        refused (it and its transfers fail with EKEYREVOKED, and add_remote_peer with the old
        metadata raises ValueError): every write submitted before the call, on any connection,
        is then kept out. get_agent_metadata() returns the new metadata (same size) from then
        on, which writers must be given again; connections already made keep working."""
        h = self._h()
        name = None
        if writer is not None:
            info = self.peer_info(writer)
            name = (info["agent_name"] if info else str(writer)).encode()
        if name is not None and not 1 <= len(name) <= _lib.NAME_MAX:
            raise ValueError(f"fence: writer: an agent name of 1..{_lib.NAME_MAX} bytes, got "
                             f"{len(name)} ({writer!r})")
        tl = [] if tags is None else [int(x) for x in tags]
        if len(tl) > _lib.FENCE_TAGS_MAX:
            raise ValueError(f"fence: tags: at most {_lib.FENCE_TAGS_MAX}, got {len(tl)}")
        bad = [x for x in tl if not 0 <= x < 2**64]
        if bad:
            raise ValueError(f"fence: tags: each 0..2**64-1, got {bad[0]}")
        arr = (ctypes.c_uint64 * len(tl))(*tl) if tl else None
        return self._check("fence", self._lib.kvx_fence_ex(
            h, name, arr, len(tl), _lib.FENCE_RETIRE if retire else 0))

    def poll_notices(self) -> tuple:
        """The arrival notices waiting (Notice(writer, tag, blocks, bytes)), oldest first, each
        once; the shared empty tuple when there is none. A notice comes only after every block
        of its write landed, never for a write that failed or was fenced."""
        h = self._handle
        if h is None or self._closed:
            return ()
        try:
            buf = self._tls.notices
        except AttributeError:
            buf = self._tls.notices = (_lib.Notice * _NOTICE_BATCH)()
        out = None
        while True:
            n = self._lib.kvx_notice_poll(h, buf, _NOTICE_BATCH)
            if n == -errno.ESHUTDOWN:
                n = 0
            n = self._check("poll_notices", n)
            if n == 0:
                break
            if out is None:
                out = []
            out.extend(Notice(b.writer.decode(), b.tag, b.blocks, b.bytes) for b in buf[:n])
            if n < _NOTICE_BATCH:
                break
        return () if out is None else tuple(out)

    def poll_peer_events(self) -> list:
        """What happened to peers paired by address (connect), oldest first, each once: dicts
        of peer_id, event ("down": its connection failed and kvx pairs again; "restarted": back,
        with a newer generation, its region's contents gone; "reconnected": back, the same
        transport), error (for "down", a negative errno) and generation."""
        if self._closed:
            return []
        h = self._h()
        buf = (_lib.PeerEvent * 64)()
        out = []
        while True:
            n = self._lib.kvx_peer_event_poll(h, buf, 64)
            if n == -errno.ESHUTDOWN:
                return out
            n = self._check("poll_peer_events", n)
            out.extend({"peer_id": e.peer_id.decode(),
                        "event": _lib.PEER_EVENTS.get(e.type, str(e.type)),
                        "error": e.error, "generation": e.generation} for e in buf[:n])
            if n < 64:
                return out

    def counters(self) -> dict:
        """What peers did to this transport's region, and what kvx refused them: bytes_landed,
        writes_landed, bytes_served, notices, drop_malformed, drop_capability, drop_unknown,
        drop_range, drop_fenced, drop_crc, drop_other, conns_overflow, conns_evicted,
        drop_unproven, drop_hello_limit, drop_replayed, rndv_landed, rndv_failed, rndv_served,
        catchup_over (include/kvx.h, kvx_recv_counters_t; docs/security.md, "Resource
        bounds"); and of its regions (kvx_region_counters_t, region_counters()): registered,
        registrations, drop_region, drop_region_capability, drop_access, dereg_closed."""
        h = self._h()
        a = _lib.TransportAttr()
        a.field_mask = _lib.TRANSPORT_ATTR_RECV | _lib.TRANSPORT_ATTR_REGIONS
        self._check("counters", self._lib.kvx_transport_query(h, ctypes.byref(a)))
        c = {name: getattr(a.recv, name) for name in _lib.RECV_COUNTERS}
        c.update((name, getattr(a.regions, name)) for name in _lib.REGION_COUNTERS)
        return c

    def fileno(self) -> int:
        """A descriptor readable while poll(), poll_notices() or poll_peer_events() has
        something to return (kvx_transport_event_fd; level-triggered). kvx owns it: never read,
        write or close it; it stays valid until the transport is freed. For event loops: select,
        epoll, asyncio's add_reader, or poll_async(). A loop that drains only some kinds waits
        on kvx.metrics.event_fd(self, kinds) instead: this one stays readable while the
        others wait."""
        from . import metrics
        return metrics.event_fd(self)

    async def poll_async(self, timeout: Optional[float] = None) -> PollResult:
        """Await completions of every peer on the event fd, without a thread or a timer, then
        return poll()'s result (empty after timeout seconds). See kvx.aio."""
        from . import aio
        return await aio.poll_async(self, timeout)

    def wait(self, peer_id: Optional[str] = None, timeout: Optional[float] = None) -> bool:
        """Sleep until poll(peer_id) has something to return (True) or timeout seconds pass
        (False), driving progress meanwhile. close() from another thread ends the wait with
        RuntimeError("KvxTransport is closed")."""
        h = self._h()
        ms = -1 if timeout is None else min(max(0, int(timeout * 1000)), 2**31 - 1)
        pid = None if peer_id is None else _peer_id_arg("wait", peer_id)
        return self._check("wait", self._lib.kvx_transport_wait(h, pid, ms)) > 0

    def cancel(self, transfer_ids: Iterable[int], mode: str = "immediate") -> list:
        """Best effort. "immediate": stop tracking the ids now (they never come out of poll);
        returns []. "wait": returns the ids whose bytes may still be moving; each comes out of a
        later poll as failed (canceled) and only then may its blocks be reused. Unknown or
        finished ids are ignored."""
        if mode not in ("immediate", "wait"):
            raise ValueError(f"cancel mode must be 'immediate' or 'wait', not {mode!r}")
        if self._closed:
            return []  # close() released everything, as the NIXL-based transport's does
        h = self._h()
        ids = array("Q", [int(i) for i in transfer_ids if 0 <= int(i) < 2**64])
        n = len(ids)
        if n == 0:
            return []
        buf = (ctypes.c_uint64 * n).from_buffer(ids)
        pending = (ctypes.c_uint64 * n)()
        rc = self._lib.kvx_xfer_cancel(
            h, buf, n, _lib.CANCEL_WAIT if mode == "wait" else _lib.CANCEL_IMMEDIATE, pending)
        if rc == -errno.ESHUTDOWN:
            return []
        return list(pending[:self._check("cancel", rc)])

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Let registrations already requested finish (add_remote_peer_async: for up to
        CLOSE_WAIT_S, 5 s, in all; one still running then fails with RuntimeError("KvxTransport
        is closed")), then fail and release everything, remove all peers, deregister the region.
        Idempotent; a second close() returns once the first has finished. When it returns, kvx
        no longer touches the region (an owned region stays mapped and readable). Afterwards,
        as the NIXL-based transport after its close(): write_blocks and read_blocks return
        None, poll the empty result, cancel [], remove_remote_peer None, and likewise
        peer_info None, poll_notices (), poll_peer_events [], failure() still answers; the
        calls that need a working transport (get_agent_metadata, add_remote_peer,
        add_remote_peer_async, connect, listen, fence, counters, wait) raise
        RuntimeError("KvxTransport is closed"). Calls other threads are making meanwhile end
        as if made after it."""
        with self._close_lock:  # a second close() returns once the first has finished
            if self._closed:
                return
            with self._executor_lock:
                self._closing = True  # no new registration from here
                pending = list(self._pending)
            if pending:
                concurrent.futures.wait(pending, timeout=CLOSE_WAIT_S)
            self._closed = True
            with self._executor_lock:
                if self._executor is not None:
                    # an add still queued runs and raises "closed"
                    self._executor.shutdown(wait=False)
            if self._handle is not None:
                # The handle itself is freed only when this object is (__del__): another thread
                # may still be about to pass it to libkvx, which then answers -ESHUTDOWN.
                self._lib.kvx_transport_close(self._handle)
            self._regions_forget()  # every region deregistered: their buffers are free
            if not self._owned_region:
                # drop our hold on the caller's buffer, so that it can be released (an mmap
                # closed); an owned region stays mapped, and readable, until the handle goes
                self._region = None
                self._view = None

    def __del__(self):
        # close() stops the progress thread and releases UCX's worker now; the handle (and an
        # owned region's memory) goes with the last of this object and the region's views
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else "available" if self.available else "unavailable"
        return (f"KvxTransport({self._agent_name!r}, {self._num_blocks} x {self._block_len} "
                f"bytes, {state})")
