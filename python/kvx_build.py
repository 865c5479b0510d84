"""A PEP 517 build backend in the standard library only, so that `pip install ./python` needs no
download: it packs the pure-Python package kvx/ into a wheel."""

import base64
import hashlib
import os
import zipfile

NAME, VERSION = "kvx", "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


def _files():
    pkg = os.path.join(HERE, NAME)
    for f in sorted(os.listdir(pkg)):
        if f.endswith(".py"):
            yield f"{NAME}/{f}", os.path.join(pkg, f)


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: ctypes binding of libkvx: KV-cache block transport over UCX\n"
            "Requires-Python: >=3.8\n")


def _entry_points():
    """entry_points.txt from pyproject.toml's [project.entry-points.*] tables (tomllib where
    the interpreter has it, else the same few lines read as key = "value")."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
        groups = tomllib.loads(raw.decode()).get("project", {}).get("entry-points", {})
    except ImportError:  # Python < 3.11
        import re
        groups, cur = {}, None
        for line in raw.decode().splitlines():
            line = line.strip()
            m = re.fullmatch(r'\[project\.entry-points\."?([^"\]]+)"?\]', line)
            if m:
                cur = groups.setdefault(m.group(1), {})
            elif line.startswith("["):
                cur = None
            elif cur is not None and "=" in line and not line.startswith("#"):
                k, v = (x.strip() for x in line.split("=", 1))
                cur[k] = v.strip('"')
    return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for g, eps in groups.items())


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(_entry_points())
    return DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data):
            z.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        for arcname, path in _files():
            with open(path, "rb") as f:
                add(arcname, f.read())
        add(f"{DIST_INFO}/METADATA", _metadata().encode())
        add(f"{DIST_INFO}/entry_points.txt", _entry_points().encode())
        add(f"{DIST_INFO}/WHEEL", b"Wheel-Version: 1.0\nGenerator: kvx_build\n"
                                  b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        records.append(f"{DIST_INFO}/RECORD,,")
        z.writestr(f"{DIST_INFO}/RECORD", "\n".join(records) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    name = f"{NAME}-{VERSION}"
    path = os.path.join(sdist_directory, f"{name}.tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for f in ("pyproject.toml", "kvx_build.py", "README.md"):
            t.add(os.path.join(HERE, f), f"{name}/{f}")
        for arcname, p in _files():
            t.add(p, f"{name}/{arcname}")
    return os.path.basename(path)
