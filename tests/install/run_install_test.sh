#!/usr/bin/env bash
# run_install_test.sh BUILD_DIR SOURCE_DIR — checks that an installed sdpa can be used.
#
# Installs the build into a fresh temporary prefix (removed on exit), checks that the header,
# both libraries, sdpa.pc and the CMake package are there, then builds consumer.c the two ways
# users do — with `pkg-config sdpa` (shared with an rpath, and static via Libs.private) and
# with find_package(sdpa) in the small project next to this script — and runs every program.
# Any failure exits non-zero. Needs pkg-config (apt-get install pkg-config), cmake and cc.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
here="$src/tests/install"
cc=${CC:-cc}

fail() {
    echo "install test: FAIL: $*" >&2
    exit 1
}

command -v pkg-config >/dev/null 2>&1 ||
    fail "pkg-config is not installed (apt-get install pkg-config)"
command -v cmake >/dev/null 2>&1 || fail "cmake is not installed"
command -v "$cc" >/dev/null 2>&1 || fail "no C compiler '$cc' (set CC)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdpa-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }

# The libraries go to CMAKE_INSTALL_LIBDIR, which is not always "lib": find it from sdpa.pc.
pcfile=$(find "$prefix" -name sdpa.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pcfile" ] || fail "no pkgconfig/sdpa.pc under $prefix"
libdir=$(dirname "$(dirname "$pcfile")")
for f in "$prefix/include/sdpa.h" "$libdir/libsdpa.a" "$libdir/libsdpa.so" \
    "$libdir/cmake/sdpa/sdpaConfig.cmake" "$libdir/cmake/sdpa/sdpaConfigVersion.cmake" \
    "$libdir/cmake/sdpa/sdpaTargets.cmake"; do
    [ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done

warn=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

# ---- pkg-config -----------------------------------------------------------------------------
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# The .pc file must describe where it was installed, not the configure-time prefix.
pc_libdir=$(pkg-config --variable=libdir sdpa)
[ "$(cd "$pc_libdir" 2>/dev/null && pwd -P)" = "$(cd "$libdir" && pwd -P)" ] ||
    fail "sdpa.pc says libdir=$pc_libdir, but the library is in $libdir"
echo "== pkg-config sdpa: $(pkg-config --modversion sdpa):" \
    "$(pkg-config --cflags --libs sdpa)"

# Shared: the package's flags alone, plus an rpath so the program finds libsdpa.so.
# shellcheck disable=SC2046 # pkg-config output is meant to be word-split.
"$cc" "${warn[@]}" -o "$tmp/consumer_pc_shared" "$here/consumer.c" \
    $(pkg-config --cflags --libs sdpa) -Wl,-rpath,"$pc_libdir" ||
    fail "building consumer.c with pkg-config (shared) failed"

# Static: libsdpa.a by name, and what it needs from `pkg-config --static` (Libs.private).
static_flags=$(pkg-config --cflags --libs --static sdpa)
# shellcheck disable=SC2086 # word-split on purpose.
"$cc" "${warn[@]}" -o "$tmp/consumer_pc_static" "$here/consumer.c" \
    ${static_flags//-lsdpa/-l:libsdpa.a} ||
    fail "building consumer.c with pkg-config --static failed"

# ---- find_package(sdpa) ---------------------------------------------------------------------
echo "== find_package(sdpa) with CMAKE_PREFIX_PATH=$prefix"
cmake -S "$here" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="${warn[*]}" >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log" >&2; fail "configuring tests/install/CMakeLists.txt failed"; }
grep -- '-- found sdpa' "$tmp/cmake.log" || true
cmake --build "$tmp/consumer-build" >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log" >&2; fail "building the find_package consumer failed"; }

# ---- run them all ---------------------------------------------------------------------------
# Nothing may come from the build tree or the environment: unset LD_LIBRARY_PATH.
for prog in "$tmp/consumer_pc_shared" "$tmp/consumer_pc_static" \
    "$tmp/consumer-build/consumer_shared" "$tmp/consumer-build/consumer_static"; do
    name=${prog#"$tmp"/}
    echo "== $name"
    env -u LD_LIBRARY_PATH "$prog" || fail "$name exited with status $?"
done

# The static programs must not load libsdpa.so, and the shared ones must load the installed one.
if command -v ldd >/dev/null 2>&1; then
    for prog in "$tmp/consumer_pc_static" "$tmp/consumer-build/consumer_static"; do
        ! env -u LD_LIBRARY_PATH ldd "$prog" | grep -q 'libsdpa' ||
            fail "${prog#"$tmp"/} is linked to libsdpa.so, not libsdpa.a"
    done
    for prog in "$tmp/consumer_pc_shared" "$tmp/consumer-build/consumer_shared"; do
        loaded=$(env -u LD_LIBRARY_PATH ldd "$prog" | awk '/libsdpa/ { print $3 }')
        loaded_dir=$(cd "$(dirname "${loaded:-/nonexistent/x}")" 2>/dev/null && pwd -P) ||
            loaded_dir=""
        if [ "$loaded_dir" != "$(cd "$libdir" && pwd -P)" ]; then
            fail "${prog#"$tmp"/} loads '${loaded}', not libsdpa.so from $libdir"
        fi
    done
fi

echo "install test: ok"
