"""Statistics of kvx transports (kvx_stats_query) and their Prometheus export.

    from prometheus_client import REGISTRY
    from kvx.metrics import KvxCollector
    REGISTRY.register(KvxCollector(t1, t2))   # every transport of the process in one collector:
                                              # vLLM's /metrics then shows kvx's metrics
or, where transports are made in different places, each joins the registry's one collector:

    kvx.metrics.register(t)                   # REGISTRY's kvx collector, made on first use

prometheus_client (Debian's python3-prometheus-client) is needed only by KvxCollector.collect's
caller; importing this module does not require it. Metric names follow Prometheus conventions:
counters end in _total, durations are in seconds and sizes in bytes, and labels say which
transport (agent), peer, op, status or cause.
"""

import ctypes
import threading
import weakref
from typing import Optional

from . import _lib

STATUS_CLASSES = ("ok", "timeout", "connreset", "connaborted", "canceled", "fenced", "badmsg",
                  "nospc", "inval", "busy", "proto", "other")  # kvx_status_class_t, in order
OPS = ("write", "read")
LATENCY_BUCKETS = 25  # KVX_LATENCY_BUCKETS: bucket i <= 2**i microseconds, the last above
STATS_XFERS, STATS_LATENCY, STATS_EVENTS = 1 << 0, 1 << 1, 1 << 2
TRANSPORT_ATTR_AGENT_NAME = 1 << 0
# kvx_event_kind: what an event fd watches (event_fd's kinds, a mask of these)
EVENT_COMPLETIONS, EVENT_NOTICES, EVENT_PEER_EVENTS = 1 << 0, 1 << 1, 1 << 2
EVENT_ALL = EVENT_COMPLETIONS | EVENT_NOTICES | EVENT_PEER_EVENTS


class Stats(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("xfers", (ctypes.c_uint64 * len(STATUS_CLASSES)) * 2),
        ("bytes", ctypes.c_uint64 * 2),
        ("latency", ctypes.c_uint64 * LATENCY_BUCKETS),
        ("latency_sum_ns", ctypes.c_uint64),
        ("reconnections", ctypes.c_uint64),
        ("fences", ctypes.c_uint64),
    ]


_declared = set()


def _fn(lib, name):
    f = getattr(lib, name)
    if name not in _declared:
        t = ctypes.c_void_p
        f.restype = ctypes.c_int
        f.argtypes = {
            "kvx_stats_query": [t, ctypes.c_char_p, ctypes.POINTER(Stats)],
            "kvx_peer_list": [t, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)],
            "kvx_transport_event_fd": [t, ctypes.POINTER(ctypes.c_int)],
            "kvx_transport_event_fd_ex": [t, ctypes.c_uint, ctypes.POINTER(ctypes.c_int)],
        }[name]
        _declared.add(name)
    return f


def _call(transport, name, *args):
    h = transport._h()  # RuntimeError when closed or unavailable
    return transport._check(name, _fn(transport._lib, name)(h, *args))


def bucket_bounds() -> tuple:
    """The upper bounds (seconds) of the latency buckets, the last one +Inf."""
    return tuple(2**i * 1e-6 for i in range(LATENCY_BUCKETS - 1)) + (float("inf"),)


def stats(transport, peer_id: Optional[str] = None) -> dict:
    """The statistics of one peer, or with peer_id None of the whole transport (every peer it
    ever had): {"xfers": {(op, status): count}, "bytes": {op: bytes of successful transfers},
    "latency": ((upper bound in seconds, count in that bucket), ...), "latency_sum": seconds,
    "reconnections": n, "fences": n}. Counts only grow. Raises KvxError (ENOENT) for an
    unknown peer and RuntimeError once the transport is closed."""
    s = Stats()
    s.field_mask = STATS_XFERS | STATS_LATENCY | STATS_EVENTS
    pid = None if peer_id is None else str(peer_id).encode()
    _call(transport, "kvx_stats_query", pid, ctypes.byref(s))
    return {
        "xfers": {(op, st): s.xfers[i][k] for i, op in enumerate(OPS)
                  for k, st in enumerate(STATUS_CLASSES)},
        "bytes": {op: s.bytes[i] for i, op in enumerate(OPS)},
        "latency": tuple(zip(bucket_bounds(), s.latency)),
        "latency_sum": s.latency_sum_ns / 1e9,
        "reconnections": s.reconnections,
        "fences": s.fences,
    }


