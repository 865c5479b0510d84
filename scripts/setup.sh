#!/usr/bin/env bash
# Installs the Debian packages kvx's build, tests and benchmarks need, when they are missing.
# Sourced by scripts/bench and scripts/test; safe to run again (it installs nothing twice).
set -euo pipefail

KVX_PACKAGES=(
  gcc make cmake pkg-config          # build
  clang-format                       # the committed .clang-format is checked
  libucx-dev ucx-utils               # UCX and its ucx_perftest (the reference in bench/compare)
  python3 python3-pytest             # the Python binding and its tests
  iproute2 procps                    # network namespaces for the two-host tests
  clang libclang-rt-14-dev           # the libFuzzer harness
  valgrind                           # the leak check
)

kvx_missing_packages() {
  local p missing=()
  for p in "${KVX_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]}"
}

kvx_setup() {
  local missing sudo=""
  missing=$(kvx_missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "kvx: need root (or sudo) to install: $missing" >&2; return 1; }
    sudo="sudo"
  fi
  echo "kvx: installing $missing" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  # shellcheck disable=SC2086
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2
}

# Configure and build into $1 (default build/) with the extra CMake arguments that follow.
# Quiet unless the build fails (with -Werror, any warning fails it).
kvx_build() {
  local dir=${1:-build}
  shift || true
  cmake --no-warn-unused-cli -S "$KVX_ROOT" -B "$KVX_ROOT/$dir" -DKVX_WERROR=ON \
    -DPython3_EXECUTABLE=/usr/bin/python3 \
    "$@" >/dev/null
  local log
  log=$(mktemp)
  if ! cmake --build "$KVX_ROOT/$dir" -j "$(nproc)" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

KVX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
