#!/usr/bin/env python3
"""run_peers.py -- sdpa side by side with its peers, same shapes, same threads, same machine.

Re-run it from the repository root (after `make`, which builds build/cli/sdpa):

    python3 bench/peers/run_peers.py --threads 2                  # quick preset
    python3 bench/peers/run_peers.py --threads 2 --preset full    # the targets of issue 3
    python3 bench/peers/run_peers.py --threads 2 --shape 1,16,1024,1024,64,causal
    python3 bench/peers/run_peers.py --python /path/to/python     # an interpreter that already
                                                                   # has torch 2.x and numpy

Without --python it creates a virtual environment in bench/peers/.venv (git ignores it) and
pip-installs numpy and the CPU build of torch into it, once; later runs reuse it.

What it does:
  1. runs `sdpa bench --json` (the binary given by --sdpa) at the preset's shapes or the
     --shape ones. sdpa bench also measures this machine's FP32 FMA peak at its start and end.
     It runs first because its JSON is the one definition of the shapes (the presets live in
     cli/bench.c), so the peers are timed at exactly the shapes sdpa was;
  2. in the peers' interpreter (a child process of this script), with the same thread count:
     - PyTorch torch.nn.functional.scaled_dot_product_attention, f32, CPU,
       torch.set_num_threads(N), under torch.inference_mode();
     - the seeds' numpy code: scores = Q @ K^T / sqrt(d); softmax(scores) row by row
       (exp(x - max) / sum); output = weights @ V, over all heads at once with numpy
       broadcasting, so it materialises (B, H, Lq, Lk) arrays. Shapes whose three live
       Lq x Lk buffers would exceed --numpy-max-gb (default 3 GB) are skipped, and the table
       says so. numpy's BLAS gets N threads through OPENBLAS/OMP/MKL_NUM_THREADS;
  3. measures the FMA peak once more (a tiny `sdpa bench` run) and prints a table: per shape
     the GFLOP/s of sdpa, torch and numpy, the ratio sdpa/torch, and each as a % of the FMA
     peak that sdpa bench measured (the higher of start and end), then a warning if the peaks
     of the run differ by more than 15 % (the machine was busy: rerun).

The FLOP count is sdpa bench's: 4 * B * Hq * D * (visible (query, key) pairs); with causal
only the visible pairs count, for every implementation, although numpy computes them all.
Timing follows sdpa bench: warm-up calls, then repetitions until --reps are done or --min-time
seconds are spent (at least one), and the median. Inputs are uniform in [-1, 1) from fixed
seeds. Grouped-query shapes (Hq > Hkv) use enable_gqa where torch has it (2.5+); otherwise,
and for numpy, K and V are expanded to Hq heads before the clock starts.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.join(HERE, ".venv")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# --------------------------------------------------------------------------------------------
# The peers, measured in a child process that runs this file with --worker JOB OUT
# --------------------------------------------------------------------------------------------

def time_calls(fn, warmup, reps, min_time):
    """Calls fn warmup times untimed, then until reps calls or min_time seconds (at least one
    call); returns the list of the timed calls' seconds, as sdpa bench does."""
    for _ in range(warmup):
        fn()
    times, spent = [], 0.0
    while len(times) < reps:
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        times.append(t)
        spent += t
        if spent >= min_time:
            break
    return times


def summary(times, flops):
    med = statistics.median(times)
    return {"reps": len(times), "ms_median": med * 1e3, "ms_min": min(times) * 1e3,
            "ms_max": max(times) * 1e3, "gflops": flops / med * 1e-9}


def visibility(np, s):
    """The bool (Lq, Lk) mask of visible pairs for a causal shape, or None."""
    if not s["causal"]:
        return None
    off = s["Lk"] - s["Lq"] if s["align"] == "bottom-right" else 0
    i = np.arange(s["Lq"])[:, None]
    j = np.arange(s["Lk"])[None, :]
    return j <= i + off


