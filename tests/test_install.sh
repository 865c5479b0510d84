#!/usr/bin/env bash
# The install path a newcomer follows: `cmake --install` into a fresh prefix (not /usr/local),
# then a program built with pkg-config alone, and the installed kvx-bench run without any help.
#   test_install.sh <build dir> <source dir> <C compiler> [extra C flags, e.g. the sanitizers]
# Checks that kvx.pc names the prefix installed into, that the example compiles and links from
# it (shared, and static through Libs.private / Requires.private), that the program runs and
# checks its transfers, and that bin/kvx-bench finds bin/../lib's libkvx on its own.
set -euo pipefail
build=$1 src=$2 cc=${3:-cc} cflags=${4:-}

prefix=$(mktemp -d /tmp/kvx-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# the libkvx a program loads, as a real path (empty when none is found)
loaded_kvx() { ldd "$1" | awk '/libkvx\.so/ && $3 ~ /^\// {print $3}' | xargs -r realpath; }

cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name kvx.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no kvx.pc under $prefix"
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

# kvx.pc must point into the prefix, whatever the prefix was at configure time
incdir=$(pkg-config --variable=includedir kvx)
libdir=$(pkg-config --variable=libdir kvx)
echo "kvx.pc: $pc; includedir=$incdir libdir=$libdir"
[ "$(realpath -m "$incdir")" = "$(realpath "$prefix")/include" ] ||
    fail "kvx.pc's includedir is $incdir, not $prefix/include"
[ -f "$incdir/kvx.h" ] || fail "kvx.h is not in $incdir"
[ -f "$libdir/libkvx.so" ] || fail "libkvx.so is not in $libdir"

# the example, built the way the README says, from the installed files only
work="$prefix/app"
mkdir -p "$work"
# shellcheck disable=SC2046,SC2086
"$cc" $cflags "$src/examples/write_read.c" $(pkg-config --cflags --libs kvx) -o "$work/write_read" ||
    fail "cc write_read.c \$(pkg-config --cflags --libs kvx) failed"
# run as the README says: the loader finds libkvx through LD_LIBRARY_PATH (or ldconfig's cache)
export LD_LIBRARY_PATH="$libdir"
[ "$(loaded_kvx "$work/write_read")" = "$(realpath "$libdir"/libkvx.so)" ] ||
    fail "write_read does not load the installed libkvx: $(ldd "$work/write_read" | grep kvx)"
"$work/write_read" || fail "the installed write_read failed"
unset LD_LIBRARY_PATH

# static: libkvx.a with what pkg-config --static says it needs
static_libs=$(pkg-config --static --libs kvx | sed 's/\(^\| \)-lkvx\( \|$\)/ /')
# shellcheck disable=SC2086
"$cc" $cflags "$src/examples/write_read.c" $(pkg-config --cflags kvx) "$libdir/libkvx.a" $static_libs \
    -o "$work/write_read_static" || fail "static link with pkg-config --static --libs kvx failed"
ldd "$work/write_read_static" | grep -q libkvx && fail "the static build still loads libkvx.so"
"$work/write_read_static" || fail "the static write_read failed"

# the installed kvx-bench, with no LD_LIBRARY_PATH: its runtime path must find the library
bench="$prefix/bin/kvx-bench"
[ -x "$bench" ] || fail "no $bench"
env -u LD_LIBRARY_PATH "$bench" --help >/dev/null 2>&1 ||
    fail "installed kvx-bench --help: $(env -u LD_LIBRARY_PATH "$bench" --help 2>&1 | head -2)"
[ "$(loaded_kvx "$bench")" = "$(realpath "$libdir"/libkvx.so)" ] ||
    fail "kvx-bench does not load the installed libkvx: $(ldd "$bench" | grep kvx)"
env -u LD_LIBRARY_PATH "$bench" --loopback -s 64K -r 4M -n 2 -w 1 --quiet >/dev/null ||
    fail "installed kvx-bench --loopback failed"
echo "install into $prefix: kvx.pc, shared and static builds, kvx-bench: ok"
