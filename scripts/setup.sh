#!/usr/bin/env bash
# Installs the Debian packages kvx needs, when they are missing: `kvx_setup` (or `kvx_setup test`)
# what scripts/test needs, `kvx_setup build` only what building the library and its tools needs,
# `kvx_setup bench` what scripts/bench needs (the build's packages: kvx-bench needs nothing more),
# `kvx_setup compare` what bench/compare needs on top (ucx_perftest, matplotlib), `kvx_setup nixl`
# what building NIXL for the NIXL plugin needs (scripts/nixl.sh; `test` includes it). Sourced by
# scripts/bench, scripts/test and bench/compare; safe to run again (it installs nothing twice).
set -euo pipefail

# building libkvx, kvx-bench and the examples
KVX_PACKAGES_BUILD=(
  gcc make cmake pkg-config          # the compiler and the build
  libucx-dev                         # UCX
  libssl-dev zlib1g-dev              # libcrypto (SHA-256, HMAC) and zlib (the metadata's CRC-32)
  python3                            # configuring the tests and the Python package needs it
)
# scripts/test, on top of the build
KVX_PACKAGES_TEST=(
  clang-format                       # the committed .clang-format is checked
  python3-pytest python3-numpy       # the Python binding's tests (NumPy index paths)
  python3-prometheus-client          # kvx.metrics' collector, scraped by test_metrics
  python3-pip                        # the vLLM plugin's test installs the package as a user does
  iproute2 procps                    # network namespaces for the two-host tests
  clang libclang-rt-14-dev           # the libFuzzer harness
  valgrind                           # the leak check
  autoconf automake libtool g++      # building UCX 1.19.1 from source (kvx_ucx119)
)
# NIXL 1.4.0, its Python binding and nixlbench built from source (scripts/nixl.sh, kvx_nixl140),
# for kvx's NIXL backend plugin (plugins/nixl) and its tests; scripts/test installs them too.
# libabsl-dev must stay uninstalled: NIXL builds its own Abseil, and an older system one makes
# NIXL's meson stop. etcd is not needed (nixlbench runs with --runtime_type=ASIO).
KVX_PACKAGES_NIXL=(
  g++ meson ninja-build              # the build (cmake, pkg-config: the build's list)
  python3-dev python3-numpy          # the Python binding (nixl._api imports NumPy)
  pybind11-dev python3-pybind11      # the binding's C++ side
  libgflags-dev                      # nixlbench's command line
  patch                              # the no-CUDA patches and nixlbench's KVX entry
)
# bench/compare, on top of the build. matplotlib is the heavy one: on a minimal Debian 12 these
# two add 100 packages, 574 MiB installed (105 MB to download: SciPy, SymPy, OpenBLAS and Boost
# headers come with python3-fonttools and python3-scipy), which scripts/bench does not need.
KVX_PACKAGES_COMPARE=(
  ucx-utils                          # ucx_perftest, bench/compare's reference
  python3-matplotlib                 # bench/compare's plot
)

# The packages of one purpose (build, test, bench, compare, nixl; test when none is given). bench
# is the main job, scripts/bench: kvx-bench needs what the build needs and nothing more.
kvx_packages() {
  case "${1:-test}" in
    build | bench) echo "${KVX_PACKAGES_BUILD[@]}" ;;
    test) echo "${KVX_PACKAGES_BUILD[@]}" "${KVX_PACKAGES_TEST[@]}" "${KVX_PACKAGES_NIXL[@]}" ;;
    compare) echo "${KVX_PACKAGES_BUILD[@]}" "${KVX_PACKAGES_COMPARE[@]}" ;;
    nixl) echo "${KVX_PACKAGES_BUILD[@]}" "${KVX_PACKAGES_NIXL[@]}" ;;
    *) echo "kvx: kvx_packages build|test|bench|compare|nixl, not $1" >&2; return 1 ;;
  esac
}

kvx_missing_packages() {
  local p list missing=()
  list=$(kvx_packages "${1:-test}")
  for p in $list; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]}"
}

kvx_setup() {
  local missing sudo=""
  missing=$(kvx_missing_packages "${1:-test}")
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

# UCX 1.19.1 (what current NIXL deployments run) built from its source tarball into a cache
# outside the clone, reused while the tarball is the same. Prints the install prefix, or nothing
# when the tarball is not found. The tarball: $KVX_UCX119_TARBALL, or ucx-1.19.1.tar.gz in
# ../shared/third_party beside the clone (or /work/shared/third_party).
kvx_ucx119() {
  local tarball="" c cache prefix stamp sum src log
  for c in "${KVX_UCX119_TARBALL:-}" "$KVX_ROOT/../shared/third_party/ucx-1.19.1.tar.gz" \
           /work/shared/third_party/ucx-1.19.1.tar.gz; do
    if [ -n "$c" ] && [ -f "$c" ]; then tarball=$c; break; fi
  done
  [ -n "$tarball" ] || return 0
  cache=${KVX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvx}
  prefix=$cache/ucx-1.19.1
  stamp=$prefix/.kvx-source-sha256
  sum=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ -f "$prefix/lib/pkgconfig/ucx.pc" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    echo "$prefix"
    return 0
  fi
  echo "kvx: building UCX 1.19.1 into $prefix (about 5 minutes, once)" >&2
  mkdir -p "$cache"
  src=$(mktemp -d "$cache/src.XXXXXX")
  log=$src.log
  rm -rf "$prefix"
  if ! (tar -xzf "$tarball" -C "$src" --strip-components=1 && cd "$src" && ./autogen.sh &&
        ./contrib/configure-release --prefix="$prefix" --enable-mt --without-cuda --without-rocm \
          --without-java --without-go --disable-doxygen-doc &&
        make -j "$(nproc)" && make install) >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "kvx: building UCX 1.19.1 failed (log: $log)" >&2
    rm -rf "$src" "$prefix"
    return 1
  fi
  echo "$sum" >"$stamp"
  rm -rf "$src" "$log"
  echo "$prefix"
}

KVX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
