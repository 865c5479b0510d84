#!/usr/bin/python3
"""Run a two-process NIXL test: `CMD --role target` and `CMD --role initiator`, joined by two
pipes (each one's stdout is the other's stdin: the tests' line protocol), on one host over shared
memory (--net shm, UCX's default transports), over tcp on loopback (--net tcp), or as two hosts:
two network namespaces joined by a veth pair, UCX limited to tcp on it (--net netns; needs root
and iproute2, else exit 77). The namespaces are kvxt<pid>a/b like tests/harness.c's, so that its
reaper and scripts/test's leftover check know them; they are deleted on exit, and stale ones of
dead runs first. Exit status: the initiator's (77: skipped), or 1 if the target failed or either
ran past --timeout.

  pair.py [--net shm|tcp|netns] [--timeout 120] [--target-may-die] [--show-target-crash]
          -- CMD [ARGS...]
"""
import argparse
import atexit
import os
import signal
import subprocess
import sys
import time


def sh(cmd, check=True):
    r = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stderr.strip()}")
    return r.returncode


class Netns:
    """Two namespaces joined by a veth pair, 10.231.0.1/24 and .2 (tests/harness.c's layout)."""

    def __init__(self):
        pid = os.getpid()
        self.ns = [f"kvxt{pid}a", f"kvxt{pid}b"]
        self.ifname = [f"kv{pid % 10000000}a", f"kv{pid % 10000000}b"]
        self.up = False

    @staticmethod
    def reap_stale():
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith("kvxt") and name[4:-1].isdigit():
                try:
                    os.kill(int(name[4:-1]), 0)
                except ProcessLookupError:
                    sh(f"ip netns del {name}", check=False)
                except PermissionError:
                    pass

    def create(self):
        if os.geteuid() != 0 or sh("command -v ip", check=False) != 0:
            return False
        self.reap_stale()
        sh(f"ip netns add {self.ns[0]}")
        self.up = True
        atexit.register(self.destroy)
        sh(f"ip netns add {self.ns[1]}")
        sh(f"ip link add {self.ifname[0]} netns {self.ns[0]} type veth peer name "
           f"{self.ifname[1]} netns {self.ns[1]}")
        for i in range(2):
            sh(f"ip -n {self.ns[i]} addr add 10.231.0.{i + 1}/24 dev {self.ifname[i]} && "
               f"ip -n {self.ns[i]} link set {self.ifname[i]} up && "
               f"ip -n {self.ns[i]} link set lo up")
        for _ in range(250):  # the link says UP a few ms later; UCX skips devices that are down
            if all(sh(f"ip -n {self.ns[i]} link show {self.ifname[i]} | grep -q 'state UP'",
                      check=False) == 0 for i in range(2)):
                return True
            time.sleep(0.02)
        raise RuntimeError("the veth pair did not come up")

    def wrap(self, i, cmd):
        # `ip netns exec` gives the command a /sys of the namespace (UCX lists devices there);
        # UCX would also offer lo, which looks reachable from the other namespace but is not.
        return ["ip", "netns", "exec", self.ns[i], "env", "UCX_TLS=tcp",
                f"UCX_NET_DEVICES={self.ifname[i]}"] + cmd

    def destroy(self):
        if self.up:
            for ns in self.ns:
                sh(f"ip netns del {ns}", check=False)
            self.up = False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", choices=["shm", "tcp", "netns"], default="shm")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--target-may-die", action="store_true",
                    help="the test kills the target itself (SIGKILL)")
    ap.add_argument("--show-target-crash", action="store_true",
                    help="a target killed by a signal is reported, not failed (a backend's "
                         "behaviour being shown, not kvx's)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    env = dict(os.environ, PAIR_NET=a.net)
    env.pop("UCX_TLS", None)
    cmds = [cmd + ["--role", "target"], cmd + ["--role", "initiator"]]
    netns = None
    if a.net == "tcp":
        env["UCX_TLS"] = "tcp"
    elif a.net == "netns":
        netns = Netns()
        if not netns.create():
            print("pair.py: cannot make network namespaces here (root and iproute2): skipped",
                  file=sys.stderr)
            return 77
        cmds = [netns.wrap(0, cmds[0]), netns.wrap(1, cmds[1])]
    # ctest's timeout and ^C end the run through atexit (namespaces deleted, children killed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t2i_r, t2i_w = os.pipe()
    i2t_r, i2t_w = os.pipe()
    procs = []
    atexit.register(lambda: [p.kill() for p in procs if p.poll() is None])
    procs.append(subprocess.Popen(cmds[0], stdin=i2t_r, stdout=t2i_w, env=env))
    procs.append(subprocess.Popen(cmds[1], stdin=t2i_r, stdout=i2t_w, env=env))
    for fd in (t2i_r, t2i_w, i2t_r, i2t_w):
        os.close(fd)
    end = time.monotonic() + a.timeout
    tgt, ini = procs
    try:
        rc_i = ini.wait(timeout=max(1, end - time.monotonic()))
        rc_t = tgt.wait(timeout=max(5, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a test may have stopped its peer
                p.kill()
        print(f"pair.py: timed out after {a.timeout:.0f} s", file=sys.stderr)
        return 1
    if rc_i == 77:
        return 77
    if a.target_may_die and rc_t == -signal.SIGKILL:
        rc_t = 0
    elif a.show_target_crash and rc_t < 0:
        print(f"pair.py: the target died of {signal.Signals(-rc_t).name}: shown (the "
              f"backend's behaviour), not counted", file=sys.stderr)
        rc_t = 0
    if rc_t != 0 or rc_i != 0:
        print(f"pair.py: initiator exited {rc_i}, target {rc_t}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
