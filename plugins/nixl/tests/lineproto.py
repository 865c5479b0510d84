"""The line protocol between the two processes of a pair run (pair.py starts them, each with its
standard input fed by the other's protocol output): one JSON object per line."""

import json
import os
import sys


def protocol():
    """The protocol keeps the real stdout; NIXL's and UCX's prints go to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def send(f, obj):
    f.write(json.dumps(obj) + "\n")
    f.flush()


def recv():
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the other side exited")
    return json.loads(line)
