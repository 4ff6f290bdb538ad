"""peers_worker.py -- the peers of run_peers.py, timed in the peers' own interpreter.

run_peers.py runs itself as a child process, `run_peers.py --worker JOB OUT`, in the interpreter
of --python (torch and numpy) or of --ggml-python (ggml), and that child calls worker(JOB, OUT)
here. The file JOB is run_peers.py's job: threads, reps, warmup, min_time, numpy_max_bytes,
isa, backward, the shapes of sdpa bench's JSON, and peers ("torch,numpy" or "ggml"). It times
each of those peers at every shape as sdpa bench times itself (warm-up calls, then repetitions
until reps or min_time, the median) on inputs drawn from the shape's seed, and writes to the
file OUT the JSON of their figures per shape, with the CRC of the inputs and the ISA each peer
reported.

Only the standard library is imported here: numpy, torch and ggml (through ggml_peer.py, which
the child finds beside run_peers.py, the directory of the script it runs) are imported by the
functions that use them, so that the driver can import this file in any interpreter.
"""

import json
import statistics
import sys
import time
import zlib


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
