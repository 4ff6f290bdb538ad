#!/usr/bin/env bash
# run_memcheck.sh BUILD_DIR [TEST...] — the unit tests under valgrind's memcheck: no invalid
# read or write, no use of uninitialised memory, no leak (definite or indirect). Runs every
# test, then exits non-zero if valgrind or the test itself failed any of them.
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
    tests=(test_seeds test_properties test_validate_ctx test_validate_tensors test_validate_memory
           test_validate_params test_validate_legal test_half test_threads test_pool test_golden
           test_semantics)
fi
command -v valgrind >/dev/null 2>&1 || { echo "memcheck: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

export SDPA_MAX_ISA=avx2
failed=0
for t in "${tests[@]}"; do
    exe="$build/tests/$t"
    if [ ! -x "$exe" ]; then
        echo "memcheck: $exe is missing (build first)" >&2
        exit 1
    fi
    start=$(date +%s)
    if valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect "$exe" > "$build/memcheck_$t.log" 2>&1; then
        echo "memcheck: $t clean ($(tail -n 1 "$build/memcheck_$t.log"), $(( $(date +%s) - start )) s)"
    else
        echo "memcheck: $t FAILED (see $build/memcheck_$t.log)"
        tail -n 30 "$build/memcheck_$t.log"
        failed=1
    fi
done
exit $failed
