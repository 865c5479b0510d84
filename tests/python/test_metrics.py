"""Metrics and the event fd from Python, against real peers in other processes: a real
prometheus_client HTTP endpoint on 127.0.0.1 scraped and parsed by prometheus_client's own parser
while transfers run, its values checked against the transfers made; an asyncio program that
awaits two peers' completions on the event fd, without a thread or a timer, and stays idle; and
each awaiter (poll_async, notices_async) asleep while another kind waits undrained.

Run: PYTHONPATH=python /usr/bin/python3 -m pytest tests/python/test_metrics.py
"""

import asyncio
import http.server
import os
import resource
import selectors
import signal
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvx  # noqa: E402
import kvx.aio  # noqa: E402
import kvx.metrics  # noqa: E402
from peer_proc import block_pattern  # noqa: E402
from test_kvx import BL, NB, SALT, Local, Target, poll_until  # noqa: E402

try:
    import prometheus_client
    from prometheus_client.exposition import MetricsHandler
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # Debian's python3-prometheus-client; scripts/test installs it
    prometheus_client = None


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wait_all(t, ids, timeout=30):
    done, failed = set(), set()
    end = time.time() + timeout
    while (done | failed) != set(ids) and time.time() < end:
        r = t.poll()
        done.update(r.done)
        failed.update(r.failed)
        if not r.done and not r.failed:
            t.wait(None, 0.1)
    return done, failed


@unittest.skipIf(prometheus_client is None, "python3-prometheus-client is not installed")
class TestPrometheus(unittest.TestCase):
    def scrape(self, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def test_scrape_while_transfers_run(self):
        a, b = Target("metrics-a", salt=3), Target("metrics-b", salt=4)
        loc = Local("metrics-init")
        registry = prometheus_client.CollectorRegistry()
        registry.register(kvx.metrics.KvxCollector(loc.t))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(registry))
        th = threading.Thread(target=server.serve_forever, daemon=True)
        th.start()
        port = server.server_address[1]
        try:
            a.add_to(loc.t, "a")
            b.add_to(loc.t, "b")
            ids, scrapes = [], 0
            for rnd in range(8):  # scrapes interleave with transfers in flight
                ids.append(loc.t.write_blocks("a", [rnd], [rnd]))
                ids.append(loc.t.write_blocks("b", [rnd, rnd + 8], [rnd, rnd + 8]))
                ids.append(loc.t.read_blocks("a", [64 + rnd], [64 + rnd]))
                self.scrape(port)
                scrapes += 1
            self.assertNotIn(None, ids)
            done, failed = wait_all(loc.t, ids)
            self.assertEqual(done, set(ids))
            self.assertEqual(a.verify(list(range(8)), list(range(8)), SALT, 0), [])
            self.assertEqual(b.verify(list(range(16)), list(range(16)), SALT, 0), [])
            for i in range(8):
                self.assertEqual(loc.block(64 + i), block_pattern(BL, 3, 64 + i, 0))
            # a failed one: a write to a stopped peer past its deadline
            b.stop()
            try:
                bad = loc.t.write_blocks("b", [20], [20], deadline_ms=200)
                _, failed = wait_all(loc.t, [bad])
                self.assertEqual(failed, {bad})
            finally:
                b.cont()
            m = self.scrape(port)
            ag = ("agent", "metrics-init")

            def v(name, **labels):
                return m.get((name, tuple(sorted({**dict([ag]), **labels}.items()))))

            self.assertEqual(v("kvx_transfers_total", peer="a", op="write", status="ok"), 8)
            self.assertEqual(v("kvx_transfers_total", peer="a", op="read", status="ok"), 8)
            self.assertEqual(v("kvx_transfers_total", peer="b", op="write", status="ok"), 8)
            self.assertEqual(v("kvx_transfers_total", peer="b", op="write", status="timeout"), 1)
            self.assertEqual(v("kvx_transfer_bytes_total", peer="a", op="write"), 8 * BL)
            self.assertEqual(v("kvx_transfer_bytes_total", peer="a", op="read"), 8 * BL)
            self.assertEqual(v("kvx_transfer_bytes_total", peer="b", op="write"), 16 * BL)
            self.assertEqual(v("kvx_transfer_duration_seconds_count", peer="a"), 16)
            self.assertEqual(v("kvx_transfer_duration_seconds_count", peer="b"), 9)
            self.assertEqual(v("kvx_transfer_duration_seconds_bucket", peer="b", le="+Inf"), 9)
            # the failed write waited its 0.2 s deadline at least
            self.assertGreaterEqual(v("kvx_transfer_duration_seconds_sum", peer="b"), 0.2)
            self.assertLessEqual(v("kvx_transfer_duration_seconds_bucket", peer="b",
                                   le="0.131072"), 8)
            self.assertEqual(v("kvx_transfers_in_flight", peer="a"), 0)
            self.assertEqual(v("kvx_fences_total"), 0)
            self.assertEqual(v("kvx_peer_reconnections_total", peer="a"), 0)
            self.assertIsNotNone(v("kvx_dropped_messages_total", cause="malformed"))
            self.assertEqual(kvx.metrics.peer_ids(loc.t).__len__(), 2)
            self.assertGreaterEqual(scrapes, 8)
            loc.t.remove_remote_peer("a")
            self.assertEqual(kvx.metrics.peer_ids(loc.t), ["b"])
            tot = kvx.metrics.stats(loc.t)
            self.assertEqual(tot["xfers"][("write", "ok")], 16)
        finally:
            server.shutdown()
            server.server_close()
            loc.close()
            a.quit()
            b.quit()
        # a closed transport is skipped, not an error
        self.assertEqual([f for f in registry.collect() if f.samples], [])


