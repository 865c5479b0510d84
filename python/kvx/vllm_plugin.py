"""kvx as the data transport of vLLM's P2P KV tier, without editing vLLM.

This module is a vLLM plugin: pyproject.toml declares it in vLLM's entry-point group
`vllm.general_plugins` under the name `kvx`. vLLM's loader (vllm/plugins/__init__.py,
load_general_plugins) runs the plugins of that group in every vLLM process before the engine
starts: every installed one when VLLM_PLUGINS is unset, only those VLLM_PLUGINS names (comma
separated) otherwise. So a vLLM user runs

    pip install ./python                      # kvx's package, next to an installed libkvx
    VLLM_PLUGINS=kvx vllm serve ...           # or a list that includes kvx

register() then makes vLLM's P2P tier construct KvxTransport where it constructs NixlTransport:
P2PSecondaryTierManager.__init__ (vllm/v1/kv_offload/tiering/p2p/manager.py) calls the name
NixlTransport of its own module, looked up when the manager is constructed, with
(agent_name, view, config_fields=..., backends=..., num_threads=...). register() binds that
name, in that module only, to VllmKvxTransport, which takes the same arguments. The module is
not imported for it: if it is not imported yet, the binding is made as soon as it is, so a
process that never uses the P2P tier imports nothing more. It logs once per process (logger
"vllm.kvx", which vLLM's logging configuration prints) that it did.

It changes nothing when vLLM is not installed or the plugin is not selected (vLLM's loader then
never calls it), when libkvx cannot be loaded (it logs a warning saying why, and vLLM keeps
NixlTransport), or when this vLLM's manager has no NixlTransport to replace (a warning).

kvx's own options, which NixlTransport's arguments cannot carry, come from the environment of
the vLLM process (every one optional):

    KVX_SECRET_FILE   a file whose bytes are the shared secret (peers must hold the same)
    KVX_SECRET        the shared secret itself (UTF-8); KVX_SECRET_FILE is preferred, since a
                      process's environment is readable by its user through /proc
    KVX_NET_DEVICES   the network devices UCX may use, e.g. "eth0" or "mlx5_0:1,lo"
    KVX_DEADLINE_MS, KVX_STALL_MS, KVX_KEEPALIVE_MS   kvx_params_t's figures (integers)
    KVX_INTEGRITY     "1": a CRC-32C of every piece of data sent, checked by the receiver
    KVX_THREAD_MODE   "drives" (the default here: the P2P tier checks transfers once per engine
                      step, and kvx's thread drives UCX in between) or "yields"

config_fields are what vLLM derives from the model (they make the fingerprint, as NIXL's do);
kvx takes nothing else from them. backends must be None or ["UCX"] (KvxTransport refuses
others by name); num_threads > 0 runs kvx's progress thread, 0 none.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import threading

from . import _lib

MANAGER = "vllm.v1.kv_offload.tiering.p2p.manager"
REPLACED = "NixlTransport"

logger = logging.getLogger("vllm.kvx")

_lock = threading.Lock()
_announced = False
_finder = None
_class = None


def options_from_env(environ=None) -> dict:
    """KvxTransport's keyword arguments from the KVX_* variables above. ValueError for a
    value that is not one."""
    env = os.environ if environ is None else environ
    kw: dict = {}
    path = env.get("KVX_SECRET_FILE")
    if path:
        with open(path, "rb") as f:
            kw["secret"] = f.read()
    elif env.get("KVX_SECRET"):
        kw["secret"] = env["KVX_SECRET"].encode()
    if env.get("KVX_NET_DEVICES"):
        kw["net_devices"] = env["KVX_NET_DEVICES"]
    for var, arg in (("KVX_DEADLINE_MS", "deadline_ms"), ("KVX_STALL_MS", "stall_ms"),
                     ("KVX_KEEPALIVE_MS", "keepalive_ms")):
        if env.get(var):
            try:
                kw[arg] = int(env[var])
            except ValueError:
                raise ValueError(f"{var} must be an integer (milliseconds), not {env[var]!r}")
    if env.get("KVX_INTEGRITY", "0") not in ("", "0"):
        kw["integrity"] = True
    kw["thread_mode"] = env.get("KVX_THREAD_MODE") or "drives"
    if kw["thread_mode"] not in _lib.THREAD_MODES:
        raise ValueError(f"KVX_THREAD_MODE must be one of {sorted(_lib.THREAD_MODES)}, not "
                         f"{kw['thread_mode']!r}")
    return kw


def transport_class():
    """VllmKvxTransport: KvxTransport with NixlTransport's constructor, kvx's options from the
    environment. Made on first use (it imports kvx.transport, which subclasses vLLM's
    DataTransport when that is importable)."""
    global _class
    with _lock:
        if _class is None:
            from .transport import KvxTransport

            class VllmKvxTransport(KvxTransport):
                """KvxTransport constructed as vLLM's P2P manager constructs NixlTransport."""

                def __init__(self, agent_name, view, config_fields=None, backends=None,
                             num_threads=4):
                    super().__init__(agent_name, view, config_fields=config_fields,
                                     backends=backends, num_threads=num_threads,
                                     **options_from_env())

            _class = VllmKvxTransport
        return _class


def _bind(module) -> None:
    """Point module's NixlTransport at VllmKvxTransport (once; later calls change nothing)."""
    global _announced
    current = getattr(module, REPLACED, None)
    if current is None:
        logger.warning("kvx: %s has no %s: this vLLM constructs its P2P transport some other "
                       "way, so kvx changed nothing", module.__name__, REPLACED)
        return
    cls = transport_class()
    if current is cls:
        return
    cls.replaces = current  # what vLLM would have constructed
    setattr(module, REPLACED, cls)
    with _lock:
        first, _announced = not _announced, True
    if first:
        lib = _lib.load()
        logger.info("kvx %s: vLLM's P2P tier constructs KvxTransport in place of %s (%s.%s)",
                    lib.kvx_version().decode() if lib else "?", REPLACED, module.__name__,
                    REPLACED)


class _Loader(importlib.abc.Loader):
    """The manager module's own loader, then _bind."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _bind(module)

    def __getattr__(self, name):  # get_source, get_code, is_package, ...
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the manager module as the other finders do, with a loader that binds after."""

    def find_spec(self, name, path, target=None):
        if name != MANAGER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def register() -> None:
    """The entry point vLLM's loader calls (kvx = "kvx.vllm_plugin:register"). Safe to call any
    number of times, in any process."""
    global _finder, _announced
    if _lib.load() is None:
        with _lock:
            first, _announced = not _announced, True
        if first:
            logger.warning("kvx: vLLM plugin not applied, vLLM keeps %s: %s", REPLACED,
                           _lib.load_error())
        return
    module = sys.modules.get(MANAGER)
    if module is not None:
        _bind(module)
        return
    with _lock:
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
