"""kvx: move KV-cache blocks between serving engines over UCX (ctypes binding of libkvx).

    from kvx import KvxTransport
    t = KvxTransport("engine-a", memoryview(region).cast("B", (num_blocks, block_len)))
    peer.add_remote_peer("a", t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len)

libkvx is looked up in $KVX_LIBRARY, the build tree of a source checkout, the install prefix,
then the dynamic linker's path.
"""

from ._lib import load as _load
from ._lib import EFENCED
from ._lib import EINCOMPAT
from .transport import (FAILURES_KEPT, Failure, KvxError, KvxTransport, Notice,
                        PeerUnreachableError, PollResult, config_fingerprint)

__all__ = ["KvxTransport", "PollResult", "Notice", "Failure", "KvxError", "PeerUnreachableError",
           "config_fingerprint", "version", "EFENCED", "EINCOMPAT", "FAILURES_KEPT"]


def version() -> str:
    """Version of the loaded libkvx, or "" when it cannot be loaded."""
    lib = _load()
    return lib.kvx_version().decode() if lib else ""
