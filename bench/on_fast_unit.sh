#!/usr/bin/env bash
# on_fast_unit.sh -- run a command pinned to a CPU whose AMX tile unit runs at its full rate now.
#
#     bench/on_fast_unit.sh build/cli/sdpa bench --threads 1 --shape 1,8,2048,2048,128,bf16
#     bench/on_fast_unit.sh /tmp/mk 1024 300 128    (bench/mx_kernels.c, built as it says)
#
# On the shared virtual machines this project runs on, the tile unit of one vCPU or another
# slows 2.2-2.4 times for minutes at a time (docs/benchmarks.md), so that a one-thread figure
# of the AMX table taken at a random moment measures the machine. This script times a short
# loop of TDPBF16PS on each CPU the process may use (`isa_rates --unit`), runs the command
# under `taskset -c` on the first whose unit took at most FAST_TDP TSC cycles an instruction
# (default 17; 13-15 at the full rate on an Intel Xeon, model 207), and times the unit again
# after it, both on stderr, the second marked "(slow)" past FAST_TDP: discard a figure whose
# unit was slow afterwards. The command runs on that one CPU, all its threads too: give it one
# thread. With no fast unit it retries every 5 seconds, for up to WAIT_S seconds (default
# 300). Exit status: the command's; or 2 (usage, no AMX or no tile permission, no library to
# build the probe against) or 3 (no fast unit in time) before the command has run.
#
# It builds bench/isa_rates.c against build/libsdpa.a (cmake's build directory, or BUILD) into
# a temporary file when ISA_RATES does not name a built one. x86-64 Linux with AMX only.
set -euo pipefail

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
}
if [ $# -eq 0 ]; then
    usage >&2
    exit 2
fi
if [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    usage
    exit 0
fi

number='^[0-9]+([.][0-9]+)?$'
fast=${FAST_TDP:-17}
wait_s=${WAIT_S:-300}
if ! [[ $fast =~ $number ]] || ! [[ $wait_s =~ ^[0-9]+$ ]]; then
    echo "on_fast_unit.sh: FAST_TDP must be a number of cycles and WAIT_S whole seconds" \
        "(not '$fast', '$wait_s')" >&2
    exit 2
fi

root=$(cd "$(dirname "$0")/.." && pwd)
rates=${ISA_RATES:-}
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

# The CPUs this process may run on ("0-3,6" in /proc/self/status), one number each.
cpu_list=
allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
IFS=, read -r -a ranges <<<"$allowed"
for range in "${ranges[@]}"; do
    first=${range%-*}
    last=${range#*-}
    for ((c = first; c <= last; c++)); do
        cpu_list="$cpu_list $c"
    done
done
if [ -z "$cpu_list" ]; then
    echo "on_fast_unit.sh: no CPU list in /proc/self/status (Linux only)" >&2
    exit 2
fi

# TDPBF16PS's TSC cycles on CPU $1 now, or exit 2 where the probe gives no number.
unit_rate() {
    local r
    r=$(taskset -c "$1" "$rates" --unit) || exit 2
    if ! [[ $r =~ $number ]]; then
        echo "on_fast_unit.sh: isa_rates --unit gave '$r', not a number of cycles" >&2
        exit 2
    fi
    echo "$r"
}

deadline=$((SECONDS + wait_s))
while :; do
    for c in $cpu_list; do
        r=$(unit_rate "$c")
        if awk -v r="$r" -v f="$fast" 'BEGIN { exit !(r + 0 <= f + 0) }'; then
            echo "on_fast_unit.sh: CPU $c, TDPBF16PS $r TSC cycles before" >&2
            status=0
            taskset -c "$c" "$@" || status=$?
            after=$(unit_rate "$c")
            slow=$(awk -v r="$after" -v f="$fast" 'BEGIN { print (r + 0 > f + 0) ? " (slow)" : "" }')
            echo "on_fast_unit.sh: CPU $c, TDPBF16PS $after TSC cycles after$slow" >&2
            exit "$status"
        fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "on_fast_unit.sh: no CPU of ($cpu_list ) had a unit at or under $fast TSC cycles" \
            "per TDPBF16PS in $wait_s s; nothing run" >&2
        exit 3
    fi
    sleep 5
done
