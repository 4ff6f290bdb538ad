"""ggml_peer.py -- ggml's CPU flash attention (ggml_flash_attn_ext) as a peer of run_peers.py.

The worker of run_peers.py imports this file in an interpreter that has ggml-python (the ctypes
binding of ggml's C API, built from its sdist with CMake) and numpy. For one shape it builds a
ggml graph of a single GGML_OP_FLASH_ATTN_EXT node once, checks the node's output against a
float64 numpy reference, then times ggml_graph_compute alone, with N threads and a thread pool
made once. Twice per shape: K and V in f32 (the main figure, the same arrays as the other
peers get) and K and V converted to f16 beforehand (what ggml's users usually run).

Layouts. numpy's C-order (B, H, L, D) is ggml's ne = [D, L, H, B] (ne[0] varies fastest), which
is what ggml_flash_attn_ext takes for Q, K and V (V not transposed). Its result is permuted:
ne = [D, Hq, Lq, B], read back as (B, Lq, Hq, D). Grouped-query shapes need nothing: ggml maps
query head h to K/V head h / (Hq / Hkv), as torch's enable_gqa and numpy's np.repeat do.

The causal mask is an additive F16 tensor of ne = [Lk, Lq, 1, 1] (0 where visible, -inf where
not), broadcast over heads and batches. ggml 0.15.3, vendored by ggml-python 0.0.45, asks of it
only F16, contiguity and at least Lq rows (the CPU kernel reads row i for query row i). The
GGML_KQ_MASK_PAD = 32 that the binding still exports, with its comment that the rows be padded
to a multiple of it, is left over from older ggml: that ggml's header no longer has it, and no
rows are padded here.

ggml stops the process (GGML_ASSERT calls abort()) on arguments it rejects, which is one reason
why run_peers.py runs it in a process of its own.
"""

import ctypes
import math

# A shape whose ggml output differs from the reference by more than this, relative to the
# reference's largest magnitude, is recorded as failed instead of timed.
TOLERANCE = 1e-3

# The same bound for K and V in f16, looser because ggml's kernel for one query row at a time
# (decode, and any shape of fewer than 64 query rows) rounds Q to f16 and accumulates P V in
# an f16 vector: measured 0.3 to 2 % at Lk 512 to 4096 and 5 % at Lk 16384 with 1 thread (a
# thread sums Lk / N keys). A wrong layout, head mapping or mask costs errors of order 1.
TOLERANCE_F16 = 0.1

# Results with at most this many multiply-adds in Q K^T are checked whole; larger ones on a
# slice of batches, heads and query rows (see check_slice).
CHECK_ALL_MACS = 1 << 24


def info(ggml):
    """What the loaded ggml is: versions and the instruction sets it was compiled for. ggml's
    ggml_cpu_has_* answer from the compiler's macros, so they describe the build (-march=native
    or the GGML_AVX* options), not the CPU."""
    feats = [f for f in ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vbmi", "avx512_vnni",
                         "avx512_bf16", "amx_int8")
             if getattr(ggml, "ggml_cpu_has_" + f, lambda: 0)()]
    isa = "avx512" if "avx512" in feats else "avx2" if "avx2" in feats else (
        "avx" if "avx" in feats else "generic")
    version = ggml.ggml_version() if hasattr(ggml, "ggml_version") else b"?"
    return {"ggml_python_version": getattr(ggml, "__version__", "?"),
            "ggml_version": version.decode() if isinstance(version, bytes) else str(version),
            "isa": isa, "features": feats}


class FlashAttention:
    """One ggml context holding Q, K, V, the mask and the flash attention node, its graph, its
    compute plan and the plan's work buffer, for one shape and one K/V type."""

    def __init__(self, ggml, np, q, k, v, vis, kv_f16, n_threads, threadpool):
        self.ggml, self.np = ggml, np
        B, Hq, Lq, D = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        kv_type = ggml.GGML_TYPE_F16 if kv_f16 else ggml.GGML_TYPE_F32
        kv_np = np.float16 if kv_f16 else np.float32
        arrays = [q, k.astype(kv_np), v.astype(kv_np)]
        if vis is not None:
            arrays.append(np.where(vis, 0.0, -np.inf).astype(np.float16))  # (Lq, Lk)
        out_bytes = B * Hq * Lq * D * 4
        mem = (sum(a.nbytes for a in arrays) + out_bytes + 8 * ggml.ggml_tensor_overhead()
               + ggml.ggml_graph_overhead() + (1 << 20))
        self.ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None,
                                                        no_alloc=False))
        if not self.ctx:
            raise MemoryError("ggml_init could not allocate %d bytes" % mem)
        ctx = self.ctx

        def tensor(typ, arr, ne):
            t = ggml.ggml_new_tensor_4d(ctx, typ, *ne)
            ctypes.memmove(ggml.ggml_get_data(t), arr.ctypes.data, arr.nbytes)
            return t

        tq = tensor(ggml.GGML_TYPE_F32, np.ascontiguousarray(q), (D, Lq, Hq, B))
        tk = tensor(kv_type, np.ascontiguousarray(arrays[1]), (D, Lk, Hkv, B))
        tv = tensor(kv_type, np.ascontiguousarray(arrays[2]), (D, Lk, Hkv, B))
        tm = tensor(ggml.GGML_TYPE_F16, arrays[3], (Lk, Lq, 1, 1)) if vis is not None else None
        self.out = ggml.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, 1.0 / math.sqrt(D), 0.0, 0.0)
        self.graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(self.graph, self.out)
        self.plan = ggml.ggml_graph_plan(self.graph, n_threads, threadpool)
        # The work buffer lives as long as this object; ggml_graph_compute_with_ctx would take
        # a new one from the context at every call.
        self.work = np.empty(max(self.plan.work_size, 1), dtype=np.uint8)
        self.plan.work_data = ctypes.cast(self.work.ctypes.data, ctypes.POINTER(ctypes.c_uint8))
        self.shape = (B, Lq, Hq, D)

    def compute(self):
        status = self.ggml.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != self.ggml.GGML_STATUS_SUCCESS:
            raise RuntimeError("ggml_graph_compute returned status %d" % status)

    def result(self):
        """The output as a (B, Hq, Lq, D) float32 copy."""
        np = self.np
        n = int(np.prod(self.shape))
        buf = (ctypes.c_float * n).from_address(self.ggml.ggml_get_data(self.out))
        return np.ctypeslib.as_array(buf).reshape(self.shape).transpose(0, 2, 1, 3).copy()

    def close(self):
        if self.ctx:
            self.ggml.ggml_free(self.ctx)
            self.ctx = None