@unittest.skipIf(prometheus_client is None, "python3-prometheus-client is not installed")
class TestSeveralTransports(unittest.TestCase):
    """Three transports of one process in one registry: each metric family once (one HELP and
    one TYPE line: the Prometheus text format allows no more), an agent label per transport,
    and every transport's figures right; whether one KvxCollector holds all three or each
    transport joined the registry's collector with kvx.metrics.register."""

    BL = 4096

    def setUp(self):
        self.loc = {n: Local(f"engine-{n}", 8, self.BL, num_threads=1) for n in "abc"}
        t = {n: loc.t for n, loc in self.loc.items()}
        for src, dst in (("b", "a"), ("c", "a"), ("c", "b"), ("a", "c")):
            t[src].add_remote_peer(dst, t[dst].get_agent_metadata(), t[dst].base_addr, 8, self.BL)
        # b writes 1 block into a; c writes 2 into a and 3 into b; a reads 4 from c
        ids = {"b": [t["b"].write_blocks("a", [0], [0])],
               "c": [t["c"].write_blocks("a", [1, 2], [1, 2]),
                     t["c"].write_blocks("b", [0, 1, 2], [4, 5, 6])],
               "a": [t["a"].read_blocks("c", [4, 5, 6, 7], [0, 1, 2, 3])]}
        for n, want in ids.items():
            self.assertNotIn(None, want)
            self.assertEqual(wait_all(t[n], want), (set(want), set()))
        self.t = t

    def tearDown(self):
        for loc in self.loc.values():
            loc.close()

    def check(self, registry):
        text = prometheus_client.generate_latest(registry).decode()
        for kind in ("# HELP ", "# TYPE "):
            names = [line.split()[2] for line in text.splitlines() if line.startswith(kind)]
            self.assertEqual(len(names), len(set(names)), f"{kind}lines repeated: {names}")
            self.assertEqual(len(names), 11, names)
        fams = list(text_string_to_metric_families(text))
        self.assertEqual(len(fams), len({f.name for f in fams}))
        m = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}

        def v(name, **labels):
            return m.get((name, tuple(sorted(labels.items()))))

        bl = self.BL
        for agent, peer, op, n, nbytes in (("engine-b", "a", "write", 1, bl),
                                           ("engine-c", "a", "write", 1, 2 * bl),
                                           ("engine-c", "b", "write", 1, 3 * bl),
                                           ("engine-a", "c", "read", 1, 4 * bl)):
            self.assertEqual(v("kvx_transfers_total", agent=agent, peer=peer, op=op,
                               status="ok"), n)
            self.assertEqual(v("kvx_transfer_bytes_total", agent=agent, peer=peer, op=op),
                             nbytes)
            self.assertEqual(v("kvx_transfer_duration_seconds_count", agent=agent, peer=peer), n)
            self.assertEqual(v("kvx_transfers_in_flight", agent=agent, peer=peer), 0)
        for agent, landed, served in (("engine-a", 3 * bl, 0), ("engine-b", 3 * bl, 0),
                                      ("engine-c", 0, 4 * bl)):
            self.assertEqual(v("kvx_received_bytes_total", agent=agent), landed)
            self.assertEqual(v("kvx_served_bytes_total", agent=agent), served)
            self.assertEqual(v("kvx_fences_total", agent=agent), 0)
            self.assertEqual(v("kvx_dropped_messages_total", agent=agent, cause="range"), 0)
        self.assertEqual({s.labels["agent"] for f in fams for s in f.samples
                          if f.name == "kvx_received_bytes"},
                         {"engine-a", "engine-b", "engine-c"})
        return m

    def test_one_collector_holds_them_all(self):
        registry = prometheus_client.CollectorRegistry()
        c = kvx.metrics.KvxCollector(self.t["a"], self.t["b"])
        registry.register(c)
        c.add(self.t["c"])
        c.add(self.t["c"])  # once only
        self.assertEqual(len(c.transports), 3)
        self.check(registry)
        # a second collector of kvx's metrics in the same registry is refused at register()
        with self.assertRaisesRegex(ValueError, "Duplicated timeseries.*kvx_"):
            registry.register(kvx.metrics.KvxCollector(self.t["a"]))
        with self.assertRaisesRegex(ValueError, r"another KvxCollector already .*"
                                                r"collector\.add\(transport\)"):
            kvx.metrics.register(self.t["a"], registry)
        # a closed transport's series go, and so does the transport
        self.loc["c"].close()
        text = prometheus_client.generate_latest(registry).decode()
        self.assertNotIn('agent="engine-c"', text)
        self.assertIn('agent="engine-b"', text)
        self.assertEqual(c.transports, (self.t["a"], self.t["b"]))

    def test_each_transport_joins_the_registrys_collector(self):
        registry = prometheus_client.CollectorRegistry()
        got = {kvx.metrics.register(t, registry) for t in self.t.values()}
        self.assertEqual(len(got), 1)  # one collector for the registry
        self.check(registry)
        kvx.metrics.unregister(self.t["c"], registry)
        text = prometheus_client.generate_latest(registry).decode()
        self.assertNotIn('agent="engine-c"', text)
        self.assertEqual(text.count("# HELP kvx_transfers_total "), 1)


