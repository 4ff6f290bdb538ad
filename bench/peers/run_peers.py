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

The files: run_peers.py is the driver (standard library only: the virtual environments, sdpa
bench, the workers' processes, the rounds, the JSON); peers_worker.py, what the worker process
runs (torch and numpy, or ggml through ggml_peer.py); peers_table.py, the tables.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from peers_table import print_backward_table, print_round_ratios, print_table
from peers_worker import worker

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
