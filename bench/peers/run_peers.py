#!/usr/bin/env python3
"""run_peers.py -- sdpa side by side with its peers, same shapes, same threads, same machine.

Re-run it from the repository root (after `make`, which builds build/cli/sdpa):

    python3 bench/peers/run_peers.py --threads 2                  # quick preset
    python3 bench/peers/run_peers.py --threads 2 --preset full    # the targets of issue 3
    python3 bench/peers/run_peers.py --threads 2 --shape 1,16,1024,1024,64,causal
    python3 bench/peers/run_peers.py --threads 2 --isa avx2       # everyone at AVX2, also on a
                                                                   # machine with AVX-512
    python3 bench/peers/run_peers.py --python /path/to/python     # an interpreter that already
                                                                   # has torch 2.x and numpy
    python3 bench/peers/run_peers.py --threads 2 --backward       # the backward: sdpa against
                                                                   # torch autograd
    python3 bench/peers/run_peers.py --threads 2 --dtype bf16     # half precision (f16, bf16)
    python3 bench/peers/run_peers.py --threads 2 --preset decode  # the decode targets of issue
                                                                   # 13: f32 Q/O, f16 K/V cache
    python3 bench/peers/run_peers.py --threads 2 --rounds 3       # 3 interleaved rounds, medians:
                                                                   # how to compare on a noisy VM

The peers run in virtual environments under bench/peers/ (git ignores them), created and filled
with pip on first use; later runs reuse them, and deleting one rebuilds it:
  - .venv: numpy, torch and threadpoolctl (which names the OpenBLAS core numpy runs), for the
    torch/numpy worker unless --python names another interpreter; and ggml-python for
    --isa native. torch comes from --torch-index-url, by default the CPU wheels; where only
    PyPI can be reached, pass --torch-index-url '' (PyPI's Linux torch is the CUDA build,
    several GB, which runs on the CPU all the same);
  - .venv-avx2: numpy and ggml-python, for ggml under --isa avx2.
ggml-python (GGML_PYTHON below, pinned) is an sdist: pip builds its vendored ggml with CMake,
with CMAKE_ARGS from GGML_CMAKE_ARGS: GGML_NATIVE=ON (-march=native) in .venv; in .venv-avx2
GGML_NATIVE, the AVX-512, AVX-VNNI and AMX options OFF and GGML_SSE42, GGML_AVX, GGML_AVX2,
GGML_FMA, GGML_F16C, GGML_BMI2 ON. It installs with --no-cache-dir --no-binary: pip's wheel
cache does not key on CMAKE_ARGS, and would hand one venv the other's build.

What it does:
  1. runs `sdpa bench --json` (the binary given by --sdpa) at the preset's shapes or the
     --shape ones. sdpa bench also measures this machine's FP32 FMA peak at its start and end.
     It runs first because its JSON is the one definition of the shapes (the presets live in
     cli/bench_options.c), so the peers are timed at exactly the shapes sdpa was;
  2. in the peers' interpreter (a child process of this script), with the same thread count:
     - PyTorch torch.nn.functional.scaled_dot_product_attention, CPU, torch.set_num_threads(N),
       under torch.inference_mode(), Q in the shape's dtype and K, V in its kv_dtype (see
       "Dtypes" below); causal as is_causal, causal-br as a bool attn_mask, and causal-add
       as an additive attn_mask in Q's dtype (0 and that dtype's most negative value; sdpa's
       is f32's), torch's own mask path as sdpa's (numpy and ggml take causal-add as causal);
     - the seeds' numpy code: scores = Q @ K^T / sqrt(d); softmax(scores) row by row
       (exp(x - max) / sum); output = weights @ V, over all heads at once with numpy
       broadcasting, so it materialises (B, H, Lq, Lk) arrays. Shapes whose three live
       Lq x Lk buffers would exceed --numpy-max-gb (default 3 GB) are skipped, and the table
       says so. numpy's BLAS gets N threads through OPENBLAS/OMP/MKL_NUM_THREADS;
  3. in ggml's interpreter (another child process: ggml aborts the process on arguments it
     rejects, and its OpenMP runtime is not torch's), ggml's CPU flash attention,
     ggml_flash_attn_ext, through the ctypes API of ggml-python (ggml_peer.py): Q, K, V the
     same f32 arrays, scale 1/sqrt(D), for causal an F16 additive mask (0 / -inf) of Lq rows,
     grouped-query K/V heads broadcast by ggml itself. The graph and its compute plan are
     built once per shape, and only ggml_graph_compute with N threads (a thread pool made
     once) is timed. Before timing, its output is compared with a float64 numpy reference
     (the whole output for small shapes, else a slice of batches, heads and query rows); an
     error above 1e-3 of the reference's largest magnitude records the shape as failed with
     the reason, instead of a time. A second column, `ggml f16 K/V`, times the same with K and
     V stored as f16, what ggml's users usually run; its reference takes the f16-rounded K and
     V, and its bound is 0.1, not 1e-3: ggml's kernel for one query row at a time (decode,
     and shapes of fewer than 64 query rows) accumulates P V in f16, which costs 0.3 to 2 %
     at Lk 512 to 4096 and 5 % at 16384 (a wrong layout or mask costs about 100 %); the
     table notes any error above 1e-3;
  4. measures the FMA peak once more (a tiny `sdpa bench` run) and prints a table: per shape
     the GFLOP/s of sdpa, torch, numpy, ggml and ggml with f16 K/V, the ratios sdpa/torch and
     sdpa/ggml, and each as a % of the FMA peak that sdpa bench measured (the higher of start
     and end), then a warning if the peaks of the run differ by more than 15 % (the machine
     was busy: rerun). The header names the ISA level each system ran at.

--isa native|avx2 (default native) chooses the instruction set level of every system:
  native  each system picks what the CPU offers;
  avx2    sdpa bench runs with SDPA_MAX_ISA=avx2 (so its kernels, and its peak probe, which
          follows them, are AVX2 + FMA); the torch/numpy worker runs with
          ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's CPU SDPA calls MKL's
          SGEMM), ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell and NPY_DISABLE_CPU_FEATURES
          set to numpy's AVX-512 dispatch targets; ggml is the build in .venv-avx2, compiled
          without AVX-512. The header prints what each system reports: sdpa's kernel level,
          torch.backends.cpu.get_cpu_capability(), numpy's highest enabled dispatch target and
          OpenBLAS core (numpy's X86_V3 is x86-64-v3: AVX2, FMA, F16C), ggml's compiled-in
          features. MKL cannot be asked what it chose.
--no-ggml leaves ggml out; --ggml-python PATH runs ggml in an interpreter of your own.

--rounds N (default 1) runs steps 1 to 3 N times, alternating the order: sdpa first, then the
peers, in the 1st, 3rd, ... round; the peers (torch/numpy, then ggml) first, then sdpa, in the
2nd, 4th, ... (the shapes are those of the first round's sdpa JSON). The virtual environments
are made once before all rounds, and step 4's peak is measured once after them. It is the way
to compare on a noisy, shared machine (on our 2-core VMs the FMA peak halves for minutes at a
time): with one round, sdpa's figures and the peers' are taken minutes apart, and a slow spell
can fall on one system only and skew the ratios. Every figure of the table is then the median
over the rounds, per shape and system (of each round's figure: GFLOP/s, ms, GB/s, bwd/fwd...),
and so is the FMA peak of its header (the medians of the start and end peaks; a second line
gives each round's start/end); the peak warning weighs every round's start and end peaks and
the final one; and after the table a line per shape gives each round's sdpa/torch (GFLOP/s)
and their median, forward and backward alike. The table's sdpa/torch is the ratio of the
medians, that line's median the median of the ratios.

Dtypes. --dtype and --kv-dtype go to sdpa bench (as does a DTYPE field in --shape), and each
shape of its JSON carries its dtype (Q and O) and kv_dtype (K and V). Every worker draws the
inputs in f32 and rounds them to those dtypes (to nearest even; bf16 on the bits, numpy having
no bfloat16), so all see the same values:
  - torch holds Q in dtype and K, V in kv_dtype (torch.float16, torch.bfloat16). Where the two
    differ (the decode preset's f32 Q/O with an f16 cache), F.scaled_dot_product_attention,
    which wants one dtype, gets K and V converted to Q's dtype inside the timed call: what a
    model that keeps its cache in half precision and computes in f32 does, and the same
    precision as sdpa's mixed call (column "torch"). A second figure, "torch kv" (JSON
    torch_kv), runs all of it in kv_dtype, Q converted before the clock and the output in
    kv_dtype: what a model run wholly in half precision does. sdpa/torch is against "torch".
    With --backward the conversion is part of the graph (dK, dV come back in kv_dtype);
    torch_kv is not timed there;
  - numpy runs the seeds' code in f32 on the rounded values;
  - ggml gets Q in f32 (its flash attention takes an f32 Q) and K, V in f32 ("ggml") and in
    f16 ("ggml f16 K/V", what llama.cpp's cache holds), from the same rounded values.
The decode lines give each peer's time and cache GB/s: the bytes of K and V it reads (sdpa and
torch in kv_dtype, numpy and ggml in f32, ggml f16 in f16) / median; and sdpa's %bw against
the read bandwidth sdpa bench measured at that shape's working set (its K and V buffer, right
before and after the shape), beside the DRAM figure.

The FLOP count is sdpa bench's: 4 * B * Hq * D * (visible (query, key) pairs); with causal
only the visible pairs count, for every implementation, although numpy computes them all.
Timing follows sdpa bench: warm-up calls, then repetitions until --reps are done or --min-time
seconds are spent (at least one), and the median. Inputs are uniform in [-1, 1) from a seed per
shape (its position in the list), so both workers build the same arrays (the CRCs of each
shape's inputs are compared, and the table says where they differ). Grouped-query shapes (Hq > Hkv) use enable_gqa where torch has it (2.5+);
otherwise, and for numpy, K and V are expanded to Hq heads before the clock starts.

--backward times the backward instead (issue 11): `sdpa bench --backward --json` (each
repetition a timed sdpa_forward, with the LSE, then the timed sdpa_backward of its result; FLOP
counted as 2.5 x the forward's; the JSON's bwd_over_fwd is the ratio of the two medians), and
in the torch worker, at the same shapes and threads, autograd through
F.scaled_dot_product_attention, asked as for the forward (is_causal, the bottom-right bool
mask, enable_gqa, so dK and dV are summed over each group): q, k and v require grad, each
repetition runs a timed forward (outside inference_mode, so it saves what the backward needs,
as a training step does) and then the timed torch.autograd.grad(out, (q, k, v), dout), dout
uniform in [-1, 1) from the shape's seed; the warm-up calls and the time budget work as
sdpa's (--min-time counts the backward calls). The table shows per shape the backward's ms
and GFLOP/s of both (sdpa's FLOP count for both), sdpa/torch, and each one's bwd/fwd (median
backward over median forward of the same run). numpy and ggml are not run with --backward
and the table says so: the seeds' numpy code is forward only, and ggml's backward op
(ggml_flash_attn_back) is the old one, not the ggml_flash_attn_ext this script times; no ggml
environment is built for it. The JSON then holds torch's ms_forward_median and bwd_over_fwd.

The JSON of --json holds sdpa's JSON, the peers' figures per shape (torch, torch_kv for mixed
dtypes, numpy, ggml, ggml_f16: reps, median/min/max ms, GFLOP/s, K/V GB/s, and for ggml
max_rel_err, or skipped/failed with the reason), the ISA each system reported, the thread count, --isa and
--backward. With --rounds N > 1, "sdpa" and "peers" are the merged (median) ones the table
shows, and "rounds" holds each round's own sdpa and peers JSON, with "first" (sdpa or peers).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.join(HERE, ".venv")
VENV_AVX2 = os.path.join(HERE, ".venv-avx2")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# The ggml-python release whose vendored ggml (0.15.3) ggml_peer.py was written against: its
# mask rules and its binding's structs are those of that ggml.
GGML_PYTHON = "ggml-python==0.0.45"

# CMAKE_ARGS for the ggml build of each --isa (option names from the sdist's
# vendor/ggml/CMakeLists.txt). Explicit ON/OFF, because ggml's defaults depend on the
# environment: GGML_NATIVE defaults to OFF when SOURCE_DATE_EPOCH is set.
GGML_CMAKE_ARGS = {
    "native": "-DGGML_NATIVE=ON",
    "avx2": " ".join("-DGGML_%s=%s" % kv for kv in (
        ("NATIVE", "OFF"), ("SSE42", "ON"), ("AVX", "ON"), ("AVX2", "ON"), ("FMA", "ON"),
        ("F16C", "ON"), ("BMI2", "ON"), ("AVX_VNNI", "OFF"), ("AVX512", "OFF"),
        ("AVX512_VBMI", "OFF"), ("AVX512_VNNI", "OFF"), ("AVX512_BF16", "OFF"),
        ("AMX_TILE", "OFF"), ("AMX_INT8", "OFF"), ("AMX_BF16", "OFF"))),
}


# --------------------------------------------------------------------------------------------
# The peers, measured in child processes that run this file with --worker JOB OUT
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


ELEM_SIZE = {"f32": 4, "f16": 2, "bf16": 2}


def dtypes(s):
    """The shape's (Q and O, K and V) dtypes as sdpa bench's JSON gives them; f32 for a JSON
    of a version that had none."""
    return s.get("dtype", "f32"), s.get("kv_dtype", s.get("dtype", "f32"))


def round_to(np, x, dt):
    """x (f32) rounded to nearest even to dt and held in f32 again: numpy has no bfloat16, so
    bf16 is done on the bits (the inputs are finite)."""
    if dt == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dt == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32)
    return x


def inputs(np, s, index):
    """Q (B, Hq, Lq, D), K and V (B, Hkv, Lk, D), uniform in [-1, 1) from the seed index,
    drawn in f32 and rounded to the shape's dtypes (Q to dtype, K and V to kv_dtype) but held
    in f32, and a CRC-32 of their bytes, by which the driver sees that every worker had the
    same arrays. Each peer converts them to what it runs in, exactly."""
    rng = np.random.default_rng(index)
    B, Hq, Hkv, Lq, Lk, D = (s[k] for k in ("B", "Hq", "Hkv", "Lq", "Lk", "D"))
    qdt, kvdt = dtypes(s)
    q = round_to(np, rng.uniform(-1, 1, (B, Hq, Lq, D)).astype(np.float32), qdt)
    k = round_to(np, rng.uniform(-1, 1, (B, Hkv, Lk, D)).astype(np.float32), kvdt)
    v = round_to(np, rng.uniform(-1, 1, (B, Hkv, Lk, D)).astype(np.float32), kvdt)
    crc = 0
    for x in (q, k, v):
        crc = zlib.crc32(memoryview(np.ascontiguousarray(x)).cast("B"), crc)
    return q, k, v, crc


def dout_for(np, s, index):
    """dL/dout for --backward: (B, Hq, Lq, D) uniform in [-1, 1), from its own stream of the
    shape's seed (q, k and v are those of inputs()), rounded to Q's dtype, held in f32."""
    rng = np.random.default_rng([index, 1])
    return round_to(np, rng.uniform(-1, 1, (s["B"], s["Hq"], s["Lq"], s["D"])).astype(
        np.float32), dtypes(s)[0])


def time_fwd_bwd(fwd, bwd, warmup, reps, min_time):
    """For --backward, as sdpa bench --backward does: warmup untimed (forward, backward)
    pairs, then repetitions of a timed forward followed by the timed backward of its result,
    until reps or the backward calls have used min_time seconds (at least one). Returns the
    lists of the forward's and of the backward's seconds."""
    for _ in range(warmup):
        bwd(fwd())
    t_fwd, t_bwd, spent = [], [], 0.0
    while len(t_bwd) < reps:
        t0 = time.perf_counter()
        out = fwd()
        t1 = time.perf_counter()
        bwd(out)
        t2 = time.perf_counter()
        t_fwd.append(t1 - t0)
        t_bwd.append(t2 - t1)
        spent += t2 - t1
        if spent >= min_time:
            break
    return t_fwd, t_bwd


def numpy_isa(np):
    """numpy's highest enabled SIMD dispatch target, and the OpenBLAS core its matmul runs
    (through threadpoolctl, when installed)."""
    try:
        from numpy._core import _multiarray_umath as m
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as m
    on = [t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)]
    isa = {"numpy_simd": on[-1] if on else "baseline (%s)" % " ".join(m.__cpu_baseline__)}
    try:
        import threadpoolctl
        for lib in threadpoolctl.threadpool_info():
            if lib.get("internal_api") == "openblas":
                isa["openblas_core"] = lib.get("architecture")
                break
    except ImportError:
        pass
    return isa


def run_torch_numpy(job, results):
    """PyTorch's SDPA and the seeds' numpy code at every shape of the job."""
    n = job["threads"]
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(n)
    results.update({"torch_version": torch.__version__, "numpy_version": np.__version__,
                    "torch_threads": torch.get_num_threads(),
                    "torch_isa": torch.backends.cpu.get_cpu_capability(),
                    "numpy_isa": numpy_isa(np)})
    try:  # enable_gqa arrived in torch 2.5
        x = torch.zeros(1, 2, 1, 4)
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        has_gqa = True
    except TypeError:
        has_gqa = False
    for index, s in enumerate(job["shapes"]):
        g = s["Hq"] // s["Hkv"]
        sys.stderr.write("\r\033[K  torch, numpy: %s" % s["spec"] if sys.stderr.isatty() else "")
        q, k, v, crc = inputs(np, s, index)
        vis = visibility(np, s)
        row = {"spec": s["spec"], "inputs_crc32": crc}

        # PyTorch: is_causal is top-left; bottom-right needs an explicit bool mask. Q (and so
        # the output) in the shape's dtype, K and V in its kv_dtype. F.scaled_dot_product_
        # attention wants one dtype for the three, so where they differ (f32 Q/O with an f16
        # cache) K and V are converted to Q's dtype inside the timed call, as a model that
        # keeps its cache in half precision and computes in f32 does (the figure "torch");
        # a second figure, "torch_kv", runs all of it in the cache's dtype (Q converted before
        # the clock, the output in that dtype), as a model run wholly in half precision does.
        qdt, kvdt = dtypes(s)
        tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        tq = torch.from_numpy(q).to(tdt[qdt])
        tk, tv = (torch.from_numpy(x).to(tdt[kvdt]) for x in (k, v))
        kw = {}
        if g > 1 and has_gqa:
            kw["enable_gqa"] = True
        elif g > 1:
            tk, tv = tk.repeat_interleave(g, dim=1), tv.repeat_interleave(g, dim=1)
        if s.get("mask") == "causal-add":
            # the same pattern as an additive mask in Q's dtype, 0 and that dtype's most
            # negative value (as Hugging Face transformers builds masks); sdpa bench passes an
            # f32 mask of 0 and -FLT_MAX
            t = tdt[qdt]
            kw["attn_mask"] = torch.zeros(vis.shape, dtype=t).masked_fill(
                torch.from_numpy(~vis), torch.finfo(t).min)
        elif s["causal"] and s["align"] == "top-left":
            kw["is_causal"] = True
        elif s["causal"]:
            kw["attn_mask"] = torch.from_numpy(vis)
        mixed = qdt != kvdt

        def attend(q_, k_, v_):
            if mixed:
                k_, v_ = k_.to(q_.dtype), v_.to(q_.dtype)
            return F.scaled_dot_product_attention(q_, k_, v_, **kw)

        if job.get("backward"):
            # Autograd: a forward with requires_grad inputs (it saves what the backward needs),
            # then torch.autograd.grad(out, (q, k, v), dout), which is timed; each repetition
            # runs both, the forward timed apart. s["flops"] is sdpa's: 2.5 x the forward's.
            # Mixed dtypes: the conversion of K and V is part of the graph, and their
            # gradients come back in the cache's dtype.
            for x in (tq, tk, tv):
                x.requires_grad_(True)
            tdo = torch.from_numpy(dout_for(np, s, index)).to(tdt[qdt])
            leaves = (tq, tk, tv)  # with "expanded" GQA, the expanded K and V

            def fwd():
                return attend(tq, tk, tv)

            def bwd(out):
                return torch.autograd.grad(out, leaves, tdo)

            t_fwd, t_bwd = time_fwd_bwd(fwd, bwd, job["warmup"], job["reps"], job["min_time"])
            row["torch"] = summary(t_bwd, s["flops"])
            row["torch"]["ms_forward_median"] = statistics.median(t_fwd) * 1e3
            row["torch"]["bwd_over_fwd"] = statistics.median(t_bwd) / statistics.median(t_fwd)
        else:
            with torch.inference_mode():
                times = time_calls(lambda: attend(tq, tk, tv),
                                   job["warmup"], job["reps"], job["min_time"])
                row["torch"] = summary(times, s["flops"])
                if mixed:
                    tq_kv = tq.to(tdt[kvdt])
                    times = time_calls(
                        lambda: F.scaled_dot_product_attention(tq_kv, tk, tv, **kw),
                        job["warmup"], job["reps"], job["min_time"])
                    row["torch_kv"] = summary(times, s["flops"])
                    row["torch_kv"]["dtype"] = kvdt
        row["torch"]["gqa"] = "enable_gqa" if "enable_gqa" in kw else (
            "expanded" if g > 1 else "none")
        row["torch"]["dtype"] = qdt
        row["torch"]["kv"] = "converted to %s in the call" % qdt if mixed else kvdt

        # The seeds' numpy code, batched over (B, H) by broadcasting, in f32 whatever the
        # dtypes (numpy has no bfloat16): the inputs rounded to them, held in f32. Three
        # Lq x Lk arrays are alive at its peak: the scores, exp(x - max) and the weights.
        need = 3 * s["B"] * s["Hq"] * s["Lq"] * s["Lk"] * 4
        if job.get("backward"):
            row["numpy"] = {"skipped": "forward only (the seeds' code has no backward)"}
        elif need > job["numpy_max_bytes"]:
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
        results["shapes"].append(row)


def run_ggml(job, results):
    """ggml's flash attention (ggml_peer.py) at every shape of the job, f32 and f16 K/V."""
    import numpy as np
    import ggml
    import ggml_peer

    n = job["threads"]
    results["ggml_info"] = ggml_peer.info(ggml)
    if job["isa"] == "avx2" and results["ggml_info"]["isa"] not in ("avx2", "avx", "generic"):
        raise SystemExit("run_peers.py: the ggml of %s was built for %s, not AVX2: delete that "
                         "virtual environment and rerun" % (sys.prefix,
                                                            results["ggml_info"]["isa"]))
    pool = ggml_peer.new_threadpool(ggml, n)
    try:
        for index, s in enumerate(job["shapes"]):
            sys.stderr.write("\r\033[K  ggml: %s" % s["spec"] if sys.stderr.isatty() else "")
            q, k, v, crc = inputs(np, s, index)
            row = {"spec": s["spec"], "inputs_crc32": crc}
            row.update(ggml_peer.measure(
                ggml, np, q, k, v, visibility(np, s), n, pool,
                lambda fn: summary(time_calls(fn, job["warmup"], job["reps"], job["min_time"]),
                                   s["flops"])))
            results["shapes"].append(row)
    finally:
        ggml.ggml_threadpool_free(pool)


