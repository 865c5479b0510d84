"""KvxTransport: kvx as a drop-in data transport for a Python serving engine's P2P KV tier.

It has the constructor shape and the methods of the NIXL-based transport it replaces, and
follows the transport contract: None (never an exception) from write_blocks/read_blocks when a
transfer cannot be submitted, ValueError from add_remote_peer for incompatible peers, per-peer
poll isolation, honest cancel, idempotent close, and a clear exception for use after close.
Every method may be called from any number of threads at once.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import hashlib
import json
import threading
from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple, Optional

from . import _lib

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
                 errno.ESTALE, _lib.EINCOMPAT}


class KvxError(RuntimeError):
    """A kvx call failed; errno is the positive error code."""

    def __init__(self, what: str, rc: int):
        super().__init__(f"{what}: {_lib.strerror(rc)} ({rc})")
        self.errno = -rc


class PeerUnreachableError(ConnectionError, ValueError):
    """add_remote_peer could not reach the peer (its process is gone, the address does not
    answer). It is a ConnectionError and, since a serving engine's session layer rejects a peer
    on ValueError, a ValueError too."""


def _closed_error() -> RuntimeError:
    return RuntimeError("KvxTransport is closed")


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


class KvxTransport(_Base):  # type: ignore[misc, valid-type]
    """Registers one region (a 2-D memoryview, num_blocks x block_len bytes) with kvx and moves
    blocks of it to and from peers.

    Threading: every method may be called from any number of threads at once: each call has its
    own buffers, and kvx serializes what must be. A slow peer in add_remote_peer or
    remove_remote_peer holds up no other call. close() may be called while other threads are
    inside methods: those calls (a wait() or poll() asleep, a write_blocks() in progress) end as
    if they had been made after close(), with RuntimeError("KvxTransport is closed"); a second
    close() returns once the first has finished. A background progress thread (num_threads > 0)
    lets peers write into and read from this region while this process never calls kvx.
    num_threads > 1 is accepted and runs one thread: UCX drives one worker per transport.

    deadline_ms (5000), stall_ms (2000) and keepalive_ms (1000) are kvx_params_t's: a transfer
    fails at its deadline (0: none), a connection that heard nothing from its peer for stall_ms
    while waiting for it fails (0: never), a dead peer is noticed within about 1.5 x keepalive_ms.
    secret (bytes): a shared secret; metadata is then signed with it and peers must hold it.
    net_devices: the network devices UCX may use ("lo", "eth0"). integrity: CRC-32C of every
    piece of data this transport sends as an initiator, checked by the side that receives it.
    notice_queue: how many arrival notices may wait (1024).

    Unavailable (UCX could not start, or libkvx is missing; available is False): write_blocks and
    read_blocks return None, poll returns the empty result, every other method raises
    RuntimeError saying why (add_remote_peer_async: a Future holding it).
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
    ) -> None:
        owned = getattr(self, "_owned", None)  # set by KvxTransport.owned()
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
        self._num_threads = num_threads
        self._agent_name = agent_name
        self._handle: Optional[int] = None
        self._lib = None
        self._closed = False
        self._tls = threading.local()  # each thread's id and completion buffers
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()
        self._close_lock = threading.Lock()
        if _Base is not object and owned is None:
            try:
                super().__init__(view, config_fields=config_fields)
            except Exception:  # the base's own bookkeeping is optional to kvx
                pass
        self._init(deadline_ms, stall_ms, keepalive_ms, secret, net_devices, integrity,
                   notice_queue)
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
        nb, bl = int(num_blocks), int(block_len)
        if nb <= 0 or bl <= 0:
            raise ValueError(f"KvxTransport.owned: num_blocks and block_len must be positive, "
                             f"not {num_blocks} x {block_len}")
        t = cls.__new__(cls)
        t._owned = (nb, bl)
        t.__init__(agent_name, None, **kwargs)
        return t

    @property
    def view(self) -> Optional[memoryview]:
        """The region, num_blocks x block_len bytes (None once closed, or when unavailable
        for an owned region)."""
        return self._view

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
              keepalive_ms: Optional[int], secret, net_devices, integrity, notice_queue) -> None:
        lib = _lib.load()
        if lib is None:
            return  # available stays False, as the NIXL transport does when NIXL is missing
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
        if self._agent_name is not None:
            p.field_mask |= _lib.PARAM_AGENT_NAME
            p.agent_name = str(self._agent_name).encode()
        for name, value, bit in (("deadline_ms", deadline_ms, _lib.PARAM_DEADLINE),
                                 ("stall_ms", stall_ms, _lib.PARAM_STALL),
                                 ("keepalive_ms", keepalive_ms, _lib.PARAM_KEEPALIVE)):
            if value is None:
                continue
            if not 0 <= int(value) <= _lib.MS_MAX:
                raise ValueError(f"KvxTransport: {name} must be 0..{_lib.MS_MAX}, not {value}")
            p.field_mask |= bit
            setattr(p, name, int(value))
        if secret is not None:
            sec = secret.encode() if isinstance(secret, str) else bytes(secret)
            if not 1 <= len(sec) <= 1024:
                raise ValueError("KvxTransport: secret must be 1..1024 bytes")
            p.field_mask |= _lib.PARAM_SECRET
            p.secret = sec
            p.secret_len = len(sec)
        if net_devices is not None:
            p.field_mask |= _lib.PARAM_NET_DEVICES
            p.net_devices = str(net_devices).encode()
        if integrity:
            p.field_mask |= _lib.PARAM_INTEGRITY
            p.integrity = 1
        if notice_queue is not None:
            p.field_mask |= _lib.PARAM_NOTICES
            p.notice_queue = int(notice_queue)
        h = ctypes.c_void_p()
        rc = lib.kvx_transport_create(ctypes.byref(p), ctypes.byref(h))
        if rc == -errno.EINVAL:
            raise ValueError(f"KvxTransport: invalid arguments (agent name {self._agent_name!r}, "
                             f"backends {self._backends}, region {self._num_blocks} x "
                             f"{self._block_len}): {_lib.strerror(rc)}")
        if rc < 0:
            return  # UCX could not start here: available is False
        self._handle = h.value
        self._lib = lib
        if self._region is None:  # owned: the view is of kvx's memory
            a = _lib.TransportAttr()
            a.field_mask = _lib.TRANSPORT_ATTR_REGION
            self._check("owned region", lib.kvx_transport_query(self._handle, ctypes.byref(a)))
            self._base_addr = a.base
            region = (ctypes.c_char * (self._num_blocks * self._block_len)).from_address(a.base)
            # every view keeps the region's array alive, and the array keeps this transport
            # (whose kvx_transport_destroy, in __del__, frees the memory) alive
            region._kvx_owner = self
            self._region = region
            self._view = memoryview(region).cast("B", (self._num_blocks, self._block_len))

    # ---- properties ------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self._handle is not None and not self._closed

    @property
    def base_addr(self) -> int:
        return self._base_addr

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_len(self) -> int:
        return self._block_len

    @property
    def config_fingerprint(self) -> str:
        return self._config_fingerprint

    def _h(self) -> int:
        if self._closed:
            raise _closed_error()
        if self._handle is None:
            raise RuntimeError("KvxTransport is not available: " +
                               (_lib.load_error() or "UCX could not start"))
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
        that id, up to 2 s more for the old one to close); adds and removes of one id take effect
        in the order they were called."""
        h = self._h()
        md = bytes(agent_metadata)
        pp = _lib.PeerParams(_lib.PEER_PARAM_EXPECT_REGION, int(base_addr) & (2**64 - 1),
                             int(num_blocks) & (2**64 - 1), int(block_len) & (2**64 - 1))
        rc = self._lib.kvx_peer_add(h, str(peer_id).encode(), md, len(md), ctypes.byref(pp))
        if rc == 0:
            return
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        if -rc in _VALUE_ERRORS:
            raise ValueError(f"add_remote_peer({peer_id!r}): {_lib.strerror(rc)}")
        raise PeerUnreachableError(-rc, f"add_remote_peer({peer_id!r}): {_lib.strerror(rc)}")

    def listen(self, addr: str) -> str:
        """Listen for peers that pair by address (connect) at "host:port" (port 0: any), on
        UCX's connection manager; binds only there. Returns the address bound, with its port.
        A connecting transport receives this one's metadata (only after proving the shared
        secret, if one is set). KvxError if the address is bad, taken, or already listening."""
        h = self._h()
        self._check("listen", self._lib.kvx_transport_listen(h, str(addr).encode()))
        a = _lib.TransportAttr()
        a.field_mask = _lib.TRANSPORT_ATTR_LISTEN
        self._check("listen", self._lib.kvx_transport_query(h, ctypes.byref(a)))
        return a.listen_addr.decode()

    def connect(self, peer_id: str, addr: str) -> None:
        """Pair with the transport listening at addr and call it peer_id: its metadata comes
        over UCX's connection manager, then the peer is added as add_remote_peer does (the same
        checks: ValueError when incompatible, refused, or stale; PeerUnreachableError when
        nothing answers there, or not within 2 s). Such a peer heals: when its connection fails,
        kvx pairs with the address again by itself (peer_info's state is "reconnecting"
        meanwhile, and transfers submitted then wait, within their deadlines), and
        poll_peer_events() tells what happened."""
        h = self._h()
        rc = self._lib.kvx_peer_connect(h, str(peer_id).encode(), str(addr).encode(), None)
        if rc == 0:
            return
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        if -rc in _VALUE_ERRORS:
            raise ValueError(f"connect({peer_id!r}, {addr!r}): {_lib.strerror(rc)}")
        raise PeerUnreachableError(-rc, f"connect({peer_id!r}, {addr!r}): {_lib.strerror(rc)}")

    def add_remote_peer_async(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                              num_blocks: int, block_len: int) -> concurrent.futures.Future:
        """add_remote_peer on a worker thread of this transport: returns a
        concurrent.futures.Future whose result() is None or raises what add_remote_peer would.
        Other calls, and adds of other ids, go on meanwhile; adds and removes of one id take
        effect in call order. After close() the future raises RuntimeError("closed")."""
        if self._handle is None or self._closed:
            f: concurrent.futures.Future = concurrent.futures.Future()
            try:
                self._h()
            except RuntimeError as e:
                f.set_exception(e)
            return f
        with self._executor_lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="kvx-add-peer")
            try:
                return self._executor.submit(self.add_remote_peer, peer_id, agent_metadata,
                                             base_addr, num_blocks, block_len)
            except RuntimeError:  # the executor was shut down by close()
                f = concurrent.futures.Future()
                f.set_exception(_closed_error())
                return f

    def remove_remote_peer(self, peer_id: str) -> None:
        """Release the peer's connection and purge its transfers: their ids never come out of
        poll (finished ones not yet polled included), as the seed's transport does; cancel
        them first to learn their fate. Bytes of a purged transfer may still be moving until
        the connection has closed (a purged read's local blocks, a purged write's remote
        blocks). Unknown peer: nothing happens. Other calls go on meanwhile."""
        h = self._h()
        self._check("remove_remote_peer",
                    self._lib.kvx_peer_remove_ex(h, str(peer_id).encode(), _lib.PEER_REMOVE_PURGE))

    def peer_info(self, peer_id: str) -> Optional[dict]:
        """Transport in use, state and counters of a peer; None if unknown."""
        h = self._h()
        a = _lib.PeerAttr()
        a.field_mask = _lib.PEER_ATTR_ALL
        rc = self._lib.kvx_peer_query(h, str(peer_id).encode(), ctypes.byref(a))
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()
        if rc < 0:
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
                notify=False) -> Optional[int]:
        h = self._handle
        if h is None or self._closed:
            if self._closed:
                raise _closed_error()
            return None  # unavailable
        loc = _index_array(local_idxs)
        rem = _index_array(remote_idxs)
        if loc is None or rem is None or loc[1] != rem[1]:
            return None
        params = None
        if deadline_ms is not None or tag is not None or notify:
            xp = _lib.XferParams()
            try:
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
        if rc == -errno.ESHUTDOWN:
            raise _closed_error()  # close() overlapped this call
        return None if rc < 0 else idp.value

    def write_blocks(self, peer_id: str, local_idxs, remote_idxs,
                     deadline_ms: Optional[int] = None, tag: Optional[int] = None,
                     notify: bool = False) -> Optional[int]:
        """Submit a write of local_idxs[i] into the peer's remote_idxs[i]. Returns a transfer id
        that poll() reports once, or None when the peer is unknown or failed, the lists differ
        in length, an index is out of range, deadline_ms is out of 0..10**12, submission fails,
        or the transport is unavailable. Never blocks, never raises for a dead peer.
        tag (0..2**64-1): seen by the receiver in notices, and what it may fence by. notify: the
        receiver gets an arrival notice (poll_notices) once all of the blocks landed, and only
        then does the write complete here."""
        return self._submit(True, peer_id, local_idxs, remote_idxs, deadline_ms, tag, notify)

    def read_blocks(self, peer_id: str, local_idxs, remote_idxs,
                    deadline_ms: Optional[int] = None) -> Optional[int]:
        """Submit a read of the peer's remote_idxs[i] into local_idxs[i]; as write_blocks."""
        return self._submit(False, peer_id, local_idxs, remote_idxs, deadline_ms)

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        """Drive progress; return the ids that finished since the last poll, each once, as
        PollResult(done, failed) of two tuples. With a peer_id, only that peer's transfers,
        leaving the others' for their own polls; None takes them all (shutdown drain). Each id
        is returned to exactly one caller, whichever thread polls."""
        h = self._handle
        if h is None or self._closed:
            if self._closed:
                raise _closed_error()
            return _EMPTY_POLL_RESULT  # unavailable
        pid = None if peer_id is None else str(peer_id).encode()
        try:
            comps = self._tls.comps
        except AttributeError:
            comps = self._buffers()[1]
        done = failed = None
        while True:
            n = self._lib.kvx_transport_poll(h, pid, comps, _POLL_BATCH)
            if n <= 0:
                if n < 0:
                    self._check("poll", n)
                break
            for i in range(n):
                c = comps[i]
                if c.status == 0:
                    if done is None:
                        done = []
                    done.append(c.id)
                else:
                    if failed is None:
                        failed = []
                    failed.append(c.id)
            if n < _POLL_BATCH:
                break
        if done is None and failed is None:
            return _EMPTY_POLL_RESULT
        return PollResult(done=tuple(done) if done is not None else (),
                          failed=tuple(failed) if failed is not None else ())

    def fence(self, writer: Optional[str] = None, tags: Optional[Iterable[int]] = None) -> int:
        """Fence writes into this region: when this returns, no byte of any write that writer
        (a peer id of this transport, or the writer's agent name; None: every writer) submitted
        before the call lands here any more; with tags, only writes carrying one of them. The
        writer's fenced transfers fail (a failed id in its poll) and it need not re-add anything:
        writes it submits once it heard of the fence land (kvx tells it at once; one submitted
        before that fails too and may simply be submitted again). Returns the number of the
        writer's connections fenced (0: it never connected). Never waits on the network."""
        h = self._h()
        name = None
        if writer is not None:
            info = self.peer_info(writer)
            name = (info["agent_name"] if info else str(writer)).encode()
        if name is not None and not 1 <= len(name) <= 63:
            raise ValueError(f"fence: a writer name is 1..63 bytes, not {writer!r}")
        tl = [] if tags is None else [int(x) for x in tags]
        if len(tl) > _lib.FENCE_TAGS_MAX or any(not 0 <= x < 2**64 for x in tl):
            raise ValueError(f"fence: at most {_lib.FENCE_TAGS_MAX} tags of 0..2**64-1")
        arr = (ctypes.c_uint64 * len(tl))(*tl) if tl else None
        return self._check("fence", self._lib.kvx_fence(h, name, arr, len(tl)))

    def poll_notices(self) -> tuple:
        """The arrival notices waiting (Notice(writer, tag, blocks, bytes)), oldest first, each
        once; the shared empty tuple when there is none. A notice comes only after every block
        of its write landed, never for a write that failed or was fenced."""
        h = self._handle
        if h is None or self._closed:
            if self._closed:
                raise _closed_error()
            return ()
        try:
            buf = self._tls.notices
        except AttributeError:
            buf = self._tls.notices = (_lib.Notice * _NOTICE_BATCH)()
        out = None
        while True:
            n = self._check("poll_notices", self._lib.kvx_notice_poll(h, buf, _NOTICE_BATCH))
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
        h = self._h()
        buf = (_lib.PeerEvent * 64)()
        out = []
        while True:
            n = self._check("poll_peer_events", self._lib.kvx_peer_event_poll(h, buf, 64))
            out.extend({"peer_id": e.peer_id.decode(), "event": _lib.PEER_EVENTS.get(e.type, str(e.type)),
                        "error": e.error, "generation": e.generation} for e in buf[:n])
            if n < 64:
                return out

    def counters(self) -> dict:
        """What peers did to this transport's region, and what kvx refused them: bytes_landed,
        writes_landed, bytes_served, notices, drop_malformed, drop_capability, drop_unknown,
        drop_range, drop_fenced, drop_crc, drop_other, conns_overflow, conns_evicted,
        drop_unproven, drop_hello_limit (docs/security.md, "Resource bounds")."""
        h = self._h()
        a = _lib.TransportAttr()
        a.field_mask = _lib.TRANSPORT_ATTR_RECV
        self._check("counters", self._lib.kvx_transport_query(h, ctypes.byref(a)))
        return {name: getattr(a.recv, name) for name in _lib.RECV_COUNTERS}

    def wait(self, peer_id: Optional[str] = None, timeout: Optional[float] = None) -> bool:
        """Sleep until poll(peer_id) has something to return (True) or timeout seconds pass
        (False), driving progress meanwhile. close() from another thread ends the wait with
        RuntimeError("KvxTransport is closed")."""
        h = self._h()
        ms = -1 if timeout is None else min(max(0, int(timeout * 1000)), 2**31 - 1)
        pid = None if peer_id is None else str(peer_id).encode()
        return self._check("wait", self._lib.kvx_transport_wait(h, pid, ms)) > 0

    def cancel(self, transfer_ids: Iterable[int], mode: str = "immediate") -> list:
        """Best effort. "immediate": stop tracking the ids now (they never come out of poll);
        returns []. "wait": returns the ids whose bytes may still be moving; each comes out of a
        later poll as failed (canceled) and only then may its blocks be reused. Unknown or
        finished ids are ignored."""
        if mode not in ("immediate", "wait"):
            raise ValueError(f"cancel mode must be 'immediate' or 'wait', not {mode!r}")
        h = self._h()
        ids = array("Q", [int(i) for i in transfer_ids if 0 <= int(i) < 2**64])
        n = len(ids)
        if n == 0:
            return []
        buf = (ctypes.c_uint64 * n).from_buffer(ids)
        pending = (ctypes.c_uint64 * n)()
        rc = self._check("cancel", self._lib.kvx_xfer_cancel(
            h, buf, n, _lib.CANCEL_WAIT if mode == "wait" else _lib.CANCEL_IMMEDIATE, pending))
        return list(pending[:rc])

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Fail and release everything, remove all peers, deregister the region. Idempotent.
        Any later call raises RuntimeError; calls other threads are making meanwhile end as
        the class docstring says. When it returns, kvx no longer touches the region."""
        with self._close_lock:  # a second close() returns once the first has finished
            if self._closed:
                return
            self._closed = True
            with self._executor_lock:
                if self._executor is not None:
                    # adds still queued run and raise "closed"
                    self._executor.shutdown(wait=False)
            if self._handle is not None:
                # The handle itself is freed only when this object is (__del__): another thread
                # may still be about to pass it to libkvx, which then answers -ESHUTDOWN.
                self._lib.kvx_transport_close(self._handle)
            # drop our hold on the caller's buffer, so that it can be released (an mmap closed)
            self._region = None
            self._view = None

    def __del__(self):
        try:
            self.close()
            if self._handle is not None:
                self._lib.kvx_transport_destroy(self._handle)
                self._handle = None
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
