#!/usr/bin/env python3
"""python_overhead.py -- what a call from Python costs beyond the C call, and Python's sdpa
beside `sdpa bench` and PyTorch at a prefill shape, in one run.

    python3 bench/python_overhead.py --threads 2            # after `make` and `pip install .`
    python3 bench/python_overhead.py --sdpa build/cli/sdpa --shape 1,16,2048,2048,64

Run it with an interpreter that has the package (`pip install .` at the root); torch is
optional (its column is left out without it). Figures:
  1. the call overhead at B=1 H=1 L=1 D=64 (issue 14's target: within 3 us of the C call):
     the median of many Python calls (sdpa.scaled_dot_product_attention on numpy arrays,
     with a fixed context) minus the median of `sdpa bench` at the same shape, which times
     sdpa_forward from C; both with the same thread count. Measured --repeat times, Python
     and C interleaved, then the median difference and its spread (min..max) across them.
     Beside it, the same call without context= (this thread's default context) and through
     the Python path that masks, torch tensors and bfloat16 take (the C fast path off);
  2. the prefill shape (default B=1 H=16 L=2048 D=64, f32): Python's sdpa, `sdpa bench`
     and torch.nn.functional.scaled_dot_product_attention, interleaved over --rounds rounds,
     medians, GFLOP/s = 4*B*H*L*L*D / time.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

import sdpa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_time(fn, reps, min_time):
    fn()
    times, spent = [], 0.0
    while len(times) < reps:
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        times.append(t)
        spent += t
        if spent >= min_time and len(times) >= 5:
            break
    return statistics.median(times)


def c_median(args, spec, reps, min_time):
    """sdpa bench's median for one shape, in seconds."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.json")
        subprocess.run([args.sdpa, "bench", "--shape", spec, "--threads", str(args.threads),
                        "--reps", str(reps), "--min-time", str(min_time), "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["shapes"][0]["ms_median"] / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sdpa", default=os.path.join(ROOT, "build", "cli", "sdpa"))
    ap.add_argument("--shape", default="1,16,2048,2048,64", help="B,H,Lq,Lk,D of figure 2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="measurements of figure 1")
    ap.add_argument("--no-prefill", action="store_true", help="figure 1 only")
    args = ap.parse_args()
    ctx = sdpa.Context(n_threads=args.threads)
    print("sdpa %s, kernel %s (isa %s), %d threads" % (sdpa.__version__, ctx.kernel, ctx.isa,
                                                       ctx.n_threads))

    # 1. call overhead
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 1, 64)).astype(np.float32) for _ in range(3))
    f = sdpa.scaled_dot_product_attention
    calls = {"context=ctx": lambda: f(q, k, v, context=ctx),
             "default context": lambda: f(q, k, v),
             "python path": lambda: f(q, k, v, context=ctx)}
    fast = sdpa._fast_forward
    diffs = {name: [] for name in calls}
    for _ in range(max(1, args.repeat)):
        c = c_median(args, "1,1,1,1,64", 20000, 1.0)
        for name, fn in calls.items():
            if name == "python path":
                sdpa._fast_forward = lambda *a: NotImplemented
            try:
                py = median_time(fn, 20000, 1.0)
            finally:
                sdpa._fast_forward = fast
            diffs[name].append(py - c)
            if name == "context=ctx":
                print("call overhead at B=1 H=1 L=1 D=64: Python %.2f us, C %.2f us, "
                      "difference %.2f us" % (py * 1e6, c * 1e6, (py - c) * 1e6))
    for name, ds in diffs.items():
        print("  %-16s Python - C: median %.2f us, spread %.2f..%.2f us over %d runs%s"
              % (name, statistics.median(ds) * 1e6, min(ds) * 1e6, max(ds) * 1e6, len(ds),
                 " (the target)" if name == "context=ctx" else ""))
    if args.no_prefill:
        return

    # 2. a prefill shape, interleaved
    b, h, lq, lk, d = (int(x) for x in args.shape.split(","))
    q = rng.standard_normal((b, h, lq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, lk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, lk, d)).astype(np.float32)
    flops = 4.0 * b * h * lq * lk * d
    try:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(args.threads)
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    except ImportError:
        torch = None
    rows = {"python sdpa": [], "sdpa bench (C)": [], "torch": []}
    for _ in range(args.rounds):
        rows["python sdpa"].append(median_time(
            lambda: sdpa.scaled_dot_product_attention(q, k, v, context=ctx), 20, 1.0))
        rows["sdpa bench (C)"].append(c_median(args, args.shape, 20, 1.0))
        if torch is not None:
            with torch.inference_mode():
                rows["torch"].append(median_time(
                    lambda: F.scaled_dot_product_attention(tq, tk, tv), 20, 1.0))
    print("\nB=%d H=%d Lq=%d Lk=%d D=%d f32, %d rounds interleaved (medians):"
          % (b, h, lq, lk, d, args.rounds))
    base = statistics.median(rows["sdpa bench (C)"])
    for name, ts in rows.items():
        if ts:
            t = statistics.median(ts)
            print("  %-16s %9.3f ms %8.1f GFLOP/s  %.3f x the C call's time"
                  % (name, t * 1e3, flops / t * 1e-9, t / base))


if __name__ == "__main__":
    main()
