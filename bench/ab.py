#!/usr/bin/env python3
"""ab.py -- two builds of sdpa, interleaved on one machine: did a change move the speed?

    python3 bench/ab.py OLD/cli/sdpa NEW/cli/sdpa --rounds 5 --threads 2 --preset full
    python3 bench/ab.py A B --shape 1,16,1024,1024,64 --shape 1,16,1024,1024,64,causal
    python3 bench/ab.py OLD/cli/sdpa NEW/cli/sdpa --rounds 3 --threads 2 --preset decode
    python3 bench/ab.py OLD/cli/sdpa NEW/cli/sdpa --backward --shape 1,16,2048,2048,64

Each round runs `sdpa bench --json` once with each binary (A then B in odd rounds, B then A in
even ones, so that a slow minute of a shared machine does not always fall on the same side).
A run whose FMA peaks at its start and end differ by more than --peak-spread (default 10 %)
is dropped, with its round partner: on some of our virtual machines the two cores' FMA units
halve for minutes at a time, and such a run measures the machine, not the code. Where sdpa
bench also measured the AMX tile unit (kernels at the AMX level), its tile peaks must agree
too: the unit of one vCPU slows 2.2-2.4x for minutes at a time while the FMAs do not.

For each shape it prints the medians over the kept rounds of each binary's GFLOP/s and
%peak (GFLOP/s over the FMA peak measured in the same run), the ratios B/A of those medians,
and the spread of A against itself (the largest minus the smallest GFLOP/s over the kept
rounds, relative to A's median): the run-to-run noise to compare the ratios with. The runs
are interleaved, so slow drift of the machine cancels in the GFLOP/s ratio; the %peak ratio
also carries the noise of the peak probe. Environment variables (SDPA_MAX_ISA) pass through
to both binaries.

With --preset decode (or --bandwidth) the figures that matter are the cache's read rate: the
table shows each binary's median GB/s and %bw (GB/s over the read probe that sdpa bench runs at
the shape's working set, in the same run) and their ratios, and the FMA-peak check is off
unless --peak-spread is given (a decode step does not depend on the FMA units, and on these
machines their capacity moves far more often than the memory's).

With --best the figures are each run's fastest call (sdpa bench's gflops_best: the shape's
FLOPs over its shortest call) and, per binary, the best of them over the kept rounds, in
place of medians: on a machine that another tenant disturbs now and then, the fastest call is
the one it disturbed least, and when medians move by 15-50 % from round to round the best
times of interleaved runs still agree within a few percent. The spread column is then that of
A's best times. (Forward and backward FLOP rates only: not with --bandwidth.)

With --backward both binaries time sdpa_backward (`sdpa bench --backward`): the rates are the
backward's, and two more columns give each binary's median bwd/fwd (its backward's time over
its own forward's, timed alternately in the same run).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_bench(binary, args, out_json):
    cmd = [binary, "bench", "--json", out_json] + args
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"ab.py: {' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    with open(out_json) as f:
        return json.load(f)


def peaks_agree(j, spread):
    """The run's FMA peaks agree, and so do its AMX tile peaks where it measured them (a bf16
    forward on flash-amx: the tile unit has slow phases of its own, which the FMA peak does
    not show)."""
    for key in ("fma_gflops", "tile_gflops"):
        start, end = j["peak"]["start"].get(key), j["peak"]["end"].get(key)
        if start is None or end is None:
            continue
        if abs(start - end) > spread * max(start, end):
            return False
    return True


def peak_pair(j):
    """'start/end' of the FMA peak, and of the tile peak where measured ('-' for a missing
    figure)."""
    p = j["peak"]

    def pair(key):
        return "/".join("-" if p[w].get(key) is None else f"{p[w][key]:.0f}"
                        for w in ("start", "end"))

    text = pair("fma_gflops")
    if p["start"].get("tile_gflops") is not None or p["end"].get("tile_gflops") is not None:
        text += f" (tiles {pair('tile_gflops')})"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the first sdpa binary (the baseline)")
    ap.add_argument("b", help="the second sdpa binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--preset", default="full", choices=["quick", "full", "decode"])
    ap.add_argument("--shape", action="append", default=[], help="as sdpa bench --shape")
    ap.add_argument("--peak-spread", type=float, default=None,
                    help="drop a round whose FMA peaks, or AMX tile peaks where measured, "
                         "differ by more than this fraction (default 0.10; off for --preset "
                         "decode and --bandwidth)")
    ap.add_argument("--bandwidth", action="store_true",
                    help="compare GB/s and %%bw instead of GFLOP/s and %%peak")
    ap.add_argument("--min-time", help="as sdpa bench --min-time")
    ap.add_argument("--backward", action="store_true",
                    help="time sdpa_backward (sdpa bench --backward) instead of the forward")
    ap.add_argument("--softcap", help="as sdpa bench --softcap (both binaries must have it)")
    ap.add_argument("--alibi", action="store_true",
                    help="as sdpa bench --alibi (both binaries must have it)")
    ap.add_argument("--best", action="store_true",
                    help="compare each binary's fastest call over the rounds, not medians")
    ap.add_argument("--json", help="write every kept run here")
    o = ap.parse_args()
    if o.rounds < 1:
        ap.error("--rounds must be at least 1")
    for binary in (o.a, o.b):
        if not os.access(binary, os.X_OK):
            ap.error(f"{binary} is not an executable")

    bandwidth = o.bandwidth or (o.preset == "decode" and not o.shape)
    if o.best and bandwidth:
        ap.error("--best compares FLOP rates: not with --bandwidth or the decode preset")
    if o.peak_spread is None:
        o.peak_spread = float("inf") if bandwidth else 0.10
    args = ["--threads", str(o.threads)]
    if o.min_time is not None:
        args += ["--min-time", o.min_time]
    if o.backward:
        args.append("--backward")
    if o.softcap is not None:
        args += ["--softcap", o.softcap]
    if o.alibi:
        args += ["--alibi"]
    args += [x for s in o.shape for x in ("--shape", s)] if o.shape else ["--preset", o.preset]
    kept = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(o.rounds):
            order = [("a", o.a), ("b", o.b)] if r % 2 == 0 else [("b", o.b), ("a", o.a)]
            runs = {}
            for side, binary in order:
                runs[side] = run_bench(binary, args, os.path.join(tmp, f"{side}.json"))
            ok = all(peaks_agree(j, o.peak_spread) for j in runs.values())
            peaks = ", ".join(f"{s}: {peak_pair(runs[s])}" for s in ("a", "b"))
            print(f"round {r + 1}/{o.rounds}: peaks (GFLOP/s, start/end) {peaks}"
                  f"{'' if ok else '  -- peaks disagree, round dropped'}", file=sys.stderr)
            if ok:
                for side in ("a", "b"):
                    kept[side].append(runs[side])
    if not kept["a"]:
        sys.exit("ab.py: every round was dropped (the machine's peak moved within each run); "
                 "run again later")

    first = kept["a"][0]
    print(f"{len(kept['a'])} of {o.rounds} rounds kept; {first['cpu_model']}, "
          f"{first['threads']} threads; A: {o.a} ({first.get('kernel', first['isa'])}); "
          f"B: {o.b} ({kept['b'][0].get('kernel', kept['b'][0]['isa'])})")
    rate, pct = ("gbs", "pct_bandwidth") if bandwidth else ("gflops", "pct_peak")
    agg = max if o.best else statistics.median
    if o.best:  # each run's fastest call, and its %peak
        for runs in kept.values():
            for j in runs:
                for x in j["shapes"]:
                    x["pct_best"] = x["pct_peak"] * x["gflops_best"] / x["gflops"]
        rate, pct = "gflops_best", "pct_best"
        print("figures: each binary's fastest call over the kept rounds (--best)")
    rate_name, pct_name = ("GB/s", "%bw") if bandwidth else ("GFLOP/s", "%peak")
    print(f"{'shape':<36} {'A ' + rate_name:>9} {'B ' + rate_name:>9} {'B/A':>6} "
          f"{'A ' + pct_name:>8} {'B ' + pct_name:>8} {'B/A':>6} {'A spread':>9}"
          + (f" {'A bwd/fwd':>9} {'B bwd/fwd':>9}" if o.backward else ""))
    for n, shape in enumerate(first["shapes"]):
        col = {side: [j["shapes"][n] for j in kept[side]] for side in ("a", "b")}
        ga, gb = (agg(x[rate] for x in col[s]) for s in ("a", "b"))
        pa, pb = (agg(x[pct] for x in col[s]) for s in ("a", "b"))
        spread = [x[rate] for x in col["a"]]
        ratios = ""
        if o.backward:
            ra, rb = (statistics.median(x["bwd_over_fwd"] for x in col[s]) for s in ("a", "b"))
            ratios = f" {ra:9.2f} {rb:9.2f}"
        # the table that ran the shape (sdpa bench's per-shape kernel; older binaries lack it)
        ka, kb = (col[s][0].get("kernel", "?") for s in ("a", "b"))
        kernel = f"  {ka}" if ka == kb else f"  {ka} / {kb}: different tables"
        print(f"{shape['spec']:<36} {ga:9.1f} {gb:9.1f} {gb / ga:6.3f} {pa:8.1f} {pb:8.1f} "
              f"{pb / pa:6.3f} {(max(spread) - min(spread)) / ga * 100:8.1f}%{ratios}{kernel}")
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"a": kept["a"], "b": kept["b"]}, f, indent=1)


if __name__ == "__main__":
    main()
