"""ctypes declarations of libkvx (include/kvx.h) and how the library is found."""

import ctypes
import ctypes.util
import os

c_uint64_p = ctypes.POINTER(ctypes.c_uint64)
c_uint32_p = ctypes.POINTER(ctypes.c_uint32)

# field-mask bits, as in kvx.h
PARAM_REGION = 1 << 0
PARAM_AGENT_NAME = 1 << 1
PARAM_FINGERPRINT = 1 << 2
PARAM_BACKENDS = 1 << 3
PARAM_NUM_THREADS = 1 << 4
PARAM_DEADLINE = 1 << 5
PARAM_KEEPALIVE = 1 << 6
PARAM_LOG = 1 << 7
PARAM_STALL = 1 << 8
PARAM_SECRET = 1 << 9
PARAM_NET_DEVICES = 1 << 10
PARAM_INTEGRITY = 1 << 11
PARAM_NOTICES = 1 << 12
PARAM_OWN_REGION = 1 << 13
PARAM_RNDV = 1 << 14
PARAM_THREAD_MODE = 1 << 15
RNDV_MODES = {"auto": 0, "eager": 1, "always": 2}  # kvx_rndv_mode
THREAD_MODES = {"yields": 0, "drives": 1}  # kvx_thread_mode
MS_MAX = 10**12
PEER_REMOVE_PURGE = 1 << 0
PEER_PARAM_EXPECT_REGION = 1 << 0
PEER_PARAM_FLAGS = 1 << 1
PEER_ADD_PURGE = 1 << 0
PEER_ATTR_AGENT_NAME = 1 << 0
PEER_ATTR_TRANSPORT = 1 << 1
PEER_ATTR_STATE = 1 << 2
PEER_ATTR_REGION = 1 << 3
PEER_ATTR_COUNTERS = 1 << 4
PEER_ATTR_RECV = 1 << 5
PEER_ATTR_GENERATION = 1 << 6
PEER_ATTR_ALL = (1 << 7) - 1
TRANSPORT_ATTR_REGION = 1 << 2
TRANSPORT_ATTR_RECV = 1 << 8
TRANSPORT_ATTR_LISTEN = 1 << 9
TRANSPORT_ATTR_MAPS_REFUSED = 1 << 10
TRANSPORT_ATTR_REGIONS = 1 << 11
TRANSPORT_ATTR_THREAD = 1 << 12
# regions and ranges (kvx.h, "Regions and ranges")
REGION_MAIN = 1
REGION_WRITE = 1 << 0
REGION_READ = 1 << 1
REGION_PARAM_ACCESS = 1 << 0
REGION_BLOB_MAX = 256
REGIONS_MAX = 1 << 20
RANGES_MAX = 2**32 - 1  # kvx_xfer_write_ranges: count at most 2^32 - 1
ADDR_MAX = 96
XFER_PARAM_DEADLINE = 1 << 0
XFER_PARAM_TAG = 1 << 1
XFER_PARAM_FLAGS = 1 << 2
XFER_PARAM_PRIORITY = 1 << 3
# enum kvx_priority
PRIO_LOW = 0
PRIO_NORMAL = 1
PRIO_HIGH = 2
PRIO_NAMES = {"low": PRIO_LOW, "normal": PRIO_NORMAL, "high": PRIO_HIGH}
XFER_NOTIFY = 1 << 0
EFENCED = 1000 + 2
FENCE_TAGS_MAX = 16
FENCE_RETIRE = 1 << 0
CANCEL_IMMEDIATE = 0
CANCEL_WAIT = 1
COMPLETION_READ = 1

NAME_MAX = 63
FINGERPRINT_MAX = 64
TRANSPORT_NAME_MAX = 64
ERRNO_OFFSET = 1000
EINCOMPAT = ERRNO_OFFSET + 1
# kvx_peer_state_t; 4 (KVX_PEER_WIRING): added, its handshake not answered yet
PEER_STATES = {0: "connected", 1: "failed", 2: "removed", 3: "reconnecting", 4: "wiring"}
PEER_EVENTS = {1: "down", 2: "restarted", 3: "reconnected"}
PEER_ID_MAX = 255
SECRET_MAX = 1024
NOTICES_MAX = 1 << 20
NET_DEVICES_MAX = 255  # kvx_params_t.net_devices, without the NUL
BLOCKS_MAX = 2**32 - 1  # indices are 32-bit

LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class Params(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("base", ctypes.c_void_p),
        ("num_blocks", ctypes.c_uint64),
        ("block_len", ctypes.c_uint64),
        ("agent_name", ctypes.c_char_p),
        ("fingerprint", ctypes.c_char_p),
        ("backends", ctypes.POINTER(ctypes.c_char_p)),
        ("num_backends", ctypes.c_size_t),
        ("num_threads", ctypes.c_uint),
        ("deadline_ms", ctypes.c_uint64),
        ("keepalive_ms", ctypes.c_uint64),
        ("log_fn", LOG_FN),
        ("log_arg", ctypes.c_void_p),
        ("log_level", ctypes.c_int),
        ("stall_ms", ctypes.c_uint64),
        ("secret", ctypes.c_char_p),
        ("secret_len", ctypes.c_size_t),
        ("net_devices", ctypes.c_char_p),
        ("integrity", ctypes.c_int),
        ("notice_queue", ctypes.c_size_t),
        ("rndv_mode", ctypes.c_int),
        ("rndv_thresh", ctypes.c_uint64),
        ("thread_mode", ctypes.c_int),
    ]


RECV_COUNTERS = ("bytes_landed", "writes_landed", "bytes_served", "notices", "drop_malformed",
                 "drop_capability", "drop_unknown", "drop_range", "drop_fenced", "drop_crc",
                 "drop_other", "conns_overflow", "conns_evicted", "drop_unproven",
                 "drop_hello_limit", "drop_replayed", "rndv_landed", "rndv_failed",
                 "rndv_served", "catchup_over")


class RecvCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in RECV_COUNTERS]


REGION_COUNTERS = ("registered", "registrations", "drop_region", "drop_region_capability",
                   "drop_access", "dereg_closed")


class RegionCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in REGION_COUNTERS]


class RegionParams(ctypes.Structure):
    _fields_ = [("field_mask", ctypes.c_uint64), ("access", ctypes.c_uint)]


