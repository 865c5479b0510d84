#!/usr/bin/env python3
"""kvx-bench's table reads: latencies in ms with their unit in the header, CPU per GB with its
unit, the region size printed, a p99 only from 100 samples or more (the slowest, marked "max",
below that), the busy-host warning by bench/compare's rule (1-minute load average over half the
cores); and --json carries the same figures with the sample count, the region and the load.

usage: test_bench_table.py PATH/TO/kvx-bench
"""
import json
import os
import re
import subprocess
import sys


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(bench, *args):
    """kvx-bench's stdout, and whether the host was busy by the rule both before and after it
    (None when the load average crossed the line meanwhile: kvx-bench's own reading, taken at
    its start, is then either)."""
    ncpu = os.sysconf("SC_NPROCESSORS_ONLN")
    before = os.getloadavg()[0] > 0.5 * ncpu
    r = subprocess.run([bench, "--loopback", "--quiet", *args], capture_output=True, text=True,
                       timeout=120)
    after = os.getloadavg()[0] > 0.5 * ncpu
    if r.returncode != 0:
        fail(f"kvx-bench {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r.stdout, before if before == after else None


def check_warning(out, busy, what):
    warned = "warning: busy host: load average" in out.splitlines()[0]
    if busy is not None and warned != busy:
        fail(f"{what}: busy host {busy}, warning printed {warned}:\n{out}")
    return warned


def rows(out):
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("op "))
    header = lines[head]
    body = []
    for line in lines[head + 1:]:
        if not re.match(r"(write|read|load)\S* ", line):
            break
        body.append(line)
    return header, body


def main():
    bench = sys.argv[1]

    # 5 transfers per row: too few for a p99
    out, busy = run(bench, "-s", "64K", "-r", "8M", "-n", "5")
    check_warning(out, busy, "table")
    if not re.search(r"scattered blocks of a 8M region on each side, 5 iteration", out):
        fail(f"the region size is not printed:\n{out}")
    header, body = rows(out)
    for col in ("p50 ms", "p99 ms", "cpu s/GB", "tgt s/GB"):
        if col not in header:
            fail(f"header without {col!r}: {header}")
    if "us" in header.split() or len(body) != 2:
        fail(f"unexpected table:\n{out}")
    for line in body:
        # p50 (ms), then the slowest marked max
        m = re.search(r"\s(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?) max\s", line)
        if not m or float(m.group(1)) > float(m.group(2)):
            fail(f"row without a p50 and a max: {line}")
        if any(len(v.replace(".", "")) > 4 for v in m.groups()):
            fail(f"latency not 3 significant digits: {line}")
    if "max: 5 transfer(s) measured, under the 100 a p99 needs" not in out:
        fail(f"the max marker is not explained:\n{out}")
    if "CPU seconds (all threads, warm-up included) of the initiator and of the target(s) " \
            "per GB" not in out:
        fail(f"cpu s/GB is not explained:\n{out}")

    # 150 transfers: a p99, not marked
    out, busy = run(bench, "-s", "4K", "-r", "1M", "-b", "4", "-n", "150", "-o", "write")
    check_warning(out, busy, "table of 150")
    header, body = rows(out)
    if len(body) != 1 or " max " in body[0] or "max:" in out:
        fail(f"150 samples should give a p99:\n{out}")

    # the same as JSON: numbers as before, and the sample count, maximum, region and load
    out, busy = run(bench, "-s", "64K", "-r", "8M", "-n", "5", "-o", "write", "--json")
    objs = [json.loads(line) for line in out.splitlines()]
    if len(objs) != 1 or not out.startswith("{"):
        fail(f"--json: one object per line and nothing else:\n{out}")
    o = objs[0]
    if o["latency_samples"] != 5 or o["region_bytes"] != 8 << 20 or \
            not 0 < o["p50_us"] <= o["p99_us"] <= o["max_us"] or o["cores"] < 1 or \
            o["load_avg_1m"] < 0 or (busy is not None and o["host_busy"] != busy):
        fail(f"--json fields: {o}")

    # --hol: the same units and rules
    out, busy = run(bench, "--hol", "--hol-seconds", "0.05", "-r", "16M")
    check_warning(out, busy, "--hol")
    if not re.search(r"phase\s+urgent\s+p50 ms\s+p99 ms\s+max ms\s+late\s+bulk GB/s", out):
        fail(f"--hol header:\n{out}")
    print("kvx-bench tables: units in the header, region printed, max below 100 samples, "
          f"busy-host warning {'printed' if busy else 'absent'} as the load says")


if __name__ == "__main__":
    main()