def worker(job_path, out_path):
    job = json.load(open(job_path))
    results = {"shapes": []}
    if job["peers"] == "ggml":
        run_ggml(job, results)
    else:
        run_torch_numpy(job, results)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    for row, s in zip(results["shapes"], job["shapes"]):
        if job.get("backward"):
            break  # K/V GB/s is a decode figure, not the backward's
        # The bytes of the K and V each peer keeps and reads: torch's are in the cache's dtype
        # (as sdpa's), numpy's and ggml's in f32, ggml_f16's in f16.
        elems = s["kv_bytes"] / ELEM_SIZE[dtypes(s)[1]]
        kv_size = {"torch": ELEM_SIZE[dtypes(s)[1]], "torch_kv": ELEM_SIZE[dtypes(s)[1]],
                   "numpy": 4, "ggml": 4, "ggml_f16": 2}
        for peer, size in kv_size.items():
            if "ms_median" in row.get(peer, {}):
                row[peer]["gbs"] = elems * size / (row[peer]["ms_median"] * 1e-3) * 1e-9
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


# --------------------------------------------------------------------------------------------
# The driver (standard library only)
# --------------------------------------------------------------------------------------------

def venv_python(venv, needs):
    """The interpreter of venv, created on first use, after pip-installing each (module,
    pip arguments, extra environment) of needs whose module it cannot import."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print("creating %s" % venv, flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    importable = (lambda modules: subprocess.run([py, "-c", "import " + ", ".join(modules)],
                                                 capture_output=True).returncode == 0)
    if importable([m for m, _, _ in needs]):
        return py
    for module, pip_args, extra_env in needs:
        if importable([module]):
            continue
        print("installing %s into %s%s" % (pip_args[-1], venv, "".join(
            " with %s='%s'" % kv for kv in extra_env.items())), flush=True)
        subprocess.check_call([py, "-m", "pip", "install"] + pip_args,
                              env=dict(os.environ, **extra_env))
    return py


def peers_python(args):
    """The interpreter that runs torch and numpy: --python, or bench/peers/.venv."""
    if args.python:
        return args.python
    torch_args = ["--upgrade", "torch"]
    if args.torch_index_url:
        torch_args = ["--index-url", args.torch_index_url] + torch_args
    return venv_python(VENV, [("numpy", ["--upgrade", "numpy"], {}),
                              ("torch", torch_args, {}),
                              ("threadpoolctl", ["threadpoolctl"], {})])


def ggml_python(args):
    """The interpreter that runs ggml: --ggml-python, or the venv of --isa with ggml-python
    built from source for that level."""
    if args.ggml_python:
        return args.ggml_python
    return venv_python(VENV if args.isa == "native" else VENV_AVX2, [
        ("numpy", ["--upgrade", "numpy"], {}),
        ("ggml", ["--no-cache-dir", "--no-binary", "ggml-python", GGML_PYTHON],
         {"CMAKE_ARGS": GGML_CMAKE_ARGS[args.isa]})])


def isa_envs(args, py):
    """The environment variables that hold sdpa and the torch/numpy worker to --isa avx2 (none
    for native). numpy's AVX-512 dispatch targets are asked of py, since their names change
    between numpy versions (AVX512_SKX... in 1.x, X86_V4... in 2.4)."""
    if args.isa == "native":
        return {}, {}
    targets = subprocess.run([py, "-c", (
        "try:\n from numpy._core import _multiarray_umath as m\n"
        "except ImportError:\n from numpy.core import _multiarray_umath as m\n"
        "print(' '.join(t for t in m.__cpu_dispatch__ if 'AVX512' in t or t == 'X86_V4'))")],
        capture_output=True, text=True).stdout.split()
    peer_env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
    if targets:
        peer_env["NPY_DISABLE_CPU_FEATURES"] = " ".join(targets)
    return {"SDPA_MAX_ISA": "avx2"}, peer_env


def fmt(x, spec="%.1f"):
    return "-" if x is None else spec % x


def isa_line(args, sdpa, peers):
    """One line naming the ISA level each system reported, and the warnings of --isa avx2
    for those that report more."""
    ni = peers.get("numpy_isa", {})
    gi = peers.get("ggml_info")
    # the tables that ran the shapes (each shape's kernel; an older sdpa bench names only
    # the context's: flash-amx runs bf16 alone, the others go to flash-avx512)
    ran = sorted({s.get("kernel") or sdpa["kernel"] for s in sdpa.get("shapes", [])})
    parts = ["sdpa %s (%s)" % (sdpa["isa"], ", ".join(ran) or sdpa["kernel"]),
             "torch %s%s" % (peers["torch_isa"], " (MKL asked for AVX2)"
                             if args.isa == "avx2" else ""),
             "numpy %s%s" % (ni.get("numpy_simd", "?"), ", OpenBLAS %s" % ni["openblas_core"]
                             if ni.get("openblas_core") else "")]
    if gi:
        parts.append("ggml %s (built with %s)" % (gi["isa"], " ".join(gi["features"])))
    warn = []
    if args.isa == "avx2":
        if sdpa["isa"] != "avx2":
            warn.append("sdpa ran %s" % sdpa["isa"])
        if peers["torch_isa"].lower() != "avx2":
            warn.append("torch ran %s" % peers["torch_isa"])
        if "AVX512" in ni.get("numpy_simd", "") or ni.get("numpy_simd") == "X86_V4":
            warn.append("numpy ran %s" % ni["numpy_simd"])
        if gi and gi["isa"] == "avx512":
            warn.append("ggml was built with AVX-512")
    return "ISA level (--isa %s): %s" % (args.isa, "; ".join(parts)), warn


def print_table(args, sdpa, peers, peak, round_sdpa=None, round_peers=None):
    gi = peers.get("ggml_info")
    print()
    print("sdpa %s vs torch %s, numpy %s and ggml %s: %d thread%s, %s, %s" % (
        sdpa["sdpa_version"], peers["torch_version"], peers["numpy_version"],
        "%s (ggml-python %s)" % (gi["ggml_version"], gi["ggml_python_version"]) if gi
        else "(not run)",
        sdpa["threads"], "" if sdpa["threads"] == 1 else "s", sdpa["cpu_model"], sdpa["date"]))
    line, warn = isa_line(args, sdpa, peers)
    print(line)
    print_peak(sdpa, peak, round_sdpa, round_peers)
    print()
    row_fmt = "%-34s %9s %9s %9s %9s %9s %12s %10s %9s %8s %9s %9s %8s"
    print(row_fmt % ("shape (B,H,Lq,Lk,D[,mask][,dt])", "sdpa", "torch", "torch kv", "numpy",
                     "ggml", "ggml f16 K/V", "sdpa/torch", "sdpa/ggml", "sdpa %pk", "torch %pk",
                     "numpy %pk", "ggml %pk"))
    print("%-34s %9s %9s %9s %9s %9s %12s" % ("", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s",
                                              "GFLOP/s", "GFLOP/s"))
    notes = []
    pct = (lambda x: None if x is None or not peak else 100.0 * x / peak)
    mixed_seen = False
    for s, p in zip(sdpa["shapes"], peers["shapes"]):
        a = s["gflops"]
        t, tkv, n, g, h = (p.get(peer, {}).get("gflops")
                           for peer in ("torch", "torch_kv", "numpy", "ggml", "ggml_f16"))
        mixed_seen = mixed_seen or "torch_kv" in p
        if "skipped" in p["numpy"]:
            notes.append("numpy skipped at %s: %s" % (s["spec"], p["numpy"]["skipped"]))
        for peer, label in (("ggml", "ggml"), ("ggml_f16", "ggml f16 K/V")):
            fig = p.get(peer, {})
            if "failed" in fig:
                notes.append("%s failed at %s: %s" % (label, s["spec"], fig["failed"]))
            elif peer == "ggml_f16" and fig.get("max_rel_err", 0) > 1e-3:
                notes.append("ggml f16 K/V at %s: error %.2g relative to the f16-input "
                             "reference (ggml accumulates P V in f16 there)"
                             % (s["spec"], fig["max_rel_err"]))
        print(row_fmt % (
            s["spec"], fmt(a), fmt(t), fmt(tkv), fmt(n), fmt(g), fmt(h),
            fmt(a / t if t else None, "%.3gx"), fmt(a / g if g else None, "%.3gx"),
            fmt(pct(a), "%.1f%%"), fmt(pct(t), "%.1f%%"), fmt(pct(n), "%.1f%%"),
            fmt(pct(g), "%.1f%%")))
        if s["Lq"] == 1:
            ms = (lambda peer: fmt(p.get(peer, {}).get("ms_median"), "%.2f"))
            gbs = (lambda peer: fmt(p.get(peer, {}).get("gbs")))
            rb = s.get("read_bw", {}).get("gbs")
            notes.append(
                "decode %s: ms (cache GB/s) sdpa %.2f (%.1f), torch %s (%s)%s, numpy %s (%s), "
                "ggml %s (%s), ggml f16 %s (%s); read bandwidth %s GB/s at this working set "
                "(%.1f MB, sdpa at %s of it), DRAM %.1f GB/s" % (
                    s["spec"], s["ms_median"], s["gbs"], ms("torch"), gbs("torch"),
                    ", torch in %s %s (%s)" % (p["torch_kv"]["dtype"], ms("torch_kv"),
                                               gbs("torch_kv")) if "torch_kv" in p else "",
                    ms("numpy"), gbs("numpy"), ms("ggml"), gbs("ggml"), ms("ggml_f16"),
                    gbs("ggml_f16"), fmt(rb), s.get("read_bw", {}).get("bytes", 0) / 1e6,
                    fmt(s.get("pct_bandwidth") if rb else None, "%.1f%%"),
                    sdpa["peak"]["read_gbs"]))
        if p.get("ggml_inputs_differ"):
            notes.append("ggml at %s: its worker drew other inputs than torch's (numpy versions "
                         "that draw differently?); same distribution, other values" % s["spec"])
        if p["torch"].get("gqa") == "expanded":
            notes.append("torch at %s: no enable_gqa in this torch, K and V expanded to Hq "
                         "heads before timing" % s["spec"])
    print()
    if peers.get("ggml_error"):
        notes.append("ggml: %s" % peers["ggml_error"])
    for line in notes:
        print(line)
    print("GFLOP/s = 4*B*Hq*D*(visible pairs) / median time, the same count for all of them.")
    print("dtypes: sdpa and torch run Q/O and K/V in the shape's dtypes (dt = Q/O[/K/V]); "
          "numpy in f32 and ggml with f32 Q and f32 or f16 K/V, on the same values rounded "
          "to the shape's dtypes.")
    if mixed_seen:
        print("torch: where Q/O and K/V differ, K and V are converted to Q's dtype inside the "
              "timed call; 'torch kv' runs all in the K/V dtype (Q converted before the clock).")
    print("cache GB/s: the bytes of K and V each one reads (sdpa and torch in the K/V dtype, "
          "numpy and ggml in f32, ggml f16 in f16) / median time.")
    for w in warn:
        print("WARNING: --isa avx2, but %s." % w)


def print_backward_table(args, sdpa, peers, peak, round_sdpa=None):
    """--backward: sdpa_backward and torch autograd through F.scaled_dot_product_attention."""
    print()
    print("backward: sdpa %s vs torch %s autograd: %d thread%s, %s, %s" % (
        sdpa["sdpa_version"], peers["torch_version"], sdpa["threads"],
        "" if sdpa["threads"] == 1 else "s", sdpa["cpu_model"], sdpa["date"]))
    line, warn = isa_line(args, sdpa, peers)
    print(line)
    kern = [ln.split(":", 1)[1].strip() for ln in sdpa.get("describe", "").splitlines()
            if ln.startswith("backward:")]
    if kern:
        print("sdpa_backward runs on: %s" % kern[0])
    print_peak(sdpa, peak, round_sdpa)
    print()
    row_fmt = "%-34s %9s %9s %9s %9s %10s %9s %9s %9s %9s"
    print(row_fmt % ("shape (B,H,Lq,Lk,D[,mask])", "sdpa bwd", "torch bwd", "sdpa bwd",
                     "torch bwd", "sdpa/torch", "sdpa", "torch", "sdpa %pk", "torch %pk"))
    print(row_fmt % ("", "ms", "ms", "GFLOP/s", "GFLOP/s", "(bwd)", "bwd/fwd", "bwd/fwd", "(bwd)",
                     "(bwd)"))
    notes = []
    pct = (lambda x: None if x is None or not peak else 100.0 * x / peak)
    for s, p in zip(sdpa["shapes"], peers["shapes"]):
        a, t = s["gflops"], p["torch"].get("gflops")
        print(row_fmt % (
            s["spec"], fmt(s["ms_median"], "%.3f"), fmt(p["torch"].get("ms_median"), "%.3f"),
            fmt(a), fmt(t), fmt(a / t if t else None, "%.3gx"),
            fmt(s.get("bwd_over_fwd"), "%.2f"), fmt(p["torch"].get("bwd_over_fwd"), "%.2f"),
            fmt(pct(a), "%.1f%%"), fmt(pct(t), "%.1f%%")))
        if p["torch"].get("gqa") == "expanded":
            notes.append("torch at %s: no enable_gqa in this torch, K and V expanded to Hq "
                         "heads before timing (their gradients are not summed over the group)"
                         % s["spec"])
    print()
    for line in notes:
        print(line)
    print("numpy and ggml: not timed for the backward (the seeds' numpy code is forward only; "
          "ggml_flash_attn_ext has no backward, and ggml_flash_attn_back is the old op).")
    print("GFLOP/s = 2.5 * 4*B*Hq*D*(visible pairs) / median backward time, the same count for "
          "both; bwd/fwd = median backward / median forward, each repetition a timed forward "
          "then the timed backward of its result (torch: the forward with requires_grad "
          "inputs, the backward torch.autograd.grad(out, (q, k, v), dout)).")
    for w in warn:
        print("WARNING: --isa avx2, but %s." % w)


def run_sdpa(args, sdpa_env, tmp):
    """sdpa bench --json at the preset's or the --shape shapes; returns its JSON."""
    out = os.path.join(tmp, "sdpa.json")
    cmd = [args.sdpa, "bench", "--threads", str(args.threads), "--json", out,
           "--reps", str(args.reps), "--warmup", str(args.warmup),
           "--min-time", str(args.min_time)]
    cmd += [a for s in args.shape for a in ("--shape", s)] or ["--preset", args.preset]
    if args.backward:
        cmd.append("--backward")
    for opt, val in (("--dtype", args.dtype), ("--kv-dtype", args.kv_dtype)):
        if val:
            cmd += [opt, val]
    print("$ %s%s" % ("SDPA_MAX_ISA=avx2 " if args.isa == "avx2" else "", " ".join(cmd)),
          flush=True)
    if subprocess.call(cmd, env=sdpa_env) != 0:
        sys.exit("run_peers.py: sdpa bench failed")
    return json.load(open(out))