def peer_ids(transport) -> list:
    """The ids of the transport's peers (removed ones excepted)."""
    size = ctypes.c_size_t(0)
    h = transport._h()
    f = _fn(transport._lib, "kvx_peer_list")
    while True:
        buf = ctypes.create_string_buffer(max(size.value, 1))
        want = ctypes.c_size_t(len(buf))
        rc = f(h, buf, ctypes.byref(want))
        if rc >= 0:
            return [p.decode() for p in buf.raw[:want.value].split(b"\0")[:-1]]
        if rc != -28:  # ENOSPC: peers were added meanwhile, ask again with the size needed
            transport._check("peer_list", rc)
        size = want


def event_fd(transport, kinds: int = EVENT_ALL) -> int:
    """kvx_transport_event_fd_ex: a descriptor readable while a poll of one of kinds (a mask of
    EVENT_COMPLETIONS: poll(), EVENT_NOTICES: poll_notices(), EVENT_PEER_EVENTS:
    poll_peer_events()) has something to return, whatever waits of the other kinds; the same
    one for the same kinds. kvx owns it (never read, write or close it). ValueError for kinds
    that are not such a mask."""
    if not isinstance(kinds, int) or not 0 < kinds <= EVENT_ALL:
        raise ValueError(f"event_fd: kinds must be a mask of EVENT_* bits, not {kinds!r}")
    fd = ctypes.c_int(-1)
    _call(transport, "kvx_transport_event_fd_ex", kinds, ctypes.byref(fd))
    return fd.value


def _agent(transport) -> str:
    a = _lib.TransportAttr()
    a.field_mask = TRANSPORT_ATTR_AGENT_NAME
    transport._check("query", transport._lib.kvx_transport_query(transport._h(), ctypes.byref(a)))
    return a.agent_name.decode()


class KvxCollector:
    """A prometheus_client collector of kvx transports: register it with a registry
    (prometheus_client.REGISTRY, vLLM's, or your own) and every scrape reads the transports'
    current statistics, each metric family once, with one agent label per transport. One
    collector per registry holds every transport of the process: KvxCollector(t1, t2, ...),
    add(t) as transports come, or register(t), which does that for you. A second KvxCollector
    in the same registry is refused by the registry at register() (ValueError, "Duplicated
    timeseries"), since the Prometheus text format allows one HELP and TYPE per family. A
    closed transport is skipped, and dropped from the collector. Metrics:

      kvx_transfers_total{agent,peer,op,status}       transfers that ended, by final status
      kvx_transfer_bytes_total{agent,peer,op}          bytes of successful transfers
      kvx_transfer_duration_seconds{agent,peer}        submit-to-completion histogram
      kvx_transfers_in_flight{agent,peer}              gauge
      kvx_peer_reconnections_total{agent,peer}         paired again by address
      kvx_fences_total{agent}                          kvx_fence calls that fenced something
      kvx_received_bytes_total{agent}                  bytes peers wrote into the region
      kvx_received_writes_total{agent}                 write messages applied
      kvx_served_bytes_total{agent}                    bytes peers read from the region
      kvx_notices_total{agent}                         arrival notices queued
      kvx_dropped_messages_total{agent,cause}          what the receiving side refused
    """

    def __init__(self, *transports):
        self._lock = threading.Lock()
        self._transports = tuple(transports)  # replaced, never changed: collect() reads it

    def add(self, transport) -> None:
        """Collect this transport's metrics too (once, however often it is added)."""
        with self._lock:
            if not any(t is transport for t in self._transports):
                self._transports += (transport,)

    def remove(self, transport) -> None:
        """Stop collecting this transport's metrics (nothing happens if it was not added)."""
        with self._lock:
            self._transports = tuple(t for t in self._transports if t is not transport)

    @property
    def transports(self) -> tuple:
        """The transports collected, in the order they were added."""
        return self._transports

    def describe(self):
        """The metric families without samples: a registry takes their names at register()
        and refuses a second collector of the same names."""
        return list(_families().values())

    def collect(self):
        """The metric families with every transport's current figures (what a scrape calls)."""
        fam = _families()
        gone = []
        for t in self._transports:
            try:
                agent = _agent(t)
                peers = peer_ids(t)
                rows = []
                for p in peers:
                    try:
                        rows.append((p, stats(t, p), t.peer_info(p)))
                    except Exception:  # noqa: BLE001 - removed between the list and the query
                        continue
                total = stats(t)
                counters = t.counters()
            except RuntimeError:  # closed or unavailable: it will never report again
                if not t.available:
                    gone.append(t)
                continue
            for p, s, info in rows:
                for (op, st), n in s["xfers"].items():
                    if n:
                        fam["xfers"].add_metric((agent, p, op, st), n)
                for op, n in s["bytes"].items():
                    fam["bytes"].add_metric((agent, p, op), n)
                cum, buckets = 0, []
                for bound, n in s["latency"]:
                    cum += n
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
                fam["latency"].add_metric((agent, p), buckets, s["latency_sum"])
                fam["reconnections"].add_metric((agent, p), s["reconnections"])
                if info is not None:
                    fam["inflight"].add_metric((agent, p), info.get("xfers_inflight", 0))
            fam["fences"].add_metric((agent,), total["fences"])
            for name in _RECV_FAMILIES:
                fam[name].add_metric((agent,), counters.get(name, 0))
            for name, n in counters.items():
                if name.startswith("drop_"):
                    fam["drops"].add_metric((agent, name[5:]), n)
        for t in gone:
            self.remove(t)
        yield from fam.values()


