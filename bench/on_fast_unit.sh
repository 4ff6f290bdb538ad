#!/usr/bin/env bash
# on_fast_unit.sh -- run a command pinned to a CPU whose AMX tile unit runs at its full rate now.
#
#     bench/on_fast_unit.sh build/cli/sdpa bench --threads 1 --shape 1,8,2048,2048,128,bf16
#     bench/on_fast_unit.sh /tmp/mk 1024 300 128
#
# On the shared virtual machines this project runs on, the tile unit of one vCPU or another
# slows 2.2-2.4 times for minutes at a time (docs/benchmarks.md), so that a one-thread figure
# of the AMX table taken at a random moment measures the machine. This script times a short
# loop of TDPBF16PS on each CPU the process may use (`isa_rates --unit`), runs the command
# under `taskset -c` on the first whose unit took at most FAST_TDP TSC cycles an instruction
# (default 17; 15 at the full rate on an Intel Xeon, model 207), and times the unit again
# after it, both on stderr: discard a figure whose "after" is slow. With no fast unit it
# retries every 5 seconds, for up to WAIT_S seconds (default 300), then fails (exit 3) and
# runs nothing. The command's exit status is the script's.
#
# It builds bench/isa_rates.c against build/libsdpa.a (cmake's build directory, or BUILD) into
# a temporary file when ISA_RATES does not name a built one. x86-64 Linux with AMX only.
set -euo pipefail

if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi

root=$(cd "$(dirname "$0")/.." && pwd)
fast=${FAST_TDP:-17}
wait_s=${WAIT_S:-300}
rates=${ISA_RATES:-}
tmp=
if [ -z "$rates" ]; then
    lib=${BUILD:-$root/build}/libsdpa.a
    if [ ! -f "$lib" ]; then
        echo "on_fast_unit.sh: $lib not found: build the library first (make), or set BUILD" >&2
        exit 2
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    rates=$tmp/isa_rates
    cc -O2 -I"$root/include" "$root/bench/isa_rates.c" "$lib" -lm -lpthread -o "$rates"
fi

# the CPUs this process may run on, one number each
cpu_list=$(python3 -c 'import os; print(" ".join(str(c) for c in sorted(os.sched_getaffinity(0))))')
deadline=$((SECONDS + wait_s))
while :; do
    for c in $cpu_list; do
        r=$(taskset -c "$c" "$rates" --unit) || exit 2
        if awk -v r="$r" -v f="$fast" 'BEGIN { exit !(r <= f) }'; then
            echo "on_fast_unit.sh: CPU $c, TDPBF16PS $r TSC cycles before" >&2
            status=0
            taskset -c "$c" "$@" || status=$?
            echo "on_fast_unit.sh: CPU $c, TDPBF16PS $(taskset -c "$c" "$rates" --unit) TSC" \
                "cycles after" >&2
            exit "$status"
        fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "on_fast_unit.sh: no CPU of ($cpu_list) had a unit at or under $fast TSC cycles per" \
            "TDPBF16PS in ${wait_s} s; nothing run" >&2
        exit 3
    fi
    sleep 5
done
