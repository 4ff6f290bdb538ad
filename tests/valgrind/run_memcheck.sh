#!/usr/bin/env bash
# run_memcheck.sh BUILD_DIR [TEST...] — the unit tests under valgrind's memcheck: no invalid
# read or write, no use of uninitialised memory, no leak (definite or indirect). Runs every
# test, then exits non-zero if valgrind or the test itself failed any of them.
#
# valgrind runs a program's threads one at a time, so the tests run side by side, up to
# MEMCHECK_JOBS at once (default: the number of CPUs), the longest first; each says its result
# as it ends. (On 2 cores the suite took 170 s one after the other in a CI run, and 85-110 s
# side by side: test_semantics alone takes 85-99 s of it.)
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

# One test under memcheck: its log in the build directory, its verdict on stdout in one
# write (with the log's last 30 lines where it failed), so that the verdicts of tests that
# end together do not interleave.
check() {
    local t=$1 start rc=0 verdict
    start=$(date +%s)
    valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect "$build/tests/$t" > "$build/memcheck_$t.log" 2>&1 ||
        rc=$?
    if [ $rc -eq 0 ]; then
        verdict="memcheck: $t clean ($(tail -n 1 "$build/memcheck_$t.log"), $(( $(date +%s) - start )) s)"
    else
        verdict="memcheck: $t FAILED (exit $rc; see $build/memcheck_$t.log)
$(tail -n 30 "$build/memcheck_$t.log")"
    fi
    printf '%s\n' "$verdict"
    return $rc
}

jobs=${MEMCHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}
if ! [[ $jobs =~ ^[0-9]+$ ]] || [ $((10#$jobs)) -lt 1 ]; then
    echo "memcheck: MEMCHECK_JOBS must be a positive number, not '$jobs'" >&2
    exit 2
fi
jobs=$((10#$jobs))
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
