"""sdpa: scaled dot-product attention, softmax(Q K^T * scale + bias) V, on the CPU.

The Python face of the sdpa C library (include/sdpa.h is its manual): exact, deterministic
for any thread count, with every feature of PyTorch's attention and a few it lacks.

    import numpy as np, sdpa
    q = np.random.randn(2, 8, 128, 64).astype(np.float32)   # (..., L, E)
    k = np.random.randn(2, 8, 128, 64).astype(np.float32)   # (..., S, E)
    v = np.random.randn(2, 8, 128, 64).astype(np.float32)   # (..., S, Ev)
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)

Functions:
  scaled_dot_product_attention  PyTorch's F.scaled_dot_product_attention, plus keyword-only
                                window, alignment, softcap, alibi_slopes, sinks, return_lse,
                                context
  attention_weights             the softmax probabilities themselves (for heatmaps)
  attention_backward            dq, dk, dv of the forward, given dL/dout (and its out and lse)
  forward_kv                    attention of new tokens to a KV cache: per-sequence lengths
                                (a ragged batch) and paged caches (a page pool and a block
                                table, as vLLM and FlashAttention keep them)
  merge                         (out, lse) over the union of disjoint key sets, from the
                                (out, lse) of each (split-KV decode, chunked prefill)
  info                          the library's version, kernels and threads
  Context                       a context of its own: threads and an instruction-set cap

Inputs are numpy arrays (float32, float16; bfloat16 through ml_dtypes) or CPU torch tensors
(float32, float16, bfloat16), with any strides the C library can take as a view (no copy);
the result is of the query's kind and dtype. The GIL is released while the library computes.
sdpa.torch registers the forward and backward as a PyTorch custom operator.

Where sdpa and PyTorch differ, on purpose: a query row that can see no key (fully masked)
gives 0, not NaN, and its gradients are 0.

Attention sinks (sinks=, one logit per query head, as gpt-oss and ggml use them): each row's
softmax gains exp(sink_h) in its denominator, as if a key of score sink_h and value 0 were
visible to every row, so lse = log(exp(sink_h) + sum_j exp(s_ij)) and a row's weights sum to
less than 1. The sink takes no part in masks, windows, ALiBi, softcap or dropout; a -inf sink
is no sink; a fully masked row gives 0 with lse = sink_h. The sinks get no gradient (the
library computes none; sdpa.torch refuses sinks that require one).
"""

import os
import threading

import numpy as np

from . import _sdpa

__all__ = ["scaled_dot_product_attention", "attention_weights", "attention_backward",
           "forward_kv", "merge", "info", "Context"]
__version__ = _sdpa.version()

_ISA = {None: _sdpa.ISA_AUTO, "auto": _sdpa.ISA_AUTO, "generic": _sdpa.ISA_GENERIC,
        "avx2": _sdpa.ISA_AVX2, "avx512": _sdpa.ISA_AVX512, "amx": _sdpa.ISA_AMX}
_ALIGN = {"top-left": _sdpa.ALIGN_TOP_LEFT, "bottom-right": _sdpa.ALIGN_BOTTOM_RIGHT}


class Context(_sdpa.Context):
    """Context(n_threads=0, max_isa=None): the library's worker threads, kernels and scratch.

    n_threads: 0 = one per online core. max_isa: None (the best the CPU offers), "generic",
    "avx2", "avx512" or "amx" caps the kernels. A context runs one call at a time: a call
    from another thread while one runs raises RuntimeError (SDPA_ERR_BUSY). Without a
    context argument, each Python thread gets a default context of its own.
    Attributes: n_threads, isa, kernel (the implementation the context prefers; flash-amx
    passes problems other than bf16 to flash-avx512), last_kernel (what the last successful
    call on it ran: "" before any), description.
    """

    def __init__(self, n_threads=0, max_isa=None):
        if max_isa not in _ISA:
            raise ValueError("max_isa=%r: expected None, 'generic', 'avx2', 'avx512' or 'amx'"
                             % (max_isa,))
        super().__init__(int(n_threads), _ISA[max_isa])

    def __repr__(self):
        return "sdpa.Context(n_threads=%d, kernel=%r, isa=%r)" % (
            self.n_threads, self.kernel, self.isa)


_local = threading.local()


