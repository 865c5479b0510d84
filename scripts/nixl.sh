#!/usr/bin/env bash
# NIXL 1.4.0 (with its Python binding and nixlbench) built against UCX 1.19.1, from the source
# tarballs in ../shared/third_party, into a cache outside the clone, for kvx's NIXL backend plugin
# (plugins/nixl). Sourced by scripts/test and bench/compare; by hand:
#
#   source scripts/nixl.sh
#   ucx=$(kvx_ucx119)                 # scripts/setup.sh, or any UCX >= 1.19 prefix
#   nixl=$(kvx_nixl140 "$ucx")        # builds once (about 5 minutes on 2 cores), then reuses
#   PYTHONPATH=$(kvx_nixl140_pythonpath "$nixl") /usr/bin/python3 -c 'import nixl'
#   "$nixl/bin/nixlbench" --runtime_type=ASIO --backend=KVX ...
#
# The Debian packages it needs are scripts/setup.sh's `nixl` purpose (`kvx_setup nixl`; `kvx_setup
# test` installs them too); kvx_nixl140 installs nothing itself. nixlbench gets one change,
# plugins/nixl/nixlbench-kvx.patch: its list of backends it accepts names KVX too.
if ! declare -F kvx_packages >/dev/null; then
  source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
fi

# Bump when the recipe below changes in a way that changes the result: it is part of the key.
# 2: nixlbench accepts the backend KVX (plugins/nixl/nixlbench-kvx.patch).
KVX_NIXL_RECIPE=2

# The third_party directory holding the inputs, or nothing.
_kvx_nixl140_third_party() {
  local d
  for d in "${KVX_THIRD_PARTY:-}" "$KVX_ROOT/../shared/third_party" /work/shared/third_party; do
    if [ -n "$d" ] && [ -f "$d/nixl-1.4.0.tar.gz" ] && [ -f "$d/nixl-1.4.0-subprojects.tar.gz" ] &&
       [ -f "$d/nixl-1.4.0-no-cuda.patch" ] && [ -f "$d/nixlbench-1.4.0-no-cuda.patch" ]; then
      echo "$d"
      return 0
    fi
  done
}

# PYTHONPATH entries for `import nixl` from the prefix kvx_nixl140 printed.
kvx_nixl140_pythonpath() { echo "$1/lib/python3/dist-packages"; }

# The include directory of the Abseil NIXL was built with (out-of-tree plugins need it).
kvx_nixl140_absl() { echo "$1/share/kvx/abseil-cpp"; }

# The build itself, into $2 from the sources unpacked under $1 (kvx_nixl140 calls it, its output
# going to a log). Every step ends in `|| return 1`: `set -e` would be ignored here, the call
# being the condition of an `if`.
_kvx_nixl140_build() {
  local src=$1 prefix=$2 ucx=$3 tp=$4 py=$5 jobs=$6 kvxpatch=$7
  local site=$prefix/lib/python3/dist-packages meta=src/bindings/python/nixl-meta
  cd "$src" || return 1
  tar -xzf "$tp/nixl-1.4.0.tar.gz" || return 1
  tar -xzf "$tp/nixl-1.4.0-subprojects.tar.gz" -C nixl-1.4.0/subprojects || return 1
  cd nixl-1.4.0 || return 1
  patch -p1 <"$tp/nixl-1.4.0-no-cuda.patch" || return 1
  patch -p1 <"$tp/nixlbench-1.4.0-no-cuda.patch" || return 1
  patch -p1 <"$kvxpatch" || return 1
  # The image's PATH may put a python3 without NumPy or pybind11 first: name Debian's.
  printf "[binaries]\npython = '%s'\npython3 = '%s'\n" "$py" "$py" >"$src/native.ini" || return 1
  echo "== NIXL: meson setup"
  nice -n 10 meson setup "$src/build" --native-file "$src/native.ini" --prefix="$prefix" \
    --libdir=lib --buildtype=release -Ducx_path="$ucx" \
    -Ddisable_gds_backend=true -Ddisable_mooncake_backend=true -Dinstall_headers=true \
    -Dbuild_examples=false -Dbuild_tests=false \
    --force-fallback-for=asio,taskflow,tomlplusplus --wrap-mode=nodownload \
    "-Dcpp_link_args=-Wl,-rpath,$ucx/lib:$prefix/lib" || return 1
  echo "== NIXL: build"
  nice -n 10 ninja -C "$src/build" -j "$jobs" || return 1
  nice -n 10 meson install -C "$src/build" --quiet || return 1
  # `import nixl`: the front package (upstream, uv builds it into a wheel) beside nixl_cu12/
  [ -d "$site/nixl_cu12" ] || { echo "no $site/nixl_cu12"; return 1; }
  mkdir -p "$site/nixl" || return 1
  cp "$meta/nixl/__init__.py" "$meta/nixl/_api.py" "$meta/nixl/logging.py" "$site/nixl/" ||
    return 1
  cp "$meta/nixl_meta_utils.py" "$site/" || return 1
  # nixlbench, against the NIXL just installed (asio, tomlplusplus: the same subprojects)
  cd benchmark/nixlbench || return 1
  cp -r ../../subprojects/asio-1.30.2 ../../subprojects/tomlplusplus-3.4.0 subprojects/ ||
    return 1
  echo "== nixlbench: meson setup"
  nice -n 10 meson setup "$src/build-bench" --native-file "$src/native.ini" \
    --prefix="$prefix" --libdir=lib --buildtype=release -Dnixl_path="$prefix" \
    --force-fallback-for=asio,tomlplusplus --wrap-mode=nodownload \
    "-Dcpp_link_args=-Wl,-rpath,$prefix/lib:$ucx/lib" || return 1
  echo "== nixlbench: build"
  nice -n 10 ninja -C "$src/build-bench" -j "$jobs" || return 1
  nice -n 10 meson install -C "$src/build-bench" --quiet || return 1
  # Abseil's headers, for out-of-tree plugins (NIXL does not install them): kvx_nixl140_absl
  mkdir -p "$prefix/share/kvx/abseil-cpp" || return 1
  (cd "$src/nixl-1.4.0/subprojects/abseil-cpp-20250814.1" &&
     find absl \( -name '*.h' -o -name '*.inc' \) \
       -exec cp --parents -t "$prefix/share/kvx/abseil-cpp" {} +) || return 1
  # the check: the binding imports and finds the UCX plugin
  PYTHONPATH=$site "$py" -c 'import nixl, sys
a = nixl.nixl_agent("kvx-nixl-check", nixl.nixl_agent_config(backends=[]))
p = a.get_plugin_list()
print("plugins:", p)
sys.exit(0 if "UCX" in p else 1)' || return 1
}

