"""kvx: move KV-cache blocks between serving engines over UCX (ctypes binding of libkvx).

    from kvx import KvxTransport
    t = KvxTransport("engine-a", memoryview(region).cast("B", (num_blocks, block_len)))
    peer.add_remote_peer("a", t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len)

libkvx is looked up in $KVX_LIBRARY, the build tree of a source checkout, the install prefix,
then the dynamic linker's path. kvx.vllm_plugin makes vLLM's P2P tier use KvxTransport.

The transport names are imported on first use, so that importing kvx.vllm_plugin (as vLLM's
plugin loader does in every vLLM process) imports nothing of vLLM.
"""

from ._lib import EFENCED, EINCOMPAT, PRIO_HIGH, PRIO_LOW, PRIO_NORMAL
from ._lib import load as _load

_TRANSPORT_NAMES = ("KvxTransport", "PollResult", "Notice", "Failure", "KvxError",
                    "PeerUnreachableError", "config_fingerprint", "FAILURES_KEPT")

__all__ = list(_TRANSPORT_NAMES) + ["version", "EFENCED", "EINCOMPAT", "PRIO_LOW", "PRIO_NORMAL",
                                    "PRIO_HIGH"]


def __getattr__(name):
    if name in _TRANSPORT_NAMES or name == "transport":
        import importlib
        transport = importlib.import_module(".transport", __name__)
        return transport if name == "transport" else getattr(transport, name)
    raise AttributeError(f"module 'kvx' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TRANSPORT_NAMES))


def version() -> str:
    """Version of the loaded libkvx, or "" when it cannot be loaded."""
    lib = _load()
    return lib.kvx_version().decode() if lib else ""