def _default_context():
    try:
        return _local.ctx
    except AttributeError:
        ctx = _local.ctx = Context()
        return ctx


# ---- tensors ----------------------------------------------------------------------------

def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


_sdpa.set_numpy(np.ndarray, np.empty, np.dtype(np.float32), np.dtype(np.float16))
_fast_forward = _sdpa.fast_forward

_NUMPY_CODES = {np.dtype(np.float32).num: _sdpa.F32, np.dtype(np.float16).num: _sdpa.F16,
                np.dtype(np.bool_).num: _sdpa.BOOL}


def _view(x, name, allow_bool=False):
    """(ndarray sharing x's memory, dtype code, 'numpy' or 'torch') for a numpy array or a
    CPU torch tensor."""
    if type(x) is np.ndarray:  # the common case first: a call's overhead is in these lines
        code = _NUMPY_CODES.get(x.dtype.num)
        if code is not None and (code != _sdpa.BOOL or allow_bool):
            return x, code, "numpy"
    if _is_torch(x):
        import torch
        if x.device.type != "cpu":
            raise ValueError("%s: a tensor on %s; sdpa runs on the CPU (move it with .cpu())"
                             % (name, x.device))
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), _sdpa.BF16, "torch"
        codes = {torch.float32: _sdpa.F32, torch.float16: _sdpa.F16}
        if allow_bool:
            codes[torch.bool] = _sdpa.BOOL
        if t.dtype not in codes:
            raise TypeError("%s: dtype %s is not supported; use float32, float16 or bfloat16%s"
                            % (name, t.dtype, " (or bool for a mask)" if allow_bool else ""))
        return t.numpy(), codes[t.dtype], "torch"
    if not isinstance(x, np.ndarray):
        raise TypeError("%s: a numpy array or a torch tensor expected, not %s"
                        % (name, type(x).__name__))
    if x.dtype == np.float32:
        return x, _sdpa.F32, "numpy"
    if x.dtype == np.float16:
        return x, _sdpa.F16, "numpy"
    if x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:  # ml_dtypes
        return x.view(np.uint16), _sdpa.BF16, "numpy"
    if allow_bool and x.dtype == np.bool_:
        return x, _sdpa.BOOL, "numpy"
    raise TypeError("%s: dtype %s is not supported; use float32, float16 or bfloat16 "
                    "(ml_dtypes)%s" % (name, x.dtype, " (or bool for a mask)" if allow_bool
                                       else ""))


def _merge_leading(a, lead, name):
    """a (rank len(lead) + 3) as rank 4: the leading extents merged into one, as a view."""
    b = 1
    for n in lead:
        b *= n
    v = a.view()
    try:
        v.shape = (b,) + a.shape[len(lead):]
    except AttributeError:
        raise ValueError("%s: its leading dimensions %s cannot be merged into one without a "
                         "copy (strides %s); pass np.ascontiguousarray(x) or x.contiguous()"
                         % (name, tuple(lead), a.strides)) from None
    return v


def _rank4(a, name):
    """(..., L, E) as (B, H, L, E): rank 2 and 3 gain leading extents of 1."""
    if a.ndim < 2:
        raise ValueError("%s: rank %d; expected (..., L, E), rank 2 or more" % (name, a.ndim))
    if a.ndim == 2:
        return a[None, None]
    if a.ndim == 3:
        return a[None]
    if a.ndim == 4:
        return a
    return _merge_leading(a, a.shape[:-3], name)


def _new_like(kind, shape, code):
    """A new array of shape for a result, of the inputs' kind: (the result, a numpy view of
    it the C library writes; bfloat16 as uint16)."""
    if kind == "torch":
        import torch
        dt = {_sdpa.F32: torch.float32, _sdpa.F16: torch.float16, _sdpa.BF16: torch.bfloat16}
        t = torch.empty(shape, dtype=dt[code])
        view = t.view(torch.int16).numpy().view(np.uint16) if code == _sdpa.BF16 else t.numpy()
        return t, view
    if code == _sdpa.BF16:  # a bfloat16 input came through ml_dtypes, so it is there
        import ml_dtypes
        a = np.empty(shape, dtype=ml_dtypes.bfloat16)
        return a, a.view(np.uint16)
    a = np.empty(shape, dtype={_sdpa.F32: np.float32, _sdpa.F16: np.float16}[code])
    return a, a