class TestAsyncio(unittest.TestCase):
    def test_completions_on_the_event_fd(self):
        a, b = Target("aio-a", salt=5), Target("aio-b", salt=6)
        loc = Local("aio-init")

        async def main():
            a.add_to(loc.t, "a")
            b.add_to(loc.t, "b")
            ids = set()
            for i in range(32):
                ids.add(loc.t.write_blocks("a", [i], [i]))
                ids.add(loc.t.write_blocks("b", [i], [i + 32]))
                ids.add(loc.t.read_blocks("b", [64 + i], [i + 64]))
            self.assertNotIn(None, ids)
            done = set()
            wakes = 0
            while done != ids:
                r = await asyncio.wait_for(loc.t.poll_async(), 30)
                self.assertEqual(r.failed, ())
                done.update(r.done)
                wakes += 1
            # idle: nothing in flight, the loop asleep on the fd for a second
            c0, w0 = cpu_seconds(), time.monotonic()
            self.assertEqual(loc.t.fileno(), kvx.metrics.event_fd(loc.t))
            r = await kvx.aio.poll_async(loc.t, timeout=1.0)
            idle_cpu, idle_wall = cpu_seconds() - c0, time.monotonic() - w0
            return wakes, r, idle_cpu, idle_wall

        try:
            wakes, r, idle_cpu, idle_wall = asyncio.run(main())
            self.assertEqual((r.done, r.failed), ((), ()))
            self.assertGreaterEqual(idle_wall, 0.95)
            print(f"asyncio: {wakes} wake-ups for 96 completions; idle second: "
                  f"{idle_cpu * 1000:.1f} ms of CPU")
            self.assertLess(idle_cpu, 0.010)
            self.assertEqual(a.verify(list(range(32)), list(range(32)), SALT, 0), [])
            self.assertEqual(b.verify(list(range(32, 64)), list(range(32)), SALT, 0), [])
            for i in range(32):
                self.assertEqual(loc.block(64 + i), block_pattern(BL, 6, i + 64, 0))
        finally:
            loc.close()
            a.quit()
            b.quit()


