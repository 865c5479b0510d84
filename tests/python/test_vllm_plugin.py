"""kvx's vLLM plugin, loaded the way vLLM loads plugins.

What is real: kvx's package, installed by pip (`pip install --no-index --target DIR python/`,
with build isolation, through kvx's own build backend) into a directory of its own, so that the
entry point comes from the installed dist-info's entry_points.txt; its discovery through
importlib.metadata.entry_points(group="vllm.general_plugins") and EntryPoint.load(); libkvx,
UCX, and the bytes moved between two transports the stand-in manager constructed.

What stands in for vLLM (written below, not vLLM's code): a package tree shaped like vLLM's
(vllm/envs.py's VLLM_PLUGINS, vllm/plugins/__init__.py's load_general_plugins, and
vllm/v1/kv_offload/tiering/p2p/{manager.py, data/__init__.py, data/base.py, data/nixl.py}),
whose loader does what vLLM's does (every plugin of the group when VLLM_PLUGINS is unset,
those it names otherwise; load each, call each), whose manager module imports NixlTransport
from the data package and constructs it by that name, with NixlTransport's arguments, in
P2PSecondaryTierManager.__init__, and whose NixlTransport is a stub that only records that it
was constructed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIBKVX = os.path.abspath(os.environ.get("KVX_LIBRARY") or os.path.join(ROOT, "build", "libkvx.so"))

FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/envs.py": """
        import os
        def __getattr__(name):
            if name == "VLLM_PLUGINS":  # as vLLM's envs: None when unset, else a list
                v = os.environ.get("VLLM_PLUGINS")
                return None if v is None else v.split(",")
            raise AttributeError(name)
    """,
    "vllm/plugins/__init__.py": """
        import logging
        from importlib.metadata import entry_points
        import vllm.envs as envs
        logger = logging.getLogger(__name__)
        DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
        plugins_loaded = False

        def load_plugins_by_group(group):
            allowed = envs.VLLM_PLUGINS
            found = entry_points(group=group)
            plugins = {}
            for plugin in found:
                if allowed is None or plugin.name in allowed:
                    try:
                        plugins[plugin.name] = plugin.load()
                    except Exception:
                        logger.exception("Failed to load plugin %s", plugin.name)
            return plugins

        def load_general_plugins():
            global plugins_loaded
            if plugins_loaded:
                return
            plugins_loaded = True
            for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
                func()
    """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/kv_offload/__init__.py": "",
    "vllm/v1/kv_offload/tiering/__init__.py": "",
    "vllm/v1/kv_offload/tiering/p2p/__init__.py": "",
    "vllm/v1/kv_offload/tiering/p2p/data/__init__.py": """
        from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport, PollResult
        from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport
    """,
    "vllm/v1/kv_offload/tiering/p2p/data/base.py": """
        import ctypes, hashlib, json
        from abc import ABC, abstractmethod
        from typing import NamedTuple, Sequence

        class PollResult(NamedTuple):
            done: Sequence[int]
            failed: Sequence[int]

        class DataTransport(ABC):
            def __init__(self, view, config_fields=None):
                self._view = view
                self._base_addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
                self._num_blocks = view.shape[0]
                self._block_len = view.shape[1]
                self._config_fingerprint = "" if not config_fields else hashlib.sha256(
                    json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
                    .encode()).hexdigest()[:16]
            for _m in ("get_agent_metadata", "add_remote_peer", "remove_remote_peer",
                       "write_blocks", "poll", "cancel", "close"):
                locals()[_m] = abstractmethod(lambda self, *a, **k: None)
    """,
    "vllm/v1/kv_offload/tiering/p2p/data/nixl.py": """
        from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport
        constructed = []

        class NixlTransport:  # a stub: records its arguments
            def __init__(self, agent_name, view, config_fields=None, backends=None,
                         num_threads=4):
                constructed.append((agent_name, backends, num_threads))
    """,
    "vllm/v1/kv_offload/tiering/p2p/manager.py": """
        import uuid
        from vllm.v1.kv_offload.tiering.p2p.data import DataTransport, NixlTransport

        class P2PSecondaryTierManager:
            def __init__(self, primary_kv_view, backends=None, num_threads=4):
                config_fields = {"model": "stand-in", "block_size": 16}
                self._nixl_agent_name = str(uuid.uuid4())
                self._data: DataTransport = NixlTransport(
                    self._nixl_agent_name,
                    primary_kv_view,
                    config_fields=config_fields,
                    backends=backends,
                    num_threads=int(num_threads),
                )
    """,
}

# Run in a child interpreter with only the installed package (and the stand-in vLLM) on its
# path; prints one JSON line of what it saw.
ENGINE = r"""
import json, logging, mmap, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(name)s %(message)s")
out = {}
if os.environ.get("MANAGER_FIRST"):
    import vllm.v1.kv_offload.tiering.p2p.manager  # imported before the plugins load
