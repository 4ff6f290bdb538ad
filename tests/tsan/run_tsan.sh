#!/usr/bin/env bash
# run_tsan.sh BUILD_DIR [SOURCE_DIR] — the thread pool and the determinism tests under
# ThreadSanitizer (testing.md, "Determinism").
#
# Configures a separate build in BUILD_DIR with the project's SDPA_TSAN option
# (ThreadSanitizer cannot be combined with the AddressSanitizer build), builds test_pool,
# test_properties (which compares results across thread counts), test_threads,
# test_backward_schedules (its determinism cases only: the tiled backward's chunk tasks, dQ
# sums and two-pass fallback over 1 to 16 threads, on the best table alone, which the test
# says and explains; the rest of it is single-threaded work against the reference) and
# test_merge (its determinism case: sdpa_merge's row tasks over 1 to 7 threads), and runs
# them with halt_on_error=1, so that a data race fails the test instead of only printing a
# report. The compiler is $CC or cc; gcc >= 7 and clang both support -fsanitize=thread.
# Exits non-zero on any failure.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 BUILD_DIR [SOURCE_DIR]" >&2
    exit 2
fi
build=$1
src=${2:-"$(dirname "$0")/../.."}
src=$(cd "$src" && pwd)
tests=(test_pool test_properties test_threads test_backward_schedules test_merge)
# the cases a test runs here (check.h: a substring of the case names), when not all of them
declare -A cases=([test_backward_schedules]=test_deterministic [test_merge]=test_deterministic)

fail() {
    echo "tsan: FAIL: $*" >&2
    exit 1
}

command -v cmake >/dev/null 2>&1 || fail "cmake is not installed"

# Debug adds only -g, so SDPA_TSAN's -O1 stays in force (Release would append -O3).
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DSDPA_TSAN=ON -DSDPA_SANITIZE=OFF \
    -DSDPA_BUILD_CLI=OFF -DSDPA_BUILD_TESTS=ON >/dev/null ||
    fail "configure failed"
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$build" -j "$jobs" --target "${tests[@]}" || fail "build failed"

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"

# Some kernels randomise mmap more than older TSan runtimes expect ("unexpected memory
# mapping"); the usual remedy is to run the program without address randomisation.
run() {
    local log
    log=$(mktemp "${TMPDIR:-/tmp}/sdpa-tsan.XXXXXX")
    local rc=0
    "$@" >"$log" 2>&1 || rc=$?
    if [ $rc -ne 0 ] && grep -q "unexpected memory mapping" "$log" &&
        command -v setarch >/dev/null 2>&1; then
        echo "tsan: note: rerunning without ASLR (setarch -R): this kernel's mmap layout"
        rc=0
        setarch "$(uname -m)" -R "$@" >"$log" 2>&1 || rc=$?
    fi
    cat "$log"
    rm -f "$log"
    return $rc
}

failed=0
for t in "${tests[@]}"; do
    echo "tsan: $t"
    if ! run "$build/tests/$t" ${cases[$t]:-}; then
        echo "tsan: FAIL: $t" >&2
        failed=1
    fi
done
[ $failed -eq 0 ] || exit 1
echo "tsan: ok (${tests[*]})"