def worker(job_path, out_path):
    job = json.load(open(job_path))
    n = job["threads"]
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(n)
    results = {"torch_version": torch.__version__, "numpy_version": np.__version__,
               "torch_threads": torch.get_num_threads(), "shapes": []}
    try:  # enable_gqa arrived in torch 2.5
        x = torch.zeros(1, 2, 1, 4)
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        has_gqa = True
    except TypeError:
        has_gqa = False
    rng = np.random.default_rng(0)
    for s in job["shapes"]:
        B, Hq, Hkv, Lq, Lk, D = (s[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "D"))
        g = Hq // Hkv
        sys.stderr.write("\r\033[K  peers: %s" % s["spec"] if sys.stderr.isatty() else "")
        q = rng.uniform(-1, 1, (B, Hq, Lq, D)).astype(np.float32)
        k = rng.uniform(-1, 1, (B, Hkv, Lk, D)).astype(np.float32)
        v = rng.uniform(-1, 1, (B, Hkv, Lk, D)).astype(np.float32)
        vis = visibility(np, s)
        row = {"spec": s["spec"]}

        # PyTorch: is_causal is top-left; bottom-right needs an explicit bool mask.
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        kw = {}
        if g > 1 and has_gqa:
            kw["enable_gqa"] = True
        elif g > 1:
            tk, tv = tk.repeat_interleave(g, dim=1), tv.repeat_interleave(g, dim=1)
        if s["causal"] and s["align"] == "top-left":
            kw["is_causal"] = True
        elif s["causal"]:
            kw["attn_mask"] = torch.from_numpy(vis)
        with torch.inference_mode():
            times = time_calls(lambda: F.scaled_dot_product_attention(tq, tk, tv, **kw),
                               job["warmup"], job["reps"], job["min_time"])
        row["torch"] = summary(times, s["flops"])
        row["torch"]["gqa"] = "enable_gqa" if "enable_gqa" in kw else (
            "expanded" if g > 1 else "none")

        # The seeds' numpy code, batched over (B, H) by broadcasting. Three Lq x Lk arrays are
        # alive at its peak: the scores, exp(x - max) and the weights.
        need = 3 * B * Hq * Lq * Lk * 4
        if need > job["numpy_max_bytes"]:
            row["numpy"] = {"skipped": "needs %.1f GB for its Lq x Lk arrays (limit %.1f GB)"
                            % (need / 1e9, job["numpy_max_bytes"] / 1e9)}
        else:
            nk = np.repeat(k, g, axis=1) if g > 1 else k
            nv = np.repeat(v, g, axis=1) if g > 1 else v

            def seeds_numpy():
                d_k = q.shape[-1]
                scores = q @ np.swapaxes(nk, -1, -2)
                scores = scores / np.sqrt(d_k)
                if vis is not None:
                    scores = np.where(vis, scores, -np.inf)
                exp_x = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights = exp_x / exp_x.sum(axis=-1, keepdims=True)
                return weights @ nv

            times = time_calls(seeds_numpy, job["warmup"], job["reps"], job["min_time"])
            row["numpy"] = summary(times, s["flops"])
        for peer in ("torch", "numpy"):
            if "ms_median" in row[peer]:
                row[peer]["gbs"] = s["kv_bytes"] / (row[peer]["ms_median"] * 1e-3) * 1e-9
        results["shapes"].append(row)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


# --------------------------------------------------------------------------------------------
# The driver (standard library only)
# --------------------------------------------------------------------------------------------

