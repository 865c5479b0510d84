"""A target engine for the Python tests, run in a child process (multiprocessing, spawn): it owns
an mmap'd region of patterned blocks, exports its metadata, and answers verification commands.
It never polls: what lands in its region lands through kvx's progress thread."""

import mmap
import os
import struct


def block_pattern(block_len, salt, src, rnd):
    """Bytes of a block that carries (salt, source block, round) all along."""
    unit = struct.pack("<QQQQ", 0x6B7678, salt, src, rnd)
    return (unit * (block_len // len(unit) + 1))[:block_len]


def fill(region, block_len, num_blocks, salt, rnd, blocks=None):
    for i in range(num_blocks) if blocks is None else blocks:
        region[i * block_len:(i + 1) * block_len] = block_pattern(block_len, salt, i, rnd)


def target_main(conn, name, num_blocks, block_len, salt, config_fields, env):
    os.environ.update(env or {})
    import kvx
    import rndv_env

    rndv_env.apply()

    region = mmap.mmap(-1, num_blocks * block_len)
    fill(region, block_len, num_blocks, salt, 0)
    t = kvx.KvxTransport(name, memoryview(region).cast("B", (num_blocks, block_len)),
                         config_fields)
    conn.send((t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len, os.getpid()))
    while True:
        cmd = conn.recv()
        if cmd[0] == "quit":
            break
        if cmd[0] == "verify":  # ("verify", [(dst, src), ...], salt, round)
            _, pairs, s, rnd = cmd
            bad = [d for d, src in pairs
                   if region[d * block_len:(d + 1) * block_len] != block_pattern(block_len, s, src, rnd)]
            conn.send(bad)
        elif cmd[0] == "listen":  # ("listen", addr): the address bound, or the error's text
            try:
                conn.send(t.listen(cmd[1]))
            except Exception as e:  # noqa: BLE001 - the test checks the text
                conn.send(f"error: {e}")
        elif cmd[0] == "refill":
            fill(region, block_len, num_blocks, salt, cmd[1])
            conn.send("ok")
    t.close()
    region.close()
    conn.send("bye")