class CountingSelector(selectors.DefaultSelector):
    """The loop's selector, counting its select() calls: each is one turn of the loop (it
    returns when a watched fd is readable, a timer is due, or at once while callbacks are
    ready), so an awaiter that spins on a readable fd shows as thousands of them."""

    def __init__(self):
        super().__init__()
        self.selects = self.readable = 0

    def select(self, timeout=None):
        ready = super().select(timeout)
        self.selects += 1
        self.readable += bool(ready)  # of those, the turns a readable fd ended
        return ready


def until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.002)
    return cond()


class TestAsyncioSleeps(unittest.TestCase):
    """An awaiter of one kind (completions, arrival notices, peer events) sleeps while another
    kind waits undrained: each waits on the event fd of its own kind. Over one second of
    poll_async(timeout=1.0) or notices_async(timeout=1.0), at most WAKES_MAX turns of the loop
    and CPU_MAX of the process's CPU (every thread's: kvx's progress threads included). A fd
    shared by every kind made them spin: 345-712 ms of CPU and 8,000-16,000 turns."""

    WAKES_MAX, CPU_MAX = 50, 0.100

    def asleep(self, label, waiter):
        """Await waiter() on a fresh loop and measure only that await: its turns of the loop
        (CountingSelector), the process's CPU time and the wall time. Returns its result."""
        sel = CountingSelector()
        loop = asyncio.SelectorEventLoop(sel)

        async def main():
            s0, f0 = sel.selects, sel.readable
            c0, w0 = time.process_time(), time.monotonic()
            r = await waiter()
            cpu, wall = time.process_time() - c0, time.monotonic() - w0
            return r, sel.selects - s0, sel.readable - f0, cpu, wall

        try:
            r, wakes, by_fd, cpu, wall = loop.run_until_complete(main())
        finally:
            loop.close()
        print(f"{label}: {wakes} wake-ups ({by_fd} by a readable fd), {cpu * 1000:.1f} ms of CPU"
              f" in {wall:.2f} s")
        self.assertGreaterEqual(wall, 0.95, label)
        self.assertLessEqual(wakes, self.WAKES_MAX, label)
        self.assertLessEqual(cpu, self.CPU_MAX, label)
        return r

    def test_notice_and_completion_waiting(self):
        rx, tx = Local("aio-rx"), Local("aio-tx")
        self.addCleanup(rx.close)
        self.addCleanup(tx.close)
        m = kvx.metrics
        fds = [m.event_fd(rx.t, k) for k in range(1, m.EVENT_ALL + 1)]
        self.assertEqual(len(set(fds)), m.EVENT_ALL)  # one per mask of kinds
        self.assertEqual(fds[m.EVENT_ALL - 1], rx.t.fileno())
        self.assertEqual(m.event_fd(rx.t, m.EVENT_NOTICES), fds[m.EVENT_NOTICES - 1])
        for bad in (0, m.EVENT_ALL + 1, -1, 1.0):
            with self.assertRaises(ValueError):
                m.event_fd(rx.t, bad)
        tx.t.add_remote_peer("R", rx.t.get_agent_metadata(), rx.t.base_addr, NB, BL)
        tid = tx.t.write_blocks("R", [3, 4], [10, 11], tag=5, notify=True)
        self.assertIsNotNone(tid)
        # the completion waits in tx's queue (wait() does not take it), the notice in rx's
        # (counted when queued; counters() takes nothing)
        self.assertTrue(tx.t.wait(None, 10))
        self.assertTrue(until(lambda: rx.t.counters()["notices"] == 1))
        for d, s in ((10, 3), (11, 4)):
            self.assertEqual(rx.block(d), block_pattern(BL, SALT, s, 0), f"block {d}")
        r = self.asleep("poll_async, a notice waiting",
                        lambda: kvx.aio.poll_async(rx.t, timeout=1.0))
        self.assertEqual((r.done, r.failed), ((), ()))
        n = self.asleep("notices_async, a completion waiting",
                        lambda: kvx.aio.notices_async(tx.t, timeout=1.0))
        self.assertEqual(n, ())
        # each still waits for its own awaiter, which returns it at once
        self.assertEqual(asyncio.run(kvx.aio.notices_async(rx.t, timeout=5)),
                         (kvx.Notice("aio-tx", 5, 2, 2 * BL),))
        r = asyncio.run(kvx.aio.poll_async(tx.t, timeout=5))
        self.assertEqual((r.done, r.failed), ((tid,), ()))

    def test_peer_events_waiting(self):
        a = Target("aio-listener", salt=3)
        self.addCleanup(a.quit)
        d = Local("aio-dialer")
        self.addCleanup(d.close)
        addr = a.listen("127.0.0.1:0")
        d.t.connect("L", addr)
        tid = d.t.write_blocks("L", [1], [2])
        self.assertEqual(poll_until(d.t, 1, "L"), ([tid], []))
        self.assertEqual(a.verify([2], [1], SALT, 0), [])
        # the listener dies and another comes at its address: "down", then "restarted" wait
        os.kill(a.pid, signal.SIGKILL)
        a.proc.join(10)
        self.assertTrue(until(lambda: d.t.peer_info("L")["state"] == "reconnecting"))
        b = Target("aio-listener-2", salt=4)
        self.addCleanup(b.quit)
        self.assertEqual(b.listen(addr), addr)
        self.assertTrue(until(lambda: d.t.peer_info("L")["state"] == "connected"))
        r = self.asleep("poll_async, peer events waiting",
                        lambda: kvx.aio.poll_async(d.t, timeout=1.0))
        self.assertEqual((r.done, r.failed), ((), ()))
        n = self.asleep("notices_async, peer events waiting",
                        lambda: kvx.aio.notices_async(d.t, timeout=1.0))
        self.assertEqual(n, ())
        ev = asyncio.run(kvx.aio.peer_events_async(d.t, timeout=5))
        self.assertEqual([(e["peer_id"], e["event"]) for e in ev],
                         [("L", "down"), ("L", "restarted")])
        tid = d.t.write_blocks("L", [5], [6])  # the peer that came back takes writes
        self.assertEqual(poll_until(d.t, 1, "L"), ([tid], []))
        self.assertEqual(b.verify([6], [5], SALT, 0), [])

class TestAsyncioClose(unittest.TestCase):
    def test_close_while_awaiting(self):
        """close() from another thread while a task awaits poll_async: the task ends with
        RuntimeError at once, and does not spin on the fd close leaves readable."""
        loc = Local("aio-close")

        async def main():
            task = asyncio.ensure_future(loc.t.poll_async())
            await asyncio.sleep(0.1)
            c0, w0 = cpu_seconds(), time.monotonic()
            threading.Thread(target=loc.t.close).start()
            with self.assertRaises(RuntimeError):
                await asyncio.wait_for(task, 5)
            return cpu_seconds() - c0, time.monotonic() - w0

        try:
            cpu, wall = asyncio.run(main())
            self.assertLess(wall, 2.0)
            self.assertLess(cpu, 0.5)
        finally:
            loc.close()


if __name__ == "__main__":
    unittest.main()