class Range(ctypes.Structure):
    """kvx_range_t: 32 bytes."""

    _fields_ = [
        ("local_region", ctypes.c_uint32),
        ("remote_region", ctypes.c_uint32),
        ("local_offset", ctypes.c_uint64),
        ("remote_offset", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
    ]


class TransportAttr(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("agent_name", ctypes.c_char * (NAME_MAX + 1)),
        ("fingerprint", ctypes.c_char * (FINGERPRINT_MAX + 1)),
        ("base", ctypes.c_void_p),
        ("num_blocks", ctypes.c_uint64),
        ("block_len", ctypes.c_uint64),
        ("num_threads", ctypes.c_uint),
        ("deadline_ms", ctypes.c_uint64),
        ("metadata_len", ctypes.c_size_t),
        ("num_peers", ctypes.c_size_t),
        ("stall_ms", ctypes.c_uint64),
        ("recv", RecvCounters),
        ("listen_addr", ctypes.c_char * ADDR_MAX),
        ("maps_refused", ctypes.c_uint64),
        ("regions", RegionCounters),
        ("thread_mode", ctypes.c_int),
        ("thread_asides", ctypes.c_uint64),
    ]


class Notice(ctypes.Structure):
    _fields_ = [
        ("writer", ctypes.c_char * (NAME_MAX + 1)),
        ("tag", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("status", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
    ]


class PeerEvent(ctypes.Structure):
    _fields_ = [
        ("peer_id", ctypes.c_char * (PEER_ID_MAX + 1)),
        ("type", ctypes.c_int),
        ("error", ctypes.c_int),
        ("generation", ctypes.c_uint64),
    ]


class PeerParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("base_addr", ctypes.c_uint64),
        ("num_blocks", ctypes.c_uint64),
        ("block_len", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
    ]


class PeerAttr(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("agent_name", ctypes.c_char * (NAME_MAX + 1)),
        ("transport", ctypes.c_char * TRANSPORT_NAME_MAX),
        ("rma_hw", ctypes.c_int),
        ("state", ctypes.c_int),
        ("error", ctypes.c_int),
        ("remote_base", ctypes.c_uint64),
        ("remote_num_blocks", ctypes.c_uint64),
        ("block_len", ctypes.c_uint64),
        ("bytes_written", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("xfers_done", ctypes.c_uint64),
        ("xfers_failed", ctypes.c_uint64),
        ("xfers_inflight", ctypes.c_uint64),
        ("latency_sum_ns", ctypes.c_uint64),
        ("latency_max_ns", ctypes.c_uint64),
        ("recv", RecvCounters),
        ("generation", ctypes.c_uint64),
    ]


class XferParams(ctypes.Structure):
    _fields_ = [("field_mask", ctypes.c_uint64), ("deadline_ms", ctypes.c_uint64),
                ("tag", ctypes.c_uint64), ("flags", ctypes.c_uint32),
                ("priority", ctypes.c_uint32)]


class Completion(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("status", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
    ]


def _candidates():
    env = os.environ.get("KVX_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    # the build tree of a source checkout (python/kvx -> build/)
    for build in ("build", "build-asan"):
        yield os.path.join(root, build, "libkvx.so")
    # an install prefix next to this package (<prefix>/lib/python3/dist-packages/kvx)
    for up in (3, 4):
        prefix = here
        for _ in range(up):
            prefix = os.path.dirname(prefix)
        yield os.path.join(prefix, "libkvx.so")
        yield os.path.join(prefix, "lib", "libkvx.so")
    found = ctypes.util.find_library("kvx")
    if found:
        yield found
    yield "libkvx.so.0"


_lib = None
_load_error = None


def load():
    """The loaded libkvx, or None (see load_error()) when it cannot be found or loaded."""
    global _lib, _load_error
    if _lib is not None or _load_error is not None:
        return _lib
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        _declare(lib)
        _lib = lib
        return lib
    _load_error = "libkvx not found (set KVX_LIBRARY): " + "; ".join(errors or ["no candidate"])
    return None


def load_error():
    return _load_error


def _declare(lib):
    t = ctypes.c_void_p
    sig = {
        "kvx_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "kvx_version": (ctypes.c_char_p, []),
        "kvx_transport_create": (ctypes.c_int, [ctypes.POINTER(Params), ctypes.POINTER(t)]),
        "kvx_transport_close": (ctypes.c_int, [t]),
        "kvx_transport_destroy": (None, [t]),
        "kvx_transport_metadata": (ctypes.c_int, [t, ctypes.c_void_p,
                                                  ctypes.POINTER(ctypes.c_size_t)]),
        "kvx_peer_add": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                        ctypes.POINTER(PeerParams)]),
        "kvx_peer_connect": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.POINTER(PeerParams)]),
        "kvx_transport_listen": (ctypes.c_int, [t, ctypes.c_char_p]),
        "kvx_peer_remove": (ctypes.c_int, [t, ctypes.c_char_p]),
        "kvx_peer_remove_ex": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_uint]),
        "kvx_peer_query": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.POINTER(PeerAttr)]),
        "kvx_xfer_write": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_size_t, ctypes.POINTER(XferParams),
                                          c_uint64_p]),
        "kvx_xfer_read": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_size_t, ctypes.POINTER(XferParams),
                                         c_uint64_p]),
        "kvx_transport_poll": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.POINTER(Completion),
                                              ctypes.c_size_t]),
        "kvx_transport_wait": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_int]),
        "kvx_xfer_cancel": (ctypes.c_int, [t, c_uint64_p, ctypes.c_size_t, ctypes.c_int,
                                           c_uint64_p]),
        "kvx_transport_query": (ctypes.c_int, [t, ctypes.POINTER(TransportAttr)]),
        "kvx_fence": (ctypes.c_int, [t, ctypes.c_char_p, c_uint64_p, ctypes.c_size_t]),
        "kvx_fence_ex": (ctypes.c_int, [t, ctypes.c_char_p, c_uint64_p, ctypes.c_size_t,
                                        ctypes.c_uint]),
        "kvx_notice_poll": (ctypes.c_int, [t, ctypes.POINTER(Notice), ctypes.c_size_t]),
        "kvx_peer_event_poll": (ctypes.c_int, [t, ctypes.POINTER(PeerEvent), ctypes.c_size_t]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    # the region calls: a libkvx without them still loads (the region methods then say so)
    rp = ctypes.POINTER(Range)
    for name, (res, args) in {
        "kvx_region_register": (ctypes.c_int, [t, ctypes.c_void_p, ctypes.c_uint64,
                                               ctypes.POINTER(RegionParams), c_uint32_p]),
        "kvx_region_deregister": (ctypes.c_int, [t, ctypes.c_uint32]),
        "kvx_region_blob": (ctypes.c_int, [t, ctypes.c_uint32, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_size_t)]),
        "kvx_region_load": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                           c_uint32_p]),
        "kvx_region_unload": (ctypes.c_int, [t, ctypes.c_char_p, ctypes.c_uint32]),
        "kvx_xfer_write_ranges": (ctypes.c_int, [t, ctypes.c_char_p, rp, ctypes.c_size_t,
                                                 ctypes.POINTER(XferParams), c_uint64_p]),
        "kvx_xfer_read_ranges": (ctypes.c_int, [t, ctypes.c_char_p, rp, ctypes.c_size_t,
                                                ctypes.POINTER(XferParams), c_uint64_p]),
    }.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = res
            f.argtypes = args


KVX_ERRNO_NAMES = {EINCOMPAT: "KVX_EINCOMPAT", EFENCED: "KVX_EFENCED"}


def errno_name(rc):
    """"ETIMEDOUT", "KVX_EFENCED", ... for a negative errno (or its positive value)."""
    import errno
    code = abs(int(rc))
    return KVX_ERRNO_NAMES.get(code) or errno.errorcode.get(code) or f"E{code}"


def strerror(rc):
    lib = load()
    return lib.kvx_strerror(rc).decode() if lib else f"error {rc}"
