#!/usr/bin/env bash
# run_fuzz.sh TARGET [SECONDS] [BUILD_DIR] [-- LIBFUZZER_ARGS...] — builds one fuzz target
# (npy_header, npy_load or api: tests/fuzz/README.md) under libFuzzer with ASan+UBSan and runs
# it for SECONDS (default 60) on one core.
#
# BUILD_DIR (default build-fuzz) is configured with the project's SDPA_FUZZ option, so the
# sources, the kernel tables' flags and the coverage that steers the fuzzer all come from
# CMakeLists.txt; the build is -O1 -g (fast, and a finding's stack keeps its frames). The
# committed seeds (tests/fuzz/corpus/TARGET) are only read: new inputs go to
# BUILD_DIR/corpus-TARGET, findings to BUILD_DIR/crash-* for the .npy targets and
# BUILD_DIR/api-crash-* for the API (or -leak-, -timeout-). A finding is minimised with
#     BUILD_DIR/tests/fuzz/fuzz_TARGET -minimize_crash=1 -runs=100000 CRASH
# and replayed with BUILD_DIR/tests/fuzz/fuzz_TARGET CRASH (the API target says on stderr
# what was violated, and the case). Environment: FUZZ_CC (default clang); FUZZ_CFLAGS, added
# to every compilation; JOBS, the build's parallel jobs (default: the number of cores).
set -euo pipefail

usage() {
    echo "usage: $0 npy_header|npy_load|api [SECONDS] [BUILD_DIR] [-- LIBFUZZER_ARGS...]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
target=$1
seconds=${2:-60}
build=${3:-build-fuzz}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift

# what each target is run with, beyond the time and the corpora: -max_len reaches past the
# .npy reader's 64 KiB header limit (libFuzzer still favours short inputs); an API input
# needs far less, and one slow case is a finding
case "$target" in
npy_header | npy_load)
    args=(-max_len=140000 -dict=tests/fuzz/npy.dict -artifact_prefix="$build/") ;;
api) args=(-max_len=1024 -timeout=20 -artifact_prefix="$build/api-") ;;
*) usage ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# Debug adds only -g, so the -O1 stays in force (Release would append -O3).
cmake -S . -B "$build" -DCMAKE_C_COMPILER="${FUZZ_CC:-clang}" -DSDPA_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="-O1 ${FUZZ_CFLAGS:-}" >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc 2>/dev/null || echo 2)}" --target "fuzz_$target"
mkdir -p "$build/corpus-$target"

exec "$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" "${args[@]}" "$@" \
    "$build/corpus-$target" "tests/fuzz/corpus/$target"