def _context(context):
    ctx = context if context is not None else _default_context()
    if not isinstance(ctx, _sdpa.Context):
        raise TypeError("context: an sdpa.Context expected, not %s" % type(context).__name__)
    return ctx


def _per_head(x, hq, name):
    """One float32 value per query head (alibi_slopes, sinks), contiguous, from a sequence, a
    numpy array or a torch tensor (detached: no gradient flows into these)."""
    a = np.ascontiguousarray(np.asarray(x.detach().cpu().numpy() if _is_torch(x) else x,
                                        dtype=np.float32))
    if a.shape != (hq,):
        raise ValueError("%s: shape %s, expected (%d,): one per query head" % (name, a.shape, hq))
    return a


def _params(hq, scale, is_causal, alignment, window, softcap, alibi_slopes, sinks, dropout_p=0.0,
            seed=0, offset=0):
    """The parameters as _sdpa takes them (see parse_params in src/_sdpa.c)."""
    if alignment not in _ALIGN:
        raise ValueError("alignment=%r: expected 'top-left' or 'bottom-right'" % (alignment,))
    if scale is not None and float(scale) == 0.0:
        raise ValueError("scale=0: the library reads 0 as 'the default'; every score would "
                         "be 0, pass a tiny nonzero scale for that")
    if window is not None:
        window = (int(window[0]), int(window[1]))
    return (0.0 if scale is None else float(scale), bool(is_causal), _ALIGN[alignment], window,
            0.0 if softcap is None else float(softcap),
            None if alibi_slopes is None else _per_head(alibi_slopes, hq, "alibi_slopes"),
            float(dropout_p), seed, offset,
            None if sinks is None else _per_head(sinks, hq, "sinks"))


def _mask4(attn_mask, q, S):
    """attn_mask, broadcastable to q.shape[:-1] + (S,), as (rank-4 view, dtype code)."""
    m, code, _ = _view(attn_mask, "attn_mask", allow_bool=True)
    if m.ndim > q.ndim:
        raise ValueError("attn_mask has rank %d, more than query's %d" % (m.ndim, q.ndim))
    m = m.reshape((1,) * (q.ndim - m.ndim) + m.shape) if m.ndim < q.ndim else m
    want = q.shape[:-1] + (S,)
    for have, full in zip(m.shape, want):
        if have not in (1, full):
            raise ValueError("attn_mask has shape %s, which does not broadcast to %s"
                             % (tuple(attn_mask.shape), want))
    if m.ndim <= 3:
        return m.reshape((1,) * (4 - m.ndim) + m.shape), code
    lead = m.shape[:-3]
    if all(n == 1 for n in lead) or lead == q.shape[:-3]:
        return _merge_leading(m, lead, "attn_mask"), code
    # some leading extents broadcast, others not: no single stride merges them
    return _merge_leading(np.ascontiguousarray(np.broadcast_to(m, q.shape[:-3] + m.shape[-3:])),
                          q.shape[:-3], "attn_mask"), code