def run_peers(args, py, gpy, peer_env, shapes, tmp):
    """The torch/numpy worker, then ggml's (when gpy), at the shapes of sdpa bench's JSON;
    returns the torch/numpy worker's figures with ggml's added to each shape."""
    # torch and numpy, in their own interpreter, with the BLAS held to the same threads.
    job = {"threads": args.threads, "reps": args.reps, "warmup": args.warmup,
           "min_time": args.min_time, "numpy_max_bytes": args.numpy_max_gb * 1e9,
           "isa": args.isa, "backward": args.backward, "shapes": shapes}
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    job_path, res = os.path.join(tmp, "job.json"), os.path.join(tmp, "peers.json")
    json.dump(dict(job, peers="torch,numpy"), open(job_path, "w"))
    if run_worker(py, "torch, numpy", job_path, res, dict(env, **peer_env)) != 0:
        sys.exit("run_peers.py: the peers failed (is torch 2.x installed in %s?)" % py)
    peers = json.load(open(res))
    peers["env"] = peer_env

    # ggml, in a process of its own; its failure costs its columns, not the run.
    if gpy:
        json.dump(dict(job, peers="ggml"), open(job_path, "w"))
        res = os.path.join(tmp, "ggml.json")
        # numpy there only draws the inputs and computes the check's reference: one BLAS
        # thread, so that no idle BLAS worker competes with ggml's N threads for cores.
        rc = run_worker(gpy, "ggml", job_path, res,
                        dict(env, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1"))
        if rc != 0:
            peers["ggml_error"] = "its worker failed (exit status %d; its message is " \
                                  "above), no figures" % rc
        else:
            got = json.load(open(res))
            peers["ggml_info"] = got["ggml_info"]
            for row, g in zip(peers["shapes"], got["shapes"]):
                row["ggml"], row["ggml_f16"] = g["ggml"], g["ggml_f16"]
                row["ggml_inputs_differ"] = g["inputs_crc32"] != row["inputs_crc32"]
    return peers


def tile_probe(args, sdpa_env, tmp):
    """The AMX unit's rate now (sdpa bench's tile peak at its end, GFLOP/s at --threads) from a
    tiny bf16 shape the unit takes; None where sdpa's kernels do not run on a unit."""
    out = os.path.join(tmp, "probe.json")
    subprocess.check_call([args.sdpa, "bench", "--threads", str(args.threads), "--shape",
                           "1,1,16,16,32,bf16", "--reps", "1", "--warmup", "0", "--min-time",
                           "0", "--json", out], stdout=subprocess.DEVNULL, env=sdpa_env)
    return json.load(open(out))["peak"]["end"].get("tile_gflops")


def run_peers_timed(args, py, gpy, peer_env, shapes, tmp, sdpa_env, unit):
    """run_peers; where sdpa's kernels run on an AMX unit (unit), with the unit's rate right
    before and after (tile_probe) as "tile_around", so that a round's figures can be read
    against the rate the unit had for each side."""
    before = tile_probe(args, sdpa_env, tmp) if unit else None
    peers = run_peers(args, py, gpy, peer_env, shapes, tmp)
    if unit:
        peers["tile_around"] = [before, tile_probe(args, sdpa_env, tmp)]
    return peers


def merge_rounds(xs):
    """The rounds' JSON (sdpa's, or the peers') merged into one of the same form: dicts key by
    key (the keys of round 0), lists element by element, and a number (not a bool) that every
    round has at that place becomes the median of the rounds' (a figure that is the same in
    all, like a shape's B or flops, stays itself); None if some round has None there; anything
    else (strings, bools, a key or list some round lacks) is round 0's."""
    x0 = xs[0]
    if isinstance(x0, dict) and all(isinstance(x, dict) for x in xs):
        return {k: merge_rounds([x[k] for x in xs]) if all(k in x for x in xs) else v
                for k, v in x0.items()}
    if isinstance(x0, list) and all(isinstance(x, list) and len(x) == len(x0) for x in xs):
        return [merge_rounds(list(col)) for col in zip(*xs)]
    if any(x is None for x in xs):
        return None
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        return x0 if all(x == x0 for x in xs) else statistics.median(xs)
    return x0


def print_peak(sdpa, peak, round_sdpa, round_peers=None):
    """The header's FMA peak line; with --rounds, a second one with each round's; where sdpa's
    kernels run on an AMX unit, the unit's rate around sdpa's run and (round_peers) around the
    peers' in each round."""
    print("FP32 FMA peak measured by sdpa bench: %.1f GFLOP/s (start %.1f, end %.1f, %s loop)" % (
        peak, sdpa["peak"]["start"]["fma_gflops"], sdpa["peak"]["end"]["fma_gflops"],
        sdpa["peak"]["start"]["isa"]))
    if round_sdpa:
        print("FMA peak of each round's sdpa bench, start/end (the line above has their "
              "medians): %s" % ", ".join(
                  "%s/%s" % (fmt(x["peak"]["start"]["fma_gflops"]),
                             fmt(x["peak"]["end"]["fma_gflops"])) for x in round_sdpa))
    # the AMX unit's rate, which sdpa bench measures where its kernels run on the unit (it has
    # slow phases of its own, which the FMA peak does not show)
    runs = round_sdpa or [sdpa]
    if any(x["peak"][w].get("tile_gflops") is not None for x in runs for w in ("start", "end")):
        print("AMX tile peak of %s sdpa bench, start/end: %s" % (
            "each round's" if round_sdpa else "the", ", ".join(
                "%s/%s" % (fmt(x["peak"]["start"].get("tile_gflops"), "%.0f"),
                           fmt(x["peak"]["end"].get("tile_gflops"), "%.0f")) for x in runs)))
    if round_peers and any(x.get("tile_around") for x in round_peers):
        print("AMX tile peak right before and after each round's torch/numpy run: %s" % ", ".join(
            "%s/%s" % tuple(fmt(t, "%.0f") for t in x.get("tile_around") or (None, None))
            for x in round_peers))


def tiles_agree(x, spread=0.15):
    """Whether a round's four AMX tile peaks (sdpa's start and end, and right before and after
    the peers) were all measured and lie within `spread` of their highest: the unit ran at
    one rate for both sides (a unit has slow phases; docs/benchmarks.md)."""
    t = [x["sdpa"]["peak"][w].get("tile_gflops") for w in ("start", "end")]
    t += list(x["peers"].get("tile_around") or (None, None))
    return all(v for v in t) and min(t) >= (1.0 - spread) * max(t)


def print_round_ratios(rounds):
    """--rounds: per shape, each round's sdpa/torch (GFLOP/s) and their median; where sdpa ran
    on an AMX unit, also those of the rounds whose tile peaks agree (tiles_agree)."""
    print()
    unit = any(x["peers"].get("tile_around") for x in rounds)
    for i, s in enumerate(rounds[0]["sdpa"]["shapes"]):
        ratios = []
        for x in rounds:
            a = x["sdpa"]["shapes"][i].get("gflops")
            t = x["peers"]["shapes"][i].get("torch", {}).get("gflops")
            if not a or not t:
                break
            ratios.append(a / t)
        else:
            print("rounds sdpa/torch at %s: %s (median %.2f)" % (
                s["spec"], " ".join("%.2f" % q for q in ratios), statistics.median(ratios)))
            if unit and s.get("pct_tile_peak") is not None:  # a shape the unit takes
                kept = [(r + 1, q) for r, (x, q) in enumerate(zip(rounds, ratios))
                        if tiles_agree(x)]
                print("  of those, the rounds whose 4 AMX tile peaks agree within 15 %%: %s" % (
                    "%s (median %.2f)" % (" ".join("%.2f (round %d)" % (q, r) for r, q in kept),
                                          statistics.median(q for _, q in kept))
                    if kept else "none"))


def run_worker(py, what, job, res, env):
    print("$ %s %s --worker  (%s)" % (py, os.path.relpath(__file__), what), flush=True)
    return subprocess.call([py, os.path.abspath(__file__), "--worker", job, res], env=env)


def main():
    ap = argparse.ArgumentParser(
        description="Time sdpa, PyTorch SDPA, the seeds' numpy code and ggml's flash "
                    "attention side by side.",
        epilog="Shapes and presets are those of `sdpa bench`; see its --help.")
    ap.add_argument("--preset", choices=("quick", "full", "decode"), default="quick")
    ap.add_argument("--shape", action="append", default=[],
                    help="B,H,Lq,Lk,D[,causal|causal-br|causal-add][,DTYPE] (H may be Hq/Hkv, DTYPE T "
                         "or T/KVT); repeatable; replaces the preset")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16"),
                    help="Q, K, V and O's dtype (sdpa bench --dtype; default f32)")
    ap.add_argument("--kv-dtype", choices=("f32", "f16", "bf16"),
                    help="K and V's dtype (sdpa bench --kv-dtype; default --dtype, f16 in the "
                         "decode preset)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for every implementation (default: all CPUs)")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="instruction set level of every system: what the CPU has (default), "
                         "or AVX2 + FMA for all, also on a CPU with AVX-512")
    ap.add_argument("--sdpa", default=os.path.join(ROOT, "build", "cli", "sdpa"),
                    help="the sdpa binary (default build/cli/sdpa)")
    ap.add_argument("--python", help="an interpreter with torch 2.x and numpy; "
                                     "default: bench/peers/.venv, created on first use")
    ap.add_argument("--ggml-python", help="an interpreter with ggml-python and numpy; default: "
                                          "bench/peers/.venv (--isa native) or .venv-avx2, "
                                          "created on first use")
    ap.add_argument("--no-ggml", action="store_true", help="leave ggml out")
    ap.add_argument("--backward", action="store_true",
                    help="time the backward instead: sdpa bench --backward against torch "
                         "autograd through F.scaled_dot_product_attention (numpy and ggml "
                         "are not run)")
    ap.add_argument("--torch-index-url", default=TORCH_CPU_INDEX,
                    help="pip index for torch when filling the venv (default: the CPU wheels; "
                         "'' for PyPI)")
    ap.add_argument("--reps", type=int, default=100, help="at most N timed calls per shape")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per shape")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="time budget per shape and implementation, seconds (default 1)")
    ap.add_argument("--numpy-max-gb", type=float, default=3.0,
                    help="skip numpy where its Lq x Lk arrays need more (default 3)")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="run sdpa and the peers N times, alternating who goes first (sdpa in "
                         "the 1st, 3rd, ... round, the peers in the 2nd, 4th, ...), and show "
                         "the median of each figure over the rounds, each round's FMA peaks "
                         "and each round's sdpa/torch: the way to compare on a noisy, shared "
                         "machine, where a slow spell would otherwise fall on one side only "
                         "(default 1)")
    ap.add_argument("--json", help="also write all figures (sdpa's JSON plus the peers') here; "
                                   "with --rounds, also each round's under \"rounds\"")
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if args.threads < 1 or args.reps < 1 or args.warmup < 0 or args.min_time < 0:
        ap.error("--threads and --reps must be >= 1, --warmup and --min-time >= 0")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if not os.access(args.sdpa, os.X_OK):
        sys.exit("run_peers.py: %s is not an executable; build it with `make` or pass --sdpa"
                 % args.sdpa)

    # The interpreters first: filling a venv takes minutes, and should not sit between sdpa's
    # figures and the peers'.
    py = peers_python(args)
    gpy = None if args.no_ggml or args.backward else ggml_python(args)
    sdpa_env, peer_env = isa_envs(args, py)
    sdpa_env = dict(os.environ, **sdpa_env)

    with tempfile.TemporaryDirectory() as tmp:
        # 1.-3. sdpa, then the peers; with --rounds N, N rounds of them, in alternating order.
        # Round 0 runs sdpa first, whose JSON defines the shapes.
        rounds = []
        for r in range(args.rounds):
            first = "sdpa" if r % 2 == 0 else "peers"
            if args.rounds > 1:
                print("round %d of %d: %s first" % (r + 1, args.rounds, first), flush=True)
            if first == "sdpa":
                sdpa = run_sdpa(args, sdpa_env, tmp)
            # round 0's sdpa bench (it goes first) gives the shapes, and says whether sdpa's
            # kernels run on an AMX unit, to be timed around the peers too
            sdpa0 = rounds[0]["sdpa"] if rounds else sdpa
            unit = sdpa0["peak"]["start"].get("tile_gflops") is not None
            peers = run_peers_timed(args, py, gpy, peer_env, sdpa0["shapes"], tmp, sdpa_env, unit)
            if first == "peers":
                sdpa = run_sdpa(args, sdpa_env, tmp)
            if rounds and [s["spec"] for s in sdpa["shapes"]] != [
                    s["spec"] for s in rounds[0]["sdpa"]["shapes"]]:
                sys.exit("run_peers.py: sdpa bench gave other shapes in round %d" % (r + 1))
            rounds.append({"first": first, "sdpa": sdpa, "peers": peers})
        if args.rounds > 1:
            sdpa = merge_rounds([x["sdpa"] for x in rounds])
            peers = merge_rounds([x["peers"] for x in rounds])
            errors = ["round %d: %s" % (r + 1, x["peers"]["ggml_error"])
                      for r, x in enumerate(rounds) if x["peers"].get("ggml_error")]
            if errors:
                peers["ggml_error"] = "; ".join(errors)

        # 4. The peak once more, right after the peers: the machine is shared, and a peak that
        # moved tells that some figures of this run were taken while something else ran.
        after = os.path.join(tmp, "after.json")
        subprocess.check_call([args.sdpa, "bench", "--threads", str(args.threads), "--shape",
                               "1,1,16,16,8", "--reps", "1", "--warmup", "0", "--min-time", "0",
                               "--json", after], stdout=subprocess.DEVNULL, env=sdpa_env)
        peers["peak_after"] = json.load(open(after))["peak"]["end"]

    # Every round's start and end peaks of sdpa bench, then the one after the peers. With one
    # round, sdpa's start and end; with several, the table's peak is the higher of their
    # medians (the merged sdpa's).
    peaks = [x["sdpa"]["peak"][when]["fma_gflops"] or 0 for x in rounds
             for when in ("start", "end")] + [peers["peak_after"]["fma_gflops"] or 0]
    peak = max(sdpa["peak"]["start"]["fma_gflops"] or 0, sdpa["peak"]["end"]["fma_gflops"] or 0)
    round_sdpa = [x["sdpa"] for x in rounds] if args.rounds > 1 else None
    if args.backward:
        print_backward_table(args, sdpa, peers, peak, round_sdpa)
    else:
        print_table(args, sdpa, peers, peak, round_sdpa, [x["peers"] for x in rounds])
    if args.rounds > 1:
        print_round_ratios(rounds)
    print("FMA peak after the %s: %.1f GFLOP/s." % (
        "last round" if args.rounds > 1 else "peers", peaks[-1]))
    if min(peaks) < 0.85 * max(peaks):
        print("WARNING: the FMA peaks of this run (%s GFLOP/s) differ by more than 15 %%: the "
              "machine was busy for part of it. Rerun before believing the figures."
              % ", ".join("%.0f" % x for x in peaks))
    if args.json:
        out = {"sdpa": sdpa, "peers": peers, "threads": args.threads, "isa": args.isa,
               "backward": args.backward}
        if args.rounds > 1:
            out["rounds"] = rounds
        with open(args.json + ".tmp", "w") as f:
            json.dump(out, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
