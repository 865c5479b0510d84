"""A target engine for the region tests, run in a child process (multiprocessing, spawn): it
registers regions of seeded random bytes on command (a bytearray, a NumPy array or an mmap),
hands out their blobs, deregisters them, and answers with their bytes, its counters and its
notices. It never polls: what lands in its regions lands through kvx's progress thread."""

import mmap
import os
import random


def region_bytes(seed, size):
    """The bytes a region of that seed starts with (both processes compute them)."""
    return random.Random(seed).randbytes(size)


def _buffer(kind, data):
    if kind == "numpy":
        import numpy as np
        return np.frombuffer(data, dtype=np.uint8).copy()
    if kind == "mmap":
        m = mmap.mmap(-1, len(data))
        m[:] = data
        return m
    return bytearray(data)


def region_target_main(conn, name, env, secret=None):
    os.environ.update(env or {})
    import kvx
    import rndv_env

    rndv_env.apply()
    main = bytearray(region_bytes(0, 4 * 4096))
    t = kvx.KvxTransport(name, memoryview(main).cast("B", (4, 4096)), secret=secret)
    bufs = {1: main}  # region id -> buffer, kept after deregistering: its bytes are checked
    conn.send((t.get_agent_metadata(), t.base_addr, 4, 4096, os.getpid()))
    while True:
        cmd = conn.recv()
        op = cmd[0]
        try:
            if op == "quit":
                break
            if op == "register":  # ("register", size, seed, kind, access) -> (id, blob)
                _, size, seed, kind, access = cmd
                buf = _buffer(kind, region_bytes(seed, size))
                rid = t.register_region(buf, access=access)
                bufs[rid] = buf
                conn.send((rid, t.region_blob(rid)))
            elif op == "blob":
                conn.send(t.region_blob(cmd[1]))
            elif op == "deregister":
                t.deregister_region(cmd[1])
                conn.send(0)
            elif op == "bytes":  # ("bytes", id) -> the region's bytes now
                conn.send(bytes(bufs[cmd[1]]))
            elif op == "counters":
                conn.send(t.counters())
            elif op == "notices":
                conn.send(list(t.poll_notices()))
            elif op == "add":  # ("add", peer_id, metadata, base, nb, bl)
                t.add_remote_peer(*cmd[1:])
                conn.send(0)
            else:
                conn.send(ValueError(f"unknown command {op!r}"))
        except Exception as e:  # noqa: BLE001 - the test checks it
            conn.send(e)
    t.close()
    for b in bufs.values():
        if isinstance(b, mmap.mmap):
            b.close()  # fails (BufferError) if the transport still held it
    conn.send("bye")