# kvx_recv_counters_t fields exported as a family of their own each
_RECV_FAMILIES = ("bytes_landed", "writes_landed", "bytes_served", "notices")


def _families() -> dict:
    """kvx's metric families, empty, in the order a scrape lists them."""
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)
    C = CounterMetricFamily
    return {
        "xfers": C("kvx_transfers", "kvx transfers that ended, by final status",
                   labels=("agent", "peer", "op", "status")),
        "bytes": C("kvx_transfer_bytes", "bytes of successful kvx transfers",
                   labels=("agent", "peer", "op")),
        "latency": HistogramMetricFamily("kvx_transfer_duration_seconds",
                                         "kvx transfers' time from submission to completion",
                                         labels=("agent", "peer")),
        "inflight": GaugeMetricFamily("kvx_transfers_in_flight", "kvx transfers not yet ended",
                                      labels=("agent", "peer")),
        "reconnections": C("kvx_peer_reconnections", "peers paired by address that paired again",
                           labels=("agent", "peer")),
        "fences": C("kvx_fences", "kvx_fence calls that fenced a connection", labels=("agent",)),
        "bytes_landed": C("kvx_received_bytes", "bytes peers wrote into the region",
                          labels=("agent",)),
        "writes_landed": C("kvx_received_writes", "write messages applied to the region",
                           labels=("agent",)),
        "bytes_served": C("kvx_served_bytes", "bytes peers read from the region",
                          labels=("agent",)),
        "notices": C("kvx_notices", "arrival notices queued", labels=("agent",)),
        "drops": C("kvx_dropped_messages", "messages the receiving side refused, by cause",
                   labels=("agent", "cause")),
    }


# each registry's collector made by register(): a transport joins it
_shared: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def register(transport, registry=None) -> KvxCollector:
    """Export transport's metrics in registry (default prometheus_client.REGISTRY), beside
    every other transport registered there: the registry's one KvxCollector is made and
    registered on first use, and each later transport joins it. Returns that collector. A
    registry that already holds a KvxCollector registered by hand refuses this one (ValueError):
    add the transport to that collector instead."""
    if registry is None:
        from prometheus_client import REGISTRY as registry
    with _shared_lock:
        c = _shared.get(registry)
        if c is None:
            c = KvxCollector()
            try:
                registry.register(c)
            except ValueError as e:
                raise ValueError(f"kvx.metrics.register: this registry has kvx's metrics from "
                                 f"another KvxCollector already ({e}); add the transport to "
                                 f"that collector (collector.add(transport))") from None
            _shared[registry] = c
        c.add(transport)
    return c


def unregister(transport, registry=None) -> None:
    """Stop exporting transport's metrics in registry (register()'s); a closed transport goes
    by itself at the next scrape."""
    if registry is None:
        from prometheus_client import REGISTRY as registry
    with _shared_lock:
        c = _shared.get(registry)
    if c is not None:
        c.remove(transport)