# Build NIXL 1.4.0 against the UCX installed at $1 (>= 1.19) into
# ${KVX_CACHE_DIR:-~/.cache/kvx}/nixl-1.4.0, once: the build is reused while the sha256 of its
# inputs (the tarballs, the patches, the UCX it was built against, this recipe) is the same.
# Prints the install prefix; prints nothing when the tarballs are not found. Quiet unless the
# build fails (then the log's tail goes to stderr and it returns 1). Builds with nice -n 10 and
# KVX_NIXL_JOBS (default 2) jobs. Needs the packages of `kvx_packages nixl`.
kvx_nixl140() {
  local ucx=${1:-} tp cache prefix stamp sum src log py=/usr/bin/python3 jobs=${KVX_NIXL_JOBS:-2}
  local kvxpatch=$KVX_ROOT/plugins/nixl/nixlbench-kvx.patch
  if [ -z "$ucx" ] || [ ! -f "$ucx/include/ucp/api/ucp.h" ]; then
    echo "kvx: kvx_nixl140 UCX_PREFIX (a UCX >= 1.19 install), not '${ucx}'" >&2
    return 1
  fi
  ucx=$(cd "$ucx" && pwd)
  tp=$(_kvx_nixl140_third_party)
  [ -n "$tp" ] || return 0
  cache=${KVX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvx}
  prefix=$cache/nixl-1.4.0
  stamp=$prefix/.kvx-source-sha256
  # the key: every input's sha256, the UCX prefix and its own stamp (kvx_ucx119 writes one)
  sum=$({ sha256sum "$tp/nixl-1.4.0.tar.gz" "$tp/nixl-1.4.0-subprojects.tar.gz" \
            "$tp/nixl-1.4.0-no-cuda.patch" "$tp/nixlbench-1.4.0-no-cuda.patch" "$kvxpatch" |
            cut -d' ' -f1
          echo "ucx=$ucx"; cat "$ucx/.kvx-source-sha256" 2>/dev/null || true
          echo "recipe=$KVX_NIXL_RECIPE"; } | sha256sum | cut -d' ' -f1)
  if [ -f "$prefix/lib/libnixl.so" ] && [ -x "$prefix/bin/nixlbench" ] &&
     [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    echo "$prefix"
    return 0
  fi
  echo "kvx: building NIXL 1.4.0 against $ucx into $prefix (about 5 minutes, once)" >&2
  mkdir -p "$cache"
  src=$(mktemp -d "$cache/nixl-src.XXXXXX")
  log=$src.log
  rm -rf "$prefix"
  if ! (_kvx_nixl140_build "$src" "$prefix" "$ucx" "$tp" "$py" "$jobs" "$kvxpatch") >"$log" 2>&1
  then
    tail -40 "$log" >&2
    echo "kvx: building NIXL 1.4.0 failed (log: $log, sources: $src)" >&2
    rm -rf "$prefix"
    return 1
  fi
  echo "$sum" >"$stamp"
  rm -rf "$src" "$log"
  echo "$prefix"
}