def check_slice(np, B, Hq, Lq, Lk, D):
    """The batches, query heads and query rows whose output is compared: all of them for a
    small shape; otherwise the first and last batch, eight heads spread over Hq (the first and
    the last among them, so that both ends of every K/V group mapping are seen) and 64 query
    rows (both edges of the range, where the causal diagonal and ggml's 64-row tiles begin and
    end, and rows spread between them)."""
    if B * Hq * Lq * Lk * D <= CHECK_ALL_MACS:
        return list(range(B)), list(range(Hq)), np.arange(Lq)
    heads = sorted(set(np.linspace(0, Hq - 1, min(Hq, 8)).round().astype(int).tolist()))
    rows = np.unique(np.concatenate([np.arange(min(Lq, 16)), np.arange(max(Lq - 16, 0), Lq),
                                     np.linspace(0, Lq - 1, 32).round().astype(int)]))
    return sorted({0, B - 1}), heads, rows


def check(np, out, q, k, v, vis, kv_f16):
    """The largest |ggml - reference| over the checked slice, relative to the reference's
    largest magnitude there. The reference is softmax(Q K^T / sqrt(D)) V in float64 from the
    K and V that ggml got (rounded to f16 for the f16 variant); a query row that sees no key
    gives zeros, as ggml's kernel does."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    if kv_f16:
        k, v = k.astype(np.float16), v.astype(np.float16)
    batches, heads, rows = check_slice(np, B, Hq, Lq, Lk, D)
    err = ref_max = 0.0
    for b in batches:
        for h in heads:
            q_bh = q[b, h, rows].astype(np.float64)           # (r, D)
            k_bh = k[b, h // g].astype(np.float64)            # (Lk, D)
            v_bh = v[b, h // g].astype(np.float64)            # (Lk, D)
            scores = q_bh @ k_bh.T / math.sqrt(D)             # (r, Lk)
            if vis is not None:
                scores = np.where(vis[rows], scores, -np.inf)
            row_max = scores.max(axis=1, keepdims=True)
            seen = np.isfinite(row_max)
            p = np.exp(scores - np.where(seen, row_max, 0.0))
            p /= np.where(seen, p.sum(axis=1, keepdims=True), 1.0)
            ref = p @ v_bh                                    # (r, D)
            err = max(err, float(np.abs(out[b, h, rows] - ref).max()))
            ref_max = max(ref_max, float(np.abs(ref).max()))
    return err / ref_max if ref_max > 0 else err


def measure(ggml, np, q, k, v, vis, n_threads, threadpool, timer):
    """The figures of one shape: {"ggml": ..., "ggml_f16": ...}, each the dict of timer(fn)
    (peers_worker.py's time_calls and summary) plus the check's "max_rel_err", or {"failed":
    reason} when the error passes TOLERANCE (TOLERANCE_F16 for f16 K/V) or ggml raises."""
    row = {}
    for name, kv_f16 in (("ggml", False), ("ggml_f16", True)):
        fa = None
        try:
            fa = FlashAttention(ggml, np, q, k, v, vis, kv_f16, n_threads, threadpool)
            fa.compute()
            err = check(np, fa.result(), q, k, v, vis, kv_f16)
            tol = TOLERANCE_F16 if kv_f16 else TOLERANCE
            if not err <= tol:  # also catches a NaN
                row[name] = {"failed": "output differs from the reference by %.3g relative "
                                       "(tolerance %g)" % (err, tol), "max_rel_err": err}
                continue
            row[name] = timer(fa.compute)
            row[name]["max_rel_err"] = err
        except (RuntimeError, MemoryError, OSError, ctypes.ArgumentError) as e:
            row[name] = {"failed": "%s: %s" % (type(e).__name__, e)}
        finally:
            if fa is not None:
                fa.close()
    return row


def new_threadpool(ggml, n_threads):
    """A thread pool for all the shapes of a run, so that no timed call creates one. With the
    OpenMP build (ggml's default) the pool holds the workers' state and OpenMP's own threads
    run them, num_threads(N) per call."""
    params = ggml.ggml_threadpool_params_default(n_threads)
    pool = ggml.ggml_threadpool_new(ctypes.byref(params))
    if not pool:
        raise RuntimeError("ggml_threadpool_new(%d threads) failed" % n_threads)
    return pool