class _Problem:
    """The arguments of one call, checked and viewed as the C library takes them."""

    def __init__(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 window, alignment, softcap, alibi_slopes, dropout_seed, dropout_offset,
                 context, need_value=True, sinks=None):
        self.ctx = _context(context)
        q, self.q_code, self.kind = _view(query, "query")
        k, self.k_code, _ = _view(key, "key")
        self.q_src = q
        if q.ndim != k.ndim:
            raise ValueError("query has rank %d but key rank %d" % (q.ndim, k.ndim))
        if q.ndim >= 4 and q.shape[:-3] != k.shape[:-3]:
            raise ValueError("the leading dimensions of query %s and key %s differ"
                             % (q.shape[:-3], k.shape[:-3]))
        if q.ndim >= 3:
            hq, hkv = q.shape[-3], k.shape[-3]
            if hq != hkv and not enable_gqa:
                raise ValueError("query has %d heads but key %d: pass enable_gqa=True for "
                                 "grouped-query attention (as in PyTorch)" % (hq, hkv))
        self.lead = q.shape[:-2]  # (N..., Hq)
        self.L, self.S = q.shape[-2], k.shape[-2]
        self.q4, self.k4 = _rank4(q, "query"), _rank4(k, "key")
        self.v4, self.v_code, self.Ev = None, None, None
        if need_value:
            v, self.v_code, _ = _view(value, "value")
            if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
                raise ValueError("value has shape %s but key %s: they must agree but in the "
                                 "last dimension" % (v.shape, k.shape))
            self.v4, self.Ev = _rank4(v, "value"), v.shape[-1]
        if is_causal and attn_mask is not None:
            raise ValueError("is_causal and attn_mask exclude each other (as in PyTorch); "
                             "combine them into the mask, or use window=/alignment=")
        self.mask = None
        if attn_mask is not None:
            self.mask = _mask4(attn_mask, q, self.S)
        p = float(dropout_p)
        if p > 0.0:
            if dropout_seed is None:
                dropout_seed, dropout_offset = _next_dropout()
        self.seed = 0 if dropout_seed is None else int(dropout_seed)
        self.offset = 0 if dropout_offset is None else int(dropout_offset)
        self.params = _params(q.shape[-3] if q.ndim >= 3 else 1, scale, is_causal, alignment,
                              window, softcap, alibi_slopes, sinks, p, self.seed, self.offset)

    def mask_arg(self):
        return None if self.mask is None else self.mask

    def lse_shape(self):
        return self.lead + (self.L,)


_dropout_lock = threading.Lock()
_dropout_state = [int.from_bytes(os.urandom(8), "little") >> 1, 0]


def _next_dropout():
    """A fresh (seed, offset) for a call with dropout and no seed: one random seed per
    process, the offset advanced by one per call."""
    with _dropout_lock:
        _dropout_state[1] += 1
        return _dropout_state[0], _dropout_state[1]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, window=None,
                                 alignment="top-left", softcap=None, alibi_slopes=None,
                                 sinks=None, return_lse=False, dropout_seed=None,
                                 dropout_offset=None, context=None):
    """Attention as torch.nn.functional.scaled_dot_product_attention computes it.

    query (..., L, E), key (..., S, E), value (..., S, Ev): numpy arrays or CPU torch tensors
    of float32, float16 or bfloat16, with the same leading dimensions; the third from last is
    the heads, and with enable_gqa=True query may have a multiple of key's heads.
    attn_mask: bool (True = may attend) or additive float, broadcastable to (..., L, S).
    is_causal: query i sees keys j <= i (top-left, PyTorch's; see alignment). scale: None =
    1/sqrt(E). dropout_p: drop weights with this chance (a counter-based mask: pass
    dropout_seed and dropout_offset to reproduce one; else a fresh one is drawn per call).

    Keyword-only extras: window=(left, right) keys i+off-left <= j <= i+off+right (-1 =
    open); alignment="top-left" | "bottom-right" (off = 0 or S - L, for causal, window and
    ALiBi); softcap=C scores become C tanh(s / C); alibi_slopes one per query head;
    sinks one attention-sink logit per query head (see help(sdpa): it joins each row's softmax
    denominator, -inf = none; no gradient); return_lse=True returns (out, lse) with lse
    (..., L) float32 (with sinks, the sink's term included); context=sdpa.Context(...).
    alibi_slopes and sinks: a sequence, numpy array or torch tensor of Hq values.

    Returns out (..., L, Ev) of query's kind and dtype. A fully masked row gives 0 (PyTorch
    gives NaN). Errors: TypeError (dtypes, kinds), ValueError (shapes, parameters, a view the
    library cannot take), MemoryError.
    """
    ctx = context if context is not None else _default_context()
    # The common case (numpy arrays, no mask, no dropout, plain parameters) in C, in one call;
    # NotImplemented for anything else, which the checks below take with their messages.
    if sinks is None:
        r = _fast_forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale,
                          enable_gqa, window, alignment, softcap, alibi_slopes, return_lse,
                          dropout_seed, dropout_offset)
        if r is not NotImplemented:
            return r
    pb = _Problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                  alignment, softcap, alibi_slopes, dropout_seed, dropout_offset, ctx,
                  sinks=sinks)
    out, out_v = _new_like(pb.kind, pb.lead + (pb.L, pb.Ev), pb.q_code)
    lse = lse_v = None
    if return_lse:
        lse, lse_v = _new_like(pb.kind, pb.lse_shape(), _sdpa.F32)
    _sdpa.forward(pb.ctx, (pb.q4, pb.q_code), (pb.k4, pb.k_code), (pb.v4, pb.v_code),
                  (_rank4(out_v, "out"), pb.q_code),
                  None if lse is None else (_rank4(lse_v[..., None], "lse"), _sdpa.F32),
                  None, None, None, None, pb.mask_arg(), pb.params)
    return (out, lse) if return_lse else out