import vllm.plugins
vllm.plugins.load_general_plugins()
out["kvx_imported"] = "kvx" in sys.modules
out["transport_imported"] = "kvx.transport" in sys.modules
import vllm.plugins as again
again.plugins_loaded = False
again.load_general_plugins()  # vLLM may load plugins more than once: nothing more happens
from vllm.v1.kv_offload.tiering.p2p import manager
from vllm.v1.kv_offload.tiering.p2p.data import DataTransport, nixl
NB, BL = 32, 4096
regions = [mmap.mmap(-1, NB * BL) for _ in range(2)]
for k, r in enumerate(regions):
    for i in range(NB):
        r[i * BL:(i + 1) * BL] = bytes([(k * 64 + i) & 0xFF]) * BL
views = [memoryview(r).cast("B", (NB, BL)) for r in regions]
m1 = manager.P2PSecondaryTierManager(views[0])
m2 = manager.P2PSecondaryTierManager(views[1], backends=["UCX"], num_threads=1)
t1, t2 = m1._data, m2._data
out["class"] = type(t1).__name__
out["stub_constructed"] = len(nixl.constructed)
if out["class"] != "NixlTransport":
    out["is_data_transport"] = isinstance(t1, DataTransport)
    out["available"] = t1.available and t2.available
    t1.add_remote_peer("m2", t2.get_agent_metadata(), t2.base_addr, t2.num_blocks, t2.block_len)
    tid = t1.write_blocks("m2", [1, 2, 3], [10, 11, 12])
    import time
    end = time.time() + 10
    done = ()
    while tid not in done and time.time() < end:
        done = t1.poll("m2").done
        time.sleep(0.001)
    out["write_done"] = tid in done
    out["bytes_ok"] = all(regions[1][d * BL:(d + 1) * BL] == bytes([s]) * BL
                          for s, d in ((1, 10), (2, 11), (3, 12)))
    # the secret came from KVX_SECRET_FILE: a transport without it is refused
    import kvx
    plain = kvx.KvxTransport("plain", memoryview(bytearray(NB * BL)).cast("B", (NB, BL)),
                             config_fields={"model": "stand-in", "block_size": 16})
    try:
        plain.add_remote_peer("m2", t2.get_agent_metadata(), t2.base_addr, NB, BL)
        out["plain_refused"] = False
    except ValueError:
        out["plain_refused"] = True
    plain.close()
    try:
        manager.P2PSecondaryTierManager(views[0], backends=["MOONCAKE"])
    except ValueError as e:
        out["mooncake"] = str(e)
    t1.close()
    t2.close()
