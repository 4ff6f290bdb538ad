#!/usr/bin/env python3
"""decode_kernels_ab.py -- bench/decode_kernels.c linked against two builds of the library,
run interleaved on one CPU: did a change move a decode step's kernels?

    python3 bench/decode_kernels_ab.py OLD/libsdpa.a NEW/libsdpa.a \
        [--rounds 8] [--keys 512] [--reps 6000] [--isa avx512,avx2] \
        [--types f32,f16,bf16] [--rows 1,2,4] [--cpu N]

For each (table, cache type, rows) it runs the two programs one after the other, --rounds
times, pinned to one CPU (the last online one unless --cpu), and prints a Markdown table: TSC
cycles per key of qk, the softmax and P V, the fastest of the rounds for each build, and the
new/old ratio of the whole step by the fastest and by the median round. On a shared machine
the ratios of configurations a change did not touch show how far to trust the others.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARTS = ("qk", "softmax", "pv", "all")


def build(lib, out):
    cmd = ["cc", "-O2", "-I" + os.path.join(ROOT, "include"),
           os.path.join(HERE, "decode_kernels.c"), lib, "-lm", "-lpthread", "-o", out]
    subprocess.run(cmd, check=True)


def run(prog, args, cpu):
    out = subprocess.run(["taskset", "-c", str(cpu), prog] + args, check=True,
                         capture_output=True, text=True).stdout
    got = dict((k, float(v)) for k, v in re.findall(r"(qk|softmax|pv|all) ([\d.]+)", out))
    if set(got) != set(PARTS):
        sys.exit("decode_kernels_ab: unexpected output: " + out)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="the baseline's libsdpa.a")
    ap.add_argument("new", help="the changed build's libsdpa.a")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--keys", type=int, default=512)
    ap.add_argument("--reps", type=int, default=6000)
    ap.add_argument("--isa", default="avx512,avx2")
    ap.add_argument("--types", default="f32,f16,bf16")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("decode_kernels_ab: --rounds must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        progs = {"old": os.path.join(tmp, "dk_old"), "new": os.path.join(tmp, "dk_new")}
        build(a.old, progs["old"])
        build(a.new, progs["new"])
        print("| table | cache | rows | qk | softmax | P V | all | new/old (fastest) "
              "| new/old (median) |")
        print("|---|---|---:|---|---|---|---|---:|---:|")
        for isa in a.isa.split(","):
            for t in a.types.split(","):
                for r in a.rows.split(","):
                    args = [str(a.keys), str(a.reps), t, isa, r]
                    got = {"old": [], "new": []}
                    for _ in range(a.rounds):
                        for b in ("old", "new"):
                            got[b].append(run(progs[b], args, a.cpu))
                    best = {b: {p: min(x[p] for x in got[b]) for p in PARTS} for b in got}
                    med = {b: statistics.median(x["all"] for x in got[b]) for b in got}
                    cells = " | ".join("%.1f → %.1f" % (best["old"][p], best["new"][p])
                                       for p in PARTS)
                    print("| %s | %s | %s | %s | %.2f | %.2f |" % (
                        isa, t, r, cells, best["new"]["all"] / best["old"]["all"],
                        med["new"] / med["old"]), flush=True)


if __name__ == "__main__":
    main()