def attention_weights(query, key, attn_mask=None, is_causal=False, scale=None,
                      enable_gqa=False, *, window=None, alignment="top-left", softcap=None,
                      alibi_slopes=None, sinks=None, context=None):
    """The attention probabilities softmax(Q K^T * scale + bias), (..., L, S) float32, with
    the arguments of scaled_dot_product_attention (no value, no dropout: the weights before
    it). Rows sum to 1 (less with sinks: the sink's share, exp(sink_h - lse), is not among
    them); keys a query cannot see are 0; a fully masked row is all 0. This materialises
    L x S values per head: for the output, use scaled_dot_product_attention."""
    pb = _Problem(query, key, None, attn_mask, 0.0, is_causal, scale, enable_gqa, window,
                  alignment, softcap, alibi_slopes, None, None, context, need_value=False,
                  sinks=sinks)
    w, w_v = _new_like(pb.kind, pb.lead + (pb.L, pb.S), _sdpa.F32)
    _sdpa.weights(pb.ctx, (pb.q4, pb.q_code), (pb.k4, pb.k_code), None,
                  (_rank4(w_v, "weights"), _sdpa.F32), None, None, None, None, None,
                  pb.mask_arg(), pb.params)
    return w


def attention_backward(query, key, value, out, lse, dout, attn_mask=None, dropout_p=0.0,
                       is_causal=False, scale=None, enable_gqa=False, *, window=None,
                       alignment="top-left", softcap=None, alibi_slopes=None, sinks=None,
                       dropout_seed=None, dropout_offset=None, context=None):
    """The gradients (dq, dk, dv) of a loss L through scaled_dot_product_attention, given
    dout = dL/dout and that call's out and lse (return_lse=True), with the same arguments
    (with dropout, pass the dropout_seed and dropout_offset the forward used). Each gradient
    has its input's shape, kind and dtype. The mask, ALiBi, the scale and the sinks get no
    gradient (the sinks act through lse, which must be the forward's with the same sinks)."""
    if dropout_p > 0 and dropout_seed is None:
        raise ValueError("attention_backward with dropout needs the forward's dropout_seed and "
                         "dropout_offset, to draw the same mask")
    pb = _Problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                  alignment, softcap, alibi_slopes, dropout_seed, dropout_offset, context,
                  sinks=sinks)
    o, o_code, _ = _view(out, "out")
    lv, l_code, _ = _view(lse, "lse")
    do, do_code, _ = _view(dout, "dout")
    if lv.shape != pb.lse_shape():
        raise ValueError("lse has shape %s, expected %s" % (lv.shape, pb.lse_shape()))
    k_src, v_src = _view(key, "key")[0], _view(value, "value")[0]
    dq, dq_v = _new_like(pb.kind, pb.q_src.shape, pb.q_code)
    dk, dk_v = _new_like(pb.kind, k_src.shape, pb.k_code)
    dv, dv_v = _new_like(pb.kind, v_src.shape, pb.v_code)
    _sdpa.backward(pb.ctx, (pb.q4, pb.q_code), (pb.k4, pb.k_code), (pb.v4, pb.v_code),
                   (_rank4(o, "out"), o_code), (_rank4(lv[..., None], "lse"), l_code),
                   (_rank4(do, "dout"), do_code), (_rank4(dq_v, "dq"), pb.q_code),
                   (_rank4(dk_v, "dk"), pb.k_code), (_rank4(dv_v, "dv"), pb.v_code),
                   pb.mask_arg(), pb.params)
    return dq, dk, dv


