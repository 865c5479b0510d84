"""kvx: move KV-cache blocks between serving engines over UCX (ctypes binding of libkvx).

Two engines in one process, for the shape of it (each is usually a process of its own, and the
metadata travels over the engines' own channel):

    import mmap
    from kvx import KvxTransport
    num_blocks, block_len = 16, 4096
    regions = [mmap.mmap(-1, num_blocks * block_len) for _ in range(2)]
    a, b = (KvxTransport(name, memoryview(r).cast("B", (num_blocks, block_len)))
            for name, r in zip(("engine-a", "engine-b"), regions))
    b.add_remote_peer("a", a.get_agent_metadata(), a.base_addr, a.num_blocks, a.block_len)
    regions[1][:block_len] = b"x" * block_len
    tid = b.write_blocks("a", [0], [5])           # b's block 0 into a's block 5
    r = b.poll("a")
    while not r.done and not r.failed:            # done or failed: each id comes out once
        b.wait("a", timeout=5.0)
        r = b.poll("a")
    assert r.done == (tid,), b.failure(tid)
    assert regions[0][5 * block_len:6 * block_len] == b"x" * block_len
    b.close()
    a.close()

libkvx is looked up in $KVX_LIBRARY, the build tree of a source checkout, the install prefix,
then the dynamic linker's path. kvx.vllm_plugin makes vLLM's P2P tier use KvxTransport.

The transport names are imported on first use, so that importing kvx.vllm_plugin (as vLLM's
plugin loader does in every vLLM process) imports nothing of vLLM.
"""

from ._lib import EFENCED, EINCOMPAT, PRIO_HIGH, PRIO_LOW, PRIO_NORMAL
from ._lib import load as _load

_TRANSPORT_NAMES = ("KvxTransport", "PollResult", "Notice", "Failure", "KvxError",
                    "PeerUnreachableError", "config_fingerprint", "FAILURES_KEPT")

# regions and ranges (kvx.regions; KvxTransport's register_region, write_ranges, ...)
_REGION_NAMES = ("Range", "range_dtype", "RANGE_FIELDS", "REGION_READ", "REGION_WRITE",
                 "REGION_MAIN")

#: This package's version: libkvx's it is made for (kvx_version(), CMake's project version).
__version__ = "0.1.0"

__all__ = list(_TRANSPORT_NAMES) + list(_REGION_NAMES) + ["version", "EFENCED", "EINCOMPAT", "PRIO_LOW", "PRIO_NORMAL",
                                    "PRIO_HIGH"]


def __getattr__(name):
    if name in _TRANSPORT_NAMES or name == "transport":
        import importlib
        transport = importlib.import_module(".transport", __name__)
        return transport if name == "transport" else getattr(transport, name)
    if name in _REGION_NAMES or name == "regions":
        import importlib
        regions = importlib.import_module(".regions", __name__)
        return regions if name == "regions" else getattr(regions, name)
    raise AttributeError(f"module 'kvx' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TRANSPORT_NAMES) | set(_REGION_NAMES))


def version() -> str:
    """Version of the loaded libkvx, or "" when it cannot be loaded."""
    lib = _load()
    return lib.kvx_version().decode() if lib else ""
