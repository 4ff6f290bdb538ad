#!/usr/bin/env bash
# run_api_fuzz.sh [SECONDS] [BUILD_DIR] [-- LIBFUZZER_ARGS...] — builds the API fuzz target
# (tests/fuzz/fuzz_api.c with the library, the reference and tests/testutil.c) with
# clang -fsanitize=fuzzer,address,undefined into BUILD_DIR (default build-fuzz) and runs it
# for SECONDS (default 60) on one core.
#
# The committed seeds (tests/fuzz/corpus/api) are only read: new inputs go to
# BUILD_DIR/corpus-api, findings to BUILD_DIR/api-crash-* (or -leak-, -timeout-). The library
# is instrumented too (coverage and sanitizers): the fuzzer is steered by its branches, and a
# read outside a tensor is caught inside the kernel that makes it. A finding is minimised with
#     BUILD_DIR/fuzz_api -minimize_crash=1 -runs=100000 BUILD_DIR/api-crash-...
# and replayed with BUILD_DIR/fuzz_api FILE (stderr says what was violated, and the case).
# Environment: FUZZ_CC (default clang); FUZZ_CFLAGS, added to every compilation. One process:
# the machines are shared.
set -euo pipefail

seconds=${1:-60}
build=${2:-build-fuzz}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cc=${FUZZ_CC:-clang}
mkdir -p "$build/obj-api" "$build/corpus-api"

read -r -a extra <<<"${FUZZ_CFLAGS:-}" # several flags, split on spaces
# shellcheck disable=SC2054 # the commas belong to the flags
flags=(-std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
    -fno-sanitize-recover=all -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Itests "${extra[@]}")
# Coverage: everything is steered by edges; comparisons are traced (so the fuzzer can solve
# them) only where the decisions are, not in the inner loops of the kernels, the reference
# and the test oracle, where tracing every loop bound costs most of the time.
full_cov=(-fsanitize=fuzzer-no-link)
# shellcheck disable=SC2054 # the commas belong to the flag
edge_cov=(-fsanitize-coverage=inline-8bit-counters,pc-table)
# the library's portable sources, as CMakeLists.txt lists them (so a new file is not missed)
mapfile -t lib < <(sed -n '/^set(SDPA_SOURCES/,/)/p' CMakeLists.txt | grep -o 'src/[^ )]*\.c')
[ "${#lib[@]}" -gt 0 ] || {
    echo "run_api_fuzz.sh: no SDPA_SOURCES in CMakeLists.txt" >&2
    exit 1
}
x86=()
case "$(uname -m)" in
x86_64 | amd64)
    flags+=(-DSDPA_HAVE_X86)
    x86=(src/kernels/avx2/ukernels_avx2.c src/kernels/avx512/ukernels_avx512.c)
    ;;
esac

objs=()
compile() { # compile SOURCE [EXTRA_FLAGS...]
    local src=$1 obj cov=("${full_cov[@]}")
    shift
    case "$src" in
    src/attn/* | src/kernels/* | src/ref/* | src/thread/* | src/core/half.c | tests/testutil.c)
        cov=("${edge_cov[@]}") ;;
    esac
    obj="$build/obj-api/$(echo "$src" | tr / _).o"
    "$cc" "${flags[@]}" "${cov[@]}" "$@" -c "$src" -o "$obj"
    objs+=("$obj")
}
for s in "${lib[@]}" tests/testutil.c tests/fuzz/fuzz_api.c; do
    compile "$s"
done
for s in "${x86[@]}"; do
    case "$s" in
    *avx2*) compile "$s" -mavx2 -mfma ;;
    *) compile "$s" -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma ;;
    esac
done
"$cc" -fsanitize=fuzzer,address,undefined "${objs[@]}" -lm -pthread -o "$build/fuzz_api"

exec "$build/fuzz_api" -max_total_time="$seconds" -max_len=1024 -timeout=20 \
    -artifact_prefix="$build/api-" "$@" "$build/corpus-api" tests/fuzz/corpus/api