def _index(x, name, shape):
    """An int32 index array (seqlens, block table) of the given shape, contiguous, from a
    sequence, a numpy array or a torch tensor of integers."""
    a = np.asarray(x.detach().cpu().numpy() if _is_torch(x) else x)
    if a.dtype.kind not in "iu":
        raise TypeError("%s: integers expected, not %s" % (name, a.dtype))
    if a.shape != shape:
        raise ValueError("%s: shape %s, expected %s" % (name, a.shape, shape))
    if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
        bad = np.argwhere((a < -2**31) | (a > 2**31 - 1))[0]
        raise ValueError("%s%s=%d does not fit in int32" % (
            name, "".join("[%d]" % n for n in bad), a[tuple(bad)]))
    return np.ascontiguousarray(a, dtype=np.int32)


def forward_kv(query, k_cache, v_cache, *, seqlens_k=None, seqlens_q=None, block_table=None,
               attn_mask=None, is_causal=False, alignment="bottom-right", scale=None,
               window=None, softcap=None, alibi_slopes=None, sinks=None, return_lse=False,
               context=None):
    """Attention of a batch of sequences' newest tokens to their KV caches (sdpa_forward_kv):
    generation with a ragged or a paged cache, no copy of the cache.

    query (B, Hq, Lq, E): each sequence's new tokens, the first seqlens_q[b] rows of its
    block. The cache, one of two layouts:
      plain  (block_table None): k_cache (B, Hkv, Lk, E) and v_cache (B, Hkv, Lk, Ev);
             sequence b's keys are rows [0, seqlens_k[b]), the rest is never read.
      paged  block_table (B, max_pages) of page indices: k_cache (n_pages, Hkv, page_size, E)
             and v_cache (n_pages, Hkv, page_size, Ev) are pools of pages, and key j of
             sequence b is row j % page_size of page block_table[b, j // page_size] (vLLM's and
             FlashAttention's block table). Entries past a sequence's last page are never read
             (-1 is usual there).
    seqlens_k: (B,) key counts in [0, capacity] (capacity Lk, or max_pages * page_size);
    None = every sequence full. seqlens_q: (B,) query counts in [0, Lq]; None = Lq each.
    Index arrays: sequences, numpy arrays or torch tensors of integers (taken as int32).
    Query and caches: numpy arrays or CPU torch tensors, float32, float16 or bfloat16, each
    its own dtype and strides; Hq a multiple of Hkv (grouped-query attention, no flag needed).

    The queries are the sequences' newest tokens: with alignment="bottom-right" (the default
    here) query i of sequence b sits at position i + seqlens_k[b] - seqlens_q[b], so
    is_causal=True lets it see its own key and the ones before it; "top-left" puts it at i.
    is_causal, window, ALiBi and attn_mask use each sequence's own positions; attn_mask is
    bool (True = may attend) or additive, broadcastable to (B, Hq, Lq, capacity). scale,
    softcap, alibi_slopes, sinks as in scaled_dot_product_attention; no dropout (inference).

    Returns out (B, Hq, Lq, Ev) of query's kind and dtype, and with return_lse=True also lse
    (B, Hq, Lq) float32. A sequence with no key gives fully masked rows (0, lse -inf, or the
    sink). Rows past seqlens_q[b] are not read from query: their out is 0 and their lse -inf
    (or the sink), so every element is defined. No gradient (an inference call).
    Errors: ValueError with the library's message for a length outside its range or a block
    table entry, among those the lengths make read, outside [0, n_pages); TypeError (dtypes,
    kinds); ValueError (shapes, parameters); MemoryError.
    """
    ctx = _context(context)
    q, q_code, kind = _view(query, "query")
    k, k_code, _ = _view(k_cache, "k_cache")
    v, v_code, _ = _view(v_cache, "v_cache")
    for a, name, what in ((q, "query", "(B, Hq, Lq, E)"), (k, "k_cache", "(B, Hkv, Lk, E) or "
                          "(n_pages, Hkv, page_size, E)"), (v, "v_cache", "like k_cache")):
        if a.ndim != 4:
            raise ValueError("%s: rank %d; forward_kv takes %s" % (name, a.ndim, what))
    B, Hq, Lq = q.shape[:3]
    max_pages = 0
    if block_table is not None:
        bt = np.asarray(block_table.detach().cpu().numpy() if _is_torch(block_table)
                        else block_table)
        if bt.ndim != 2 or bt.shape[0] != B or bt.shape[1] < 1:
            raise ValueError("block_table: shape %s, expected (B=%d, max_pages >= 1)"
                             % (bt.shape, B))
        max_pages = bt.shape[1]
        block_table = _index(bt, "block_table", (B, max_pages))
    capacity = max_pages * k.shape[2] if block_table is not None else k.shape[2]
    if seqlens_k is not None:
        seqlens_k = _index(seqlens_k, "seqlens_k", (B,))
    if seqlens_q is not None:
        seqlens_q = _index(seqlens_q, "seqlens_q", (B,))
    mask = None if attn_mask is None else _mask4(attn_mask, q, capacity)
    params = _params(Hq, scale, is_causal, alignment, window, softcap, alibi_slopes, sinks)
    out, out_v = _new_like(kind, (B, Hq, Lq, v.shape[3]), q_code)
    lse = lse_v = None
    if return_lse:
        lse, lse_v = _new_like(kind, (B, Hq, Lq), _sdpa.F32)
    _sdpa.forward_kv(ctx, (q, q_code), (k, k_code), (v, v_code), (out_v, q_code),
                     None if lse is None else (lse_v[..., None], _sdpa.F32), seqlens_k,
                     seqlens_q, block_table, max_pages, mask, params)
    return (out, lse) if return_lse else out


