"""KVX_TEST_RNDV=eager|auto|always (and KVX_TEST_RNDV_THRESH=bytes) in the environment: every
transport the Python tests create, in this process and in the target processes they spawn,
takes that rendezvous choice unless the test chose one itself (the suite runs with the
rendezvous path forced on as well as by default; ctest python_rndv). Not reached: the engine
subprocesses of test_vllm_plugin.py, which start from an environment without KVX_* variables,
and copies into a mapped owned region, which use no messages."""

import os


def apply():
    mode = os.environ.get("KVX_TEST_RNDV")
    if not mode:
        return
    import kvx
    from kvx import transport

    orig = transport.KvxTransport._init
    if getattr(orig, "kvx_test_rndv", False):
        return
    thresh = os.environ.get("KVX_TEST_RNDV_THRESH")

    def _init(self, deadline_ms, stall_ms, keepalive_ms, secret, net_devices, integrity,
              notice_queue, rndv=None, rndv_thresh=None, *rest):
        if rndv is None and rndv_thresh is None:
            rndv, rndv_thresh = mode, (int(thresh, 0) if thresh else None)
        orig(self, deadline_ms, stall_ms, keepalive_ms, secret, net_devices, integrity,
             notice_queue, rndv, rndv_thresh, *rest)

    _init.kvx_test_rndv = True
    transport.KvxTransport._init = _init
    assert kvx.KvxTransport is transport.KvxTransport


def forced():
    """True when the suite runs with every run forced onto the rendezvous path."""
    return os.environ.get("KVX_TEST_RNDV") == "always"
