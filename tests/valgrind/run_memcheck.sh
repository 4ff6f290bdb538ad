#!/usr/bin/env bash
# run_memcheck.sh BUILD_DIR [TEST...] — the unit tests under valgrind's memcheck: no invalid
# read or write, no use of uninitialised memory, no leak (definite or indirect). Runs every
# test, then exits non-zero if valgrind or the test itself failed any of them.
#
# valgrind runs a program's threads one at a time, so the tests run side by side, up to
# MEMCHECK_JOBS at once (default: the number of CPUs), the longest first; each says its result
# as it ends. (One after the other they took 170 s of a CI run on 2 cores, test_semantics 91.)
#
# valgrind 3.19 does not decode AVX-512, so the library is capped at AVX2 (SDPA_MAX_ISA) for
# these runs; the AVX-512 kernels are covered by the ASan and TSan builds.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [TEST...]" >&2
    exit 2
fi
build=$1
shift
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(test_semantics test_pool test_threads test_half test_golden test_validate_legal
           test_seeds test_properties test_validate_ctx test_validate_tensors test_validate_memory
           test_validate_params)
fi
command -v valgrind >/dev/null 2>&1 || { echo "memcheck: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

export SDPA_MAX_ISA=avx2
for t in "${tests[@]}"; do
    if [ ! -x "$build/tests/$t" ]; then
        echo "memcheck: $build/tests/$t is missing (build first)" >&2
        exit 1
    fi
done

# one test under memcheck: its log in the build directory, its verdict on stdout
check() {
    local t=$1 start rc=0
    start=$(date +%s)
    valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect "$build/tests/$t" > "$build/memcheck_$t.log" 2>&1 ||
        rc=$?
    if [ $rc -eq 0 ]; then
        echo "memcheck: $t clean ($(tail -n 1 "$build/memcheck_$t.log"), $(( $(date +%s) - start )) s)"
    else
        echo "memcheck: $t FAILED (exit $rc; see $build/memcheck_$t.log)"
        tail -n 30 "$build/memcheck_$t.log"
    fi
    return $rc
}

jobs=${MEMCHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}
case $jobs in
'' | *[!0-9]* | 0)
    echo "memcheck: MEMCHECK_JOBS must be a positive number, not '$jobs'" >&2
    exit 2
    ;;
esac
failed=0
running=0
for t in "${tests[@]}"; do
    if [ $running -ge "$jobs" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
    check "$t" &
    running=$((running + 1))
done
while [ $running -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
exit $failed
