#!/usr/bin/env python3
"""Two engines, two processes: each owns a KvxTransport over an mmap'd region; they exchange
metadata through a pipe; engine 1 writes blocks into engine 2, which checks them, then engine 1
reads them back and checks them too.

Run from a source checkout after building:  PYTHONPATH=python python3 examples/two_engines.py
"""
import mmap
import multiprocessing as mp
import time

import kvx

NUM_BLOCKS, BLOCK_LEN = 64, 65536


def block(tag, i):
    unit = f"{tag}:{i:06d};".encode()
    return (unit * (BLOCK_LEN // len(unit) + 1))[:BLOCK_LEN]


def engine2(conn):
    region = mmap.mmap(-1, NUM_BLOCKS * BLOCK_LEN)
    t = kvx.KvxTransport("engine-2", memoryview(region).cast("B", (NUM_BLOCKS, BLOCK_LEN)),
                         {"model": "demo", "block_size": 16})
    conn.send((t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len))
    landed = conn.recv()  # engine 1 says where it wrote: [(remote, local), ...]
    ok = all(region[r * BLOCK_LEN:(r + 1) * BLOCK_LEN] == block("e1", l) for r, l in landed)
    print(f"engine 2: {len(landed)} blocks landed, {'all intact' if ok else 'CORRUPTED'}")
    conn.send(ok)
    conn.recv()  # engine 1 is done reading
    t.close()
    region.close()


def wait_for(t, peer, tid):
    while True:
        r = t.poll(peer)
        if tid in r.done:
            return True
        if tid in r.failed:
            return False
        time.sleep(0.0005)


def main():
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=engine2, args=(there,), daemon=True)
    p.start()

    region = mmap.mmap(-1, NUM_BLOCKS * BLOCK_LEN)
    for i in range(NUM_BLOCKS):
        region[i * BLOCK_LEN:(i + 1) * BLOCK_LEN] = block("e1", i)
    t = kvx.KvxTransport("engine-1", memoryview(region).cast("B", (NUM_BLOCKS, BLOCK_LEN)),
                         {"model": "demo", "block_size": 16})
    md, base, nb, bl = here.recv()
    t.add_remote_peer("engine-2", md, base, nb, bl)
    print(f"engine 1: connected over {t.peer_info('engine-2')['transport']}")

    local, remote = [0, 1, 2, 9, 33], [40, 41, 42, 7, 3]
    tid = t.write_blocks("engine-2", local, remote)
    assert wait_for(t, "engine-2", tid), "write failed"
    here.send(list(zip(remote, local)))
    ok2 = here.recv()

    back = [50, 51, 52, 53, 54]
    tid = t.read_blocks("engine-2", back, remote)
    assert wait_for(t, "engine-2", tid), "read failed"
    ok1 = all(region[b * BLOCK_LEN:(b + 1) * BLOCK_LEN] == block("e1", l)
              for b, l in zip(back, local))
    print(f"engine 1: read {len(back)} blocks back, {'all intact' if ok1 else 'CORRUPTED'}")
    print(f"engine 1: {t.peer_info('engine-2')}")
    here.send("done")
    p.join()
    t.close()
    region.close()
    raise SystemExit(0 if ok1 and ok2 and p.exitcode == 0 else 1)


if __name__ == "__main__":
    main()
