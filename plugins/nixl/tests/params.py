"""The KVX backend's parameters through NIXL's Python API: each value kvx would not take
(a number that is not one, an unknown rndv_mode or thread_mode) makes create_backend fail with
the agent left without a KVX backend, and a second create_backend with valid values then
succeeds (so nothing of the refused one stayed behind)."""

import sys

import nixl

BAD = [{"deadline_ms": "soon"}, {"stall_ms": "-1x"}, {"rndv_mode": "sometimes"},
       {"thread_mode": "sometimes"}, {"thread_mode": ""}]

a = nixl.nixl_agent("kvx-params", nixl.nixl_agent_config(backends=[]))
for params in BAD:
    try:
        a.create_backend("KVX", params)
    except Exception as e:  # NIXL raises its own error types for a backend that failed
        print(f"params {params}: refused ({type(e).__name__})")
    else:
        sys.exit(f"params {params}: accepted")
    if "KVX" in a.backends:
        sys.exit(f"params {params}: refused, but the agent holds a KVX backend")
a.create_backend("KVX", {"thread_mode": "yields", "rndv_mode": "eager", "deadline_ms": "1000"})
if "KVX" not in a.backends:
    sys.exit("valid parameters: no KVX backend")
print(f"params: {len(BAD)} refused, then valid ones taken: PASS")