print(json.dumps(out))
"""


def _write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text).lstrip("\n"))


class TestVllmPlugin(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvx-vllm-plugin-")
        cls.site = os.path.join(cls.tmp, "site")
        pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
        if pip.returncode == 0:
            # as a user installs it: pip, offline, build isolation on, kvx's own backend
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                                "--target", cls.site, os.path.join(ROOT, "python")],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            cls.how = "pip"
        else:  # no pip for this interpreter: the same wheel, unpacked as pip would
            sys.path.insert(0, os.path.join(ROOT, "python"))
            import kvx_build
            whl = kvx_build.build_wheel(cls.tmp)
            with zipfile.ZipFile(os.path.join(cls.tmp, whl)) as z:
                z.extractall(cls.site)
            cls.how = "wheel"
        cls.fake = os.path.join(cls.tmp, "fake-vllm")
        _write_tree(cls.fake, FAKE_VLLM)
        cls.secret = os.path.join(cls.tmp, "secret")
        with open(cls.secret, "wb") as f:
            f.write(os.urandom(32))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_engine(self, env_extra, with_vllm=True, script=ENGINE):
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VLLM_PLUGINS") and not k.startswith("KVX_")}
        env["PYTHONPATH"] = os.pathsep.join([self.site] + ([self.fake] if with_vllm else []))
        env["KVX_LIBRARY"] = LIBKVX
        env["KVX_SECRET_FILE"] = self.secret
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(env_extra)
        env = {k: v for k, v in env.items() if v is not None}
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=120, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        logs = [line for line in r.stderr.splitlines() if line.startswith("LOG vllm.kvx")]
        return json.loads(r.stdout.strip().splitlines()[-1]), logs

    def test_the_entry_point_is_installed(self):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import json
            from importlib.metadata import entry_points
            eps = entry_points(group="vllm.general_plugins")
            print(json.dumps([(e.name, e.value, e.dist.name) for e in eps]))
        """)], env={**os.environ, "PYTHONPATH": self.site}, capture_output=True, text=True)
        self.assertEqual(json.loads(r.stdout), [["kvx", "kvx.vllm_plugin:register", "kvx"]],
                         r.stderr)

    def check_swapped(self, out, logs):
        self.assertEqual(out["class"], "VllmKvxTransport", out)
        self.assertEqual(out["stub_constructed"], 0)
        self.assertTrue(out["is_data_transport"])
        self.assertTrue(out["available"])
        self.assertTrue(out["write_done"] and out["bytes_ok"], out)
        self.assertTrue(out["plain_refused"], "KVX_SECRET_FILE was not taken")
        self.assertIn("'MOONCAKE' not supported", out["mooncake"])
        swaps = [line for line in logs if "in place of NixlTransport" in line]
        self.assertEqual(len(swaps), 1, logs)

    def test_selected(self):
        out, logs = self.run_engine({"VLLM_PLUGINS": "kvx"})
        self.check_swapped(out, logs)
        # loading the plugin imported nothing of the transport (nor of vLLM's P2P tier)
        self.assertTrue(out["kvx_imported"])
        self.assertFalse(out["transport_imported"])

    def test_selected_among_others_after_the_manager_was_imported(self):
        out, logs = self.run_engine({"VLLM_PLUGINS": "other,kvx", "MANAGER_FIRST": "1"})
        self.check_swapped(out, logs)

    def test_every_plugin_when_vllm_plugins_is_unset(self):
        """vLLM's rule: VLLM_PLUGINS unset loads every installed plugin, kvx's included."""
        out, logs = self.run_engine({"VLLM_PLUGINS": None})
        self.check_swapped(out, logs)

    def test_not_selected_changes_nothing(self):
        for sel in ("other", ""):
            out, logs = self.run_engine({"VLLM_PLUGINS": sel})
            self.assertEqual((out["class"], out["stub_constructed"]), ("NixlTransport", 2))
            self.assertFalse(out["kvx_imported"])
            self.assertEqual(logs, [])

    def test_without_libkvx_vllm_keeps_nixl_and_kvx_says_why(self):
        """`pip install ./python` alone (no libkvx anywhere): the plugin leaves vLLM alone and
        logs why; a KvxTransport made anyway warns at construction and holds the cause."""
        out, logs = self.run_engine({"VLLM_PLUGINS": "kvx", "KVX_LIBRARY": "/nonexistent"})
        self.assertEqual((out["class"], out["stub_constructed"]), ("NixlTransport", 2))
        self.assertEqual(len(logs), 1, logs)
        self.assertIn("plugin not applied, vLLM keeps NixlTransport: libkvx not found", logs[0])
        out, _ = self.run_engine({"KVX_LIBRARY": "/nonexistent"}, with_vllm=False,
                                 script=textwrap.dedent("""
            import json, warnings, kvx
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = kvx.KvxTransport("alone", memoryview(bytearray(8192)).cast("B", (2, 4096)))
            print(json.dumps({"available": t.available, "reason": t.unavailable_reason,
                              "warnings": [str(x.message) for x in w
                                           if x.category is RuntimeWarning]}))
        """))
        self.assertFalse(out["available"])
        self.assertIn("libkvx not found", out["reason"])
        self.assertEqual(out["warnings"], [f"KvxTransport 'alone' is unavailable: {out['reason']}"])

    def test_without_vllm_nothing_happens(self):
        out, _ = self.run_engine({}, with_vllm=False, script=textwrap.dedent("""
            import json, sys
            import kvx.vllm_plugin as p
            p.register()
            p.register()
            import kvx
            t = kvx.KvxTransport("no-vllm", memoryview(bytearray(8192)).cast("B", (2, 4096)))
            print(json.dumps({"vllm": sorted(m for m in sys.modules if m.startswith("vllm")),
                              "base": [c.__name__ for c in type(t).__mro__],
                              "available": t.available}))
            t.close()
        """))
        self.assertEqual(out["vllm"], [])
        # no base class of vLLM's: only the region methods' mixin (kvx/regions.py)
        self.assertEqual(out["base"], ["KvxTransport", "RegionsMixin", "object"])
        self.assertTrue(out["available"])

    def test_options_from_env(self):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from kvx.vllm_plugin import options_from_env
        self.assertEqual(options_from_env({}), {"thread_mode": "drives"})
        self.assertEqual(options_from_env({
            "KVX_SECRET": "s3", "KVX_NET_DEVICES": "lo", "KVX_DEADLINE_MS": "100",
            "KVX_STALL_MS": "50", "KVX_KEEPALIVE_MS": "20", "KVX_INTEGRITY": "1",
            "KVX_THREAD_MODE": "yields"}),
            {"secret": b"s3", "net_devices": "lo", "deadline_ms": 100, "stall_ms": 50,
             "keepalive_ms": 20, "integrity": True, "thread_mode": "yields"})
        self.assertEqual(options_from_env({"KVX_SECRET_FILE": self.secret, "KVX_SECRET": "x"}),
                         {"secret": open(self.secret, "rb").read(), "thread_mode": "drives"})
        with self.assertRaisesRegex(ValueError, "KVX_DEADLINE_MS must be an integer"):
            options_from_env({"KVX_DEADLINE_MS": "soon"})
        with self.assertRaisesRegex(ValueError, "KVX_THREAD_MODE must be one of"):
            options_from_env({"KVX_THREAD_MODE": "sometimes"})


if __name__ == "__main__":
    unittest.main()
