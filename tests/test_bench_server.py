#!/usr/bin/env python3
"""kvx-bench's server against hostile clients: it listens on 127.0.0.1 only, answers every
malformed or hostile message (truncated, huge sizes, overflowing geometry, out-of-range blocks,
repeated barriers, unknown types, garbage, stalled half messages, too many connections) with an
error or by closing that client, and keeps serving others; a real kvx-bench client run against it
afterwards moves and verifies its blocks.

usage: test_bench_server.py PATH/TO/kvx-bench
"""
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

MSG_REGION, MSG_VERIFY, MSG_REFILL, MSG_BARRIER, MSG_BYE, MSG_ERROR, MSG_CPU = 1, 2, 3, 4, 5, 6, 7


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


class Client:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(self, mtype, payload=b"", declared=None):
        n = len(payload) if declared is None else declared
        try:
            self.s.sendall(struct.pack("<II", mtype, n) + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused an earlier message already

    def recv(self):
        """(type, payload), or None when the server closed the connection."""
        hdr = self.recv_exact(8)
        if hdr is None:
            return None
        mtype, n = struct.unpack("<II", hdr)
        body = self.recv_exact(n)
        return (mtype, body) if body is not None else None

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.s.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def refused(self):
        """The server answered MSG_ERROR and closed, or just closed."""
        r = self.recv()
        if r is not None and r[0] != MSG_ERROR:
            fail(f"expected an error, got message type {r[0]}")
        if r is not None and self.recv() is not None:
            fail("the server kept a refused client")
        self.close()
        return r[1].decode() if r else "(closed)"

    def close(self):
        self.s.close()


def region(c, block_len, num_blocks):
    c.send(MSG_REGION, struct.pack("<QQ", block_len, num_blocks))


def alive(port):
    """A fresh client still gets a region's listening port at once."""
    c = Client(port)
    region(c, 4096, 16)
    r = c.recv()
    if r is None or r[0] != MSG_REGION or len(r[1]) != 4 or struct.unpack("<I", r[1])[0] == 0:
        fail(f"server did not answer a valid REGION: {r}")
    c.send(MSG_BYE)
    c.close()


def listening_on_loopback_only(port):
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    addrs = [r[1] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]
    if addrs != ["0100007F:%04X" % port]:
        fail(f"listening sockets on port {port}: {addrs} (want 127.0.0.1 only)")


def main():
    bench = sys.argv[1]
    srv = subprocess.Popen([bench, "--port", "0", "--quiet"], stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stderr.readline()
        m = re.search(r"serving on 127\.0\.0\.1 port (\d+)", line)
        if not m:
            fail(f"server said: {line!r}")
        port = int(m.group(1))
        listening_on_loopback_only(port)
        alive(port)

        cases = {
            "REGION whose size wraps 64 bits": lambda c: region(c, 2**63 + 2048, 2),
            "REGION over --max-region": lambda c: region(c, 4096, 2**32 - 1),
            "REGION of 0 blocks": lambda c: region(c, 4096, 0),
            "REGION of 2^32 blocks": lambda c: region(c, 1, 2**32),
            "REGION with a short payload": lambda c: c.send(MSG_REGION, b"\x00" * 4),
            "REGION with a long payload": lambda c: c.send(MSG_REGION, b"\x01" * 24),
            "VERIFY declaring 4 GiB": lambda c: c.send(MSG_VERIFY, b"", declared=0xFFFFFFFF),
            "VERIFY whose count disagrees with its length":
                lambda c: c.send(MSG_VERIFY, struct.pack("<QQQQII", 4096, 16, 1, 0, 1000, 0)),
            "VERIFY too short": lambda c: c.send(MSG_VERIFY, b"\x00" * 8),
            "VERIFY of an unknown region":
                lambda c: c.send(MSG_VERIFY, struct.pack("<QQQQII", 4096, 17, 1, 0, 1, 0) +
                                 struct.pack("<II", 0, 0)),
            "VERIFY of a block out of range":
                lambda c: c.send(MSG_VERIFY, struct.pack("<QQQQII", 4096, 16, 1, 0, 1, 0) +
                                 struct.pack("<II", 16, 0)),
            "REFILL of an unknown region": lambda c: c.send(MSG_REFILL, struct.pack("<QQ", 8, 8)),
            "BARRIER of 0 initiators": lambda c: c.send(MSG_BARRIER, struct.pack("<II", 1, 0)),
            "BARRIER of 2^31 initiators":
                lambda c: c.send(MSG_BARRIER, struct.pack("<II", 1, 2**31)),
            "BARRIER repeated 100 times": lambda c: [
                c.send(MSG_BARRIER, struct.pack("<II", 7, 2)) for _ in range(100)],
            "an unknown message type": lambda c: c.send(99, b"hello"),
            "BYE with a payload": lambda c: c.send(MSG_BYE, b"x"),
            "CPU with a payload": lambda c: c.send(MSG_CPU, b"x" * 8),
            "garbage": lambda c: c.s.sendall(os.urandom(4096)),
        }
        for name, act in cases.items():
            c = Client(port)
            act(c)
            why = c.refused()
            print(f"  {name}: refused ({why})")
            alive(port)

        # a half message, then the client goes away; and one that stalls halfway meanwhile
        c = Client(port)
        c.s.sendall(struct.pack("<II", MSG_REGION, 16) + b"\x00" * 5)
        c.close()
        stalled = Client(port)
        stalled.s.sendall(struct.pack("<I", MSG_VERIFY))
        t0 = time.time()
        alive(port)
        if time.time() - t0 > 2:
            fail("a stalled client held up the others")
        print("  half messages: others served meanwhile")

        # a flood of connections: those beyond the server's table are refused, it keeps serving
        flood = [Client(port) for _ in range(80)]
        refused = 0
        for c in flood[-16:]:
            c.s.settimeout(2)
            try:
                r = c.recv()
            except socket.timeout:
                r = "waiting"
            if r is None or (isinstance(r, tuple) and r[0] == MSG_ERROR):
                refused += 1
        for c in flood:
            c.close()
        stalled.close()
        time.sleep(0.2)
        alive(port)
        print(f"  80 connections at once: {refused} of the last 16 refused, still serving")
        if refused == 0:
            fail("a flood beyond the client table was not refused")

        # a real initiator, every byte verified
        r = subprocess.run([bench, f"127.0.0.1:{port}", "-s", "4K,64K", "-r", "8M", "-n", "2",
                            "--quiet"], capture_output=True, text=True, timeout=120)
        print(r.stdout, end="")
        if r.returncode != 0 or " NO" in r.stdout:
            fail(f"kvx-bench client against the server: {r.returncode}: {r.stderr}")
        if srv.poll() is not None:
            fail(f"the server exited with {srv.returncode}")
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
        srv.wait(10)
        srv.stderr.close()
    print("kvx-bench server: every hostile input refused, real clients served")


if __name__ == "__main__":
    main()