def merge(outs, lses, *, context=None):
    """Combines attention computed over disjoint sets of keys into attention over their union.

    outs: a sequence of n >= 1 outputs (..., L, Ev), each a numpy array or CPU torch tensor of
    float32, float16 or bfloat16; lses: their log-sum-exps (..., L) float32, as
    scaled_dot_product_attention(..., return_lse=True) returns them. If part p is attention
    over the keys K_p, the result is attention over all of them, exactly (up to rounding):
    the building block of split-KV decode, chunked prefill and ring attention. Compute the
    parts with the keys' global positions (a mask sliced to the part's keys: causal, window
    and ALiBi refer to positions in the whole sequence). An empty or fully masked part is
    out = 0, lse = -inf and contributes nothing; a row where every part is -inf gives 0 and
    -inf; a NaN or +inf lse makes its row NaN. Sums are in float64, in part order, rounded
    once: the same bits for any thread count.

    Returns (out, lse): out (..., L, Ev) of outs[0]'s kind and dtype, lse (..., L) float32.
    No gradient flows through it. Errors: TypeError (dtypes, kinds), ValueError (shapes,
    counts), MemoryError.
    """
    ctx = context if context is not None else _default_context()
    outs, lses = list(outs), list(lses)
    if not outs or len(outs) != len(lses):
        raise ValueError("merge: %d outputs and %d lses; give one of each per part, at least "
                         "one part" % (len(outs), len(lses)))
    o_args, l_args, kind, code, shape = [], [], None, None, None
    for p, (o, lv) in enumerate(zip(outs, lses)):
        ov, o_code, o_kind = _view(o, "outs[%d]" % p)
        lvv, l_code, _ = _view(lv, "lses[%d]" % p)
        if p == 0:
            kind, code, shape = o_kind, o_code, ov.shape
        elif ov.shape != shape:
            raise ValueError("outs[%d] has shape %s but outs[0] %s" % (p, ov.shape, shape))
        if lvv.shape != shape[:-1]:
            raise ValueError("lses[%d] has shape %s, expected %s (outs' without the last "
                             "dimension)" % (p, lvv.shape, shape[:-1]))
        o_args.append((_rank4(ov, "outs[%d]" % p), o_code))
        l_args.append((_rank4(lvv[..., None], "lses[%d]" % p), l_code))
    out, out_v = _new_like(kind, shape, code)
    lse, lse_v = _new_like(kind, shape[:-1], _sdpa.F32)
    _sdpa.merge(ctx, o_args, l_args, (_rank4(out_v, "out"), code),
                (_rank4(lse_v[..., None], "lse"), _sdpa.F32))
    return out, lse


def info(context=None):
    """A dict: the library's version, and the context's (default: this thread's) kernel,
    instruction-set level, threads and the full dispatch description."""
    ctx = context if context is not None else _default_context()
    return {"version": __version__, "kernel": ctx.kernel, "isa": ctx.isa,
            "n_threads": ctx.n_threads, "description": ctx.description}