def peers_python(args):
    """The interpreter that runs the peers: --python, or bench/peers/.venv (created and
    filled with pip on first use)."""
    if args.python:
        return args.python
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        print("creating %s" % VENV, flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    probe = subprocess.run([py, "-c", "import torch, numpy"], capture_output=True)
    if probe.returncode != 0:
        print("installing numpy and torch (CPU) into %s" % VENV, flush=True)
        subprocess.check_call([py, "-m", "pip", "install", "--upgrade", "numpy"])
        torch_cmd = [py, "-m", "pip", "install", "--upgrade", "torch"]
        if args.torch_index_url:
            torch_cmd += ["--index-url", args.torch_index_url]
        subprocess.check_call(torch_cmd)
    return py


def fmt(x, spec="%.1f"):
    return "-" if x is None else spec % x


def print_table(sdpa, peers, peak):
    print()
    print("sdpa %s vs torch %s and numpy %s: %d thread%s, %s, %s" % (
        sdpa["sdpa_version"], peers["torch_version"], peers["numpy_version"], sdpa["threads"],
        "" if sdpa["threads"] == 1 else "s", sdpa["cpu_model"], sdpa["date"]))
    print("FP32 FMA peak measured by sdpa bench: %.1f GFLOP/s (start %.1f, end %.1f, %s loop)" % (
        peak, sdpa["peak"]["start"]["fma_gflops"], sdpa["peak"]["end"]["fma_gflops"],
        sdpa["peak"]["start"]["isa"]))
    print()
    head = ("%-28s %9s %9s %9s %10s %8s %8s %8s"
            % ("shape (B,H,Lq,Lk,D[,mask])", "sdpa", "torch", "numpy", "sdpa/torch",
               "sdpa %pk", "torch %pk", "numpy %pk"))
    print(head)
    print("%-28s %9s %9s %9s" % ("", "GFLOP/s", "GFLOP/s", "GFLOP/s"))
    notes = []
    for s, p in zip(sdpa["shapes"], peers["shapes"]):
        a = s["gflops"]
        t = p["torch"].get("gflops")
        n = p["numpy"].get("gflops")
        if "skipped" in p["numpy"]:
            notes.append("numpy skipped at %s: %s" % (s["spec"], p["numpy"]["skipped"]))
        pct = (lambda x: None if x is None or not peak else 100.0 * x / peak)
        print("%-28s %9s %9s %9s %10s %8s %8s %8s" % (
            s["spec"], fmt(a), fmt(t), fmt(n), fmt(a / t if t else None, "%.3gx"),
            fmt(pct(a), "%.1f%%"), fmt(pct(t), "%.1f%%"), fmt(pct(n), "%.1f%%")))
        if s["Lq"] == 1:
            notes.append("decode %s: K and V read at sdpa %.1f, torch %s, numpy %s GB/s "
                         "(measured read bandwidth %.1f GB/s)" % (
                             s["spec"], s["gbs"], fmt(p["torch"].get("gbs")),
                             fmt(p["numpy"].get("gbs")), sdpa["peak"]["read_gbs"]))
        if p["torch"].get("gqa") == "expanded":
            notes.append("torch at %s: no enable_gqa in this torch, K and V expanded to Hq "
                         "heads before timing" % s["spec"])
    print()
    for line in notes:
        print(line)
    print("GFLOP/s = 4*B*Hq*D*(visible pairs) / median time, the same count for all three.")


def main():
    ap = argparse.ArgumentParser(
        description="Time sdpa, PyTorch SDPA and the seeds' numpy code side by side.",
        epilog="Shapes and presets are those of `sdpa bench`; see its --help.")
    ap.add_argument("--preset", choices=("quick", "full"), default="quick")
    ap.add_argument("--shape", action="append", default=[],
                    help="B,H,Lq,Lk,D[,causal|causal-br] (H may be Hq/Hkv); repeatable; "
                         "replaces the preset")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for every implementation (default: all CPUs)")
    ap.add_argument("--sdpa", default=os.path.join(ROOT, "build", "cli", "sdpa"),
                    help="the sdpa binary (default build/cli/sdpa)")
    ap.add_argument("--python", help="an interpreter with torch 2.x and numpy; "
                                     "default: bench/peers/.venv, created on first use")
    ap.add_argument("--torch-index-url", default=TORCH_CPU_INDEX,
                    help="pip index for torch when filling the venv (default: the CPU wheels; "
                         "'' for PyPI)")
    ap.add_argument("--reps", type=int, default=100, help="at most N timed calls per shape")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per shape")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="time budget per shape and implementation, seconds (default 1)")
    ap.add_argument("--numpy-max-gb", type=float, default=3.0,
                    help="skip numpy where its Lq x Lk arrays need more (default 3)")
    ap.add_argument("--json", help="also write all figures (sdpa's JSON plus the peers') here")
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if args.threads < 1 or args.reps < 1 or args.warmup < 0 or args.min_time < 0:
        ap.error("--threads and --reps must be >= 1, --warmup and --min-time >= 0")
    if not os.access(args.sdpa, os.X_OK):
        sys.exit("run_peers.py: %s is not an executable; build it with `make` or pass --sdpa"
                 % args.sdpa)

    with tempfile.TemporaryDirectory() as tmp:
        # 1. sdpa, whose JSON defines the shapes.
        out = os.path.join(tmp, "sdpa.json")
        cmd = [args.sdpa, "bench", "--threads", str(args.threads), "--json", out,
               "--reps", str(args.reps), "--warmup", str(args.warmup),
               "--min-time", str(args.min_time)]
        cmd += [a for s in args.shape for a in ("--shape", s)] or ["--preset", args.preset]
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            sys.exit("run_peers.py: sdpa bench failed")
        sdpa = json.load(open(out))

        # 2. The peers, in their own interpreter, with the BLAS held to the same threads.
        py = peers_python(args)
        job = os.path.join(tmp, "job.json")
        res = os.path.join(tmp, "peers.json")
        json.dump({"threads": args.threads, "reps": args.reps, "warmup": args.warmup,
                   "min_time": args.min_time, "numpy_max_bytes": args.numpy_max_gb * 1e9,
                   "shapes": sdpa["shapes"]}, open(job, "w"))
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)
        print("$ %s %s  (torch, numpy)" % (py, os.path.relpath(__file__)), flush=True)
        if subprocess.call([py, os.path.abspath(__file__), "--worker", job, res], env=env) != 0:
            sys.exit("run_peers.py: the peers failed (is torch 2.x installed in %s?)" % py)
        peers = json.load(open(res))

        # 3. The peak once more, right after the peers: the machine is shared, and a peak that
        # moved tells that some figures of this run were taken while something else ran.
        after = os.path.join(tmp, "after.json")
        subprocess.check_call([args.sdpa, "bench", "--threads", str(args.threads), "--shape",
                               "1,1,16,16,8", "--reps", "1", "--warmup", "0", "--min-time", "0",
                               "--json", after], stdout=subprocess.DEVNULL)
        peers["peak_after"] = json.load(open(after))["peak"]["end"]

    peaks = [sdpa["peak"]["start"]["fma_gflops"] or 0, sdpa["peak"]["end"]["fma_gflops"] or 0,
             peers["peak_after"]["fma_gflops"] or 0]
    peak = max(peaks[:2])
    print_table(sdpa, peers, peak)
    print("FMA peak after the peers: %.1f GFLOP/s." % peaks[2])
    if min(peaks) < 0.85 * max(peaks):
        print("WARNING: the FMA peaks of this run (%s GFLOP/s) differ by more than 15 %%: the "
              "machine was busy for part of it. Rerun before believing the figures."
              % ", ".join("%.0f" % x for x in peaks))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"sdpa": sdpa, "peers": peers, "threads": args.threads}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
