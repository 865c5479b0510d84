#!/usr/bin/env bash
# Builds reply_ep.c against UCX 1.13.1 (Debian's) and 1.19.1 (~/.cache/kvx/ucx-1.19.1, as
# scripts/setup.sh builds it), runs each over shared memory (sysv) and tcp. Each run is two
# processes (R and a forked W, killed by R in phase 6; W also dies with R: PR_SET_PDEATHSIG).
# Output: results.txt beside this script. By hand only: it is no part of the test command
# (docs/design/catchup-endpoints.md says what it shows).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
U=~/.cache/kvx/ucx-1.19.1
gcc -std=gnu11 -O1 -g -Wall -o "$bin/reply_ep-1.13" "$here/reply_ep.c" $(pkg-config --cflags --libs ucx)
gcc -std=gnu11 -O1 -g -Wall -o "$bin/reply_ep-1.19" "$here/reply_ep.c" \
  $(PKG_CONFIG_PATH=$U/lib/pkgconfig pkg-config --cflags --libs ucx) -Wl,-rpath,$U/lib
for v in 1.13 1.19; do
  for tl in sysv tcp; do
    echo "=========== UCX $v, UCX_TLS=$tl"
    UCX_TLS=$tl timeout 90 "$bin/reply_ep-$v" 2>&1 | grep -v "invalid configuration: MM_ERROR_HANDLING"
  done
done | tee "$here/results.txt"
