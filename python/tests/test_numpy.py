"""sdpa on numpy arrays, against the float64 numpy reference of reference.py: every feature,
ranks, strides, dtypes, the backward, dropout, bad inputs, threads, determinism, leaks."""

import gc
import sys
import threading

import numpy as np
import pytest

import sdpa
from reference import close, grads_reference, reference

RNG = np.random.default_rng(2026)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, align="bottom-right"),
    dict(window=(3, 1)),
    dict(window=(2, -1), align="bottom-right"),
    dict(softcap=2.0),
    dict(scale=0.3),
    dict(slopes=[0.5, 0.25, 0.125, 0.0625]),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(sorted(kw)) or "plain")
def test_features(kw):
    q, k, v = randn(2, 4, 7, 8), randn(2, 4, 9, 8), randn(2, 4, 9, 5)
    want, want_lse, want_w = reference(q, k, v, **kw)
    extra = dict(is_causal=kw.get("causal", False), scale=kw.get("scale"),
                 window=kw.get("window"), alignment=kw.get("align", "top-left"),
                 softcap=kw.get("softcap"), alibi_slopes=kw.get("slopes"))
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, return_lse=True, **extra)
    assert out.shape == (2, 4, 7, 5) and out.dtype == np.float32
    close(out, want, 1e-5)
    close(np.where(np.isfinite(want_lse), lse, 0), np.where(np.isfinite(want_lse), want_lse, 0),
          1e-5)
    w = sdpa.attention_weights(q, k, **extra)
    close(w, want_w, 1e-6)


@pytest.mark.parametrize("mshape", [(9,), (7, 9), (4, 1, 9), (2, 1, 1, 9), (2, 4, 7, 9)])
def test_masks_broadcast(mshape):
    q, k, v = randn(2, 4, 7, 8), randn(2, 4, 9, 8), randn(2, 4, 9, 8)
    keep = RNG.random(mshape) > 0.3
    add = np.where(keep, RNG.standard_normal(mshape), -np.inf).astype(np.float32)
    for m in (keep, add):
        out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m)
        close(out, reference(q, k, v, mask=m)[0], 1e-5)


def test_fully_masked_rows_are_zero():
    q, k, v = randn(1, 2, 4, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8)
    m = np.ones((4, 5), bool)
    m[2] = False
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m, return_lse=True)
    assert np.all(out[..., 2, :] == 0) and np.all(lse[..., 2] == -np.inf)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_ranks(rank):
    lead = (2, 3, 2, 3)[: rank - 2]
    q, k, v = randn(*lead, 6, 4), randn(*lead, 5, 4), randn(*lead, 5, 4)
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == lead + (6, 4)
    close(out, reference(q, k, v, causal=True)[0], 1e-5)


def test_gqa():
    q, k, v = randn(2, 8, 5, 16), randn(2, 2, 6, 16), randn(2, 2, 6, 16)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa.scaled_dot_product_attention(q, k, v)
    out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    close(out, reference(q, k, v, gqa=True)[0], 1e-5)


def test_strided_views_without_copy():
    # (B, L, H, E) memory seen as (B, H, L, E), every other key, a reversed query order
    base_q, base_k = randn(2, 9, 4, 8), randn(2, 12, 4, 8)
    q = base_q.transpose(0, 2, 1, 3)[:, :, ::-1]
    k = base_k.transpose(0, 2, 1, 3)[:, :, ::2]
    v = randn(2, 4, 6, 8)[..., ::1]
    out = sdpa.scaled_dot_product_attention(q, k, v)
    close(out, reference(q, k, v)[0], 1e-5)


def test_float16_and_bfloat16():
    q, k, v = randn(1, 2, 8, 16), randn(1, 2, 8, 16), randn(1, 2, 8, 16)
    out = sdpa.scaled_dot_product_attention(q.astype(np.float16), k.astype(np.float16),
                                            v.astype(np.float16))
    assert out.dtype == np.float16
    want = reference(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))[0]
    close(out, want, 2e-3)
    ml = pytest.importorskip("ml_dtypes")
    qb, kb, vb = (x.astype(ml.bfloat16) for x in (q, k, v))
    out = sdpa.scaled_dot_product_attention(qb, kb, vb)
    assert out.dtype == ml.bfloat16
    close(out.astype(np.float32), reference(qb.astype(np.float32), kb.astype(np.float32),
                                            vb.astype(np.float32))[0], 1e-2)


def test_backward():
    q, k, v, do = randn(2, 3, 6, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 4), randn(2, 3, 6, 4)
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    dq, dk, dv = sdpa.attention_backward(q, k, v, out, lse, do, is_causal=True)
    for got, want in zip((dq, dk, dv), grads_reference(q, k, v, do, causal=True)):
        assert got.shape == want.shape and got.dtype == np.float32
        close(got, want, 1e-5)


def test_dropout_reproducible():
    q, k, v = randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8)
    kw = dict(dropout_p=0.5, dropout_seed=11, dropout_offset=2)
    a = sdpa.scaled_dot_product_attention(q, k, v, **kw)
    b = sdpa.scaled_dot_product_attention(q, k, v, **kw)
    c = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_seed=11,
                                          dropout_offset=3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    fresh = [sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5) for _ in range(2)]
    assert not np.array_equal(fresh[0], fresh[1])  # a new mask per call without a seed
    with pytest.raises(ValueError, match="dropout_seed"):
        sdpa.attention_backward(q, k, v, a, np.zeros((1, 2, 6), np.float32), a, dropout_p=0.5)


@pytest.mark.parametrize("args,exc,match", [
    (dict(q=np.zeros((1, 1, 2, 4))), TypeError, "float64"),
    (dict(q=[[1.0]]), TypeError, "numpy array or a torch tensor"),
    (dict(k=np.zeros((1, 1, 3, 5), np.float32)), ValueError, "k.shape"),
    (dict(mask=np.ones((3, 3), bool)), ValueError, "does not broadcast"),
    (dict(causal_and_mask=True), ValueError, "exclude each other"),
    (dict(scale=float("nan")), ValueError, "params.scale"),
    (dict(align="middle"), ValueError, "alignment"),
    (dict(q=np.zeros(4, np.float32)), ValueError, "rank 1"),
])
def test_bad_inputs(args, exc, match):
    q = args.get("q", np.zeros((1, 1, 2, 4), np.float32))
    k = args.get("k", np.zeros((1, 1, 3, 4), np.float32))
    v = np.zeros((1, 1, 3, 4), np.float32)
    mask = args.get("mask")
    if args.get("causal_and_mask"):
        mask = np.ones((2, 3), bool)
    with pytest.raises(exc, match=match):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          is_causal=bool(args.get("causal_and_mask")),
                                          scale=args.get("scale"),
                                          alignment=args.get("align", "top-left"))


def test_unmergeable_leading_dims():
    q = randn(3, 4, 2, 5, 8).transpose(1, 0, 2, 3, 4)  # (4, 3, ...) whose axes cannot merge
    k = randn(4, 3, 2, 5, 8)
    with pytest.raises(ValueError, match="cannot be merged"):
        sdpa.scaled_dot_product_attention(q, k, k)


FAST_CASES = [
    dict(shape=(2, 3, 5, 8)),
    dict(shape=(5, 8)),
    dict(shape=(3, 5, 8), is_causal=True, return_lse=True),
    dict(shape=(2, 3, 4, 5, 8), return_lse=True, alignment="bottom-right", is_causal=True),
    dict(shape=(1, 1, 3, 5, 8), window=(2, 0), softcap=3.0, scale=0.25),
    dict(shape=(2, 1, 3, 5, 8), dropout_p=0, window=(-1, 1)),
    dict(shape=(2, 3, 5, 8), dtype=np.float16, return_lse=True),
    dict(shape=(2, 4, 5, 8), kv_heads=2, enable_gqa=True),
    dict(shape=(2, 3, 5, 8), strided=True, return_lse=True),
]


@pytest.mark.parametrize("kw", FAST_CASES, ids=lambda kw: "-".join(map(str, kw["shape"])))
def test_fast_path_matches_python_path(kw, monkeypatch):
    # sdpa's common case runs in C (_sdpa.fast_forward); the same call through the Python
    # path must give the same bits, and the fast path must have taken it
    kw = dict(kw)
    shape, dtype = kw.pop("shape"), kw.pop("dtype", np.float32)
    kvh, strided = kw.pop("kv_heads", None), kw.pop("strided", False)
    kshape = shape[:-3] + (kvh,) + shape[-2:] if kvh else shape
    if strided:  # (B, L, H, E) memory seen as (B, H, L, E), keys reversed
        q = randn(shape[0], shape[2], shape[1], shape[3], dtype=dtype).transpose(0, 2, 1, 3)
        k = randn(kshape[0], kshape[2] + 2, kshape[1], kshape[3],
                  dtype=dtype).transpose(0, 2, 1, 3)[:, :, ::-1][:, :, :kshape[2]]
    else:
        q, k = randn(*shape, dtype=dtype), randn(*kshape, dtype=dtype)
    v = randn(*kshape[:-1], 6, dtype=dtype)
    ctx = sdpa.Context(n_threads=2)
    fast = sdpa._sdpa.fast_forward(ctx, q, k, v, None, kw.get("dropout_p", 0.0),
                                   kw.get("is_causal", False), kw.get("scale"),
                                   kw.get("enable_gqa", False), kw.get("window"),
                                   kw.get("alignment", "top-left"), kw.get("softcap"), None,
                                   kw.get("return_lse", False), None, None)
    assert fast is not NotImplemented
    got = sdpa.scaled_dot_product_attention(q, k, v, context=ctx, **kw)
    monkeypatch.setattr(sdpa, "_fast_forward", lambda *a: NotImplemented)
    want = sdpa.scaled_dot_product_attention(q, k, v, context=ctx, **kw)
    for g, f, w in zip(*((x if isinstance(x, tuple) else (x,)) for x in (got, fast, want))):
        assert g.shape == w.shape and g.dtype == w.dtype and g.flags.c_contiguous
        assert np.array_equal(g, w) and np.array_equal(f, w)


@pytest.mark.parametrize("change", [
    dict(attn_mask=np.ones((5, 5), bool)), dict(dropout_p=0.1), dict(is_causal=1),
    dict(scale=np.float64(0.5)), dict(scale=0.0), dict(window=[1, 1]), dict(alignment="x"),
    dict(alibi_slopes=[0.5, 0.5, 0.5]), dict(return_lse=1), dict(dropout_seed=1),
    dict(q=np.zeros((2, 3, 5, 8))), dict(q=np.zeros((2, 3, 0, 8), np.float32)),
    dict(q=np.zeros((4, 3, 2, 5, 8), np.float32).transpose(1, 0, 2, 3, 4)),
    dict(q=np.zeros((2, 3, 5, 8), ">f4")), dict(k=np.zeros((2, 1, 5, 8), np.float32)),
    dict(context="not a context"), dict(q=np.zeros((5,), np.float32)),
])
def test_fast_path_leaves_the_rest_to_python(change):
    q = change.get("q", np.zeros((2, 3, 5, 8), np.float32))
    k = change.get("k", np.zeros((2, 3, 5, 8), np.float32))
    kw = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              window=None, alignment="top-left", softcap=None, alibi_slopes=None,
              return_lse=False, dropout_seed=None, dropout_offset=None)
    kw.update((n, x) for n, x in change.items() if n in kw)
    ctx = change.get("context", sdpa.Context(n_threads=1))
    assert sdpa._sdpa.fast_forward(ctx, q, k, k, *kw.values()) is NotImplemented


def test_contexts_and_determinism():
    q, k, v = randn(1, 8, 200, 32), randn(1, 8, 300, 32), randn(1, 8, 300, 32)
    outs = [sdpa.scaled_dot_product_attention(q, k, v, context=sdpa.Context(n_threads=n))
            for n in (1, 2, 3)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    generic = sdpa.Context(n_threads=1, max_isa="generic")
    assert generic.isa == "generic" and generic.last_kernel == ""
    close(sdpa.scaled_dot_product_attention(q, k, v, context=generic), reference(q, k, v)[0],
          1e-5)
    assert generic.last_kernel == "flash-generic"
    best = sdpa.Context(n_threads=1)
    sdpa.scaled_dot_product_attention(q, k, v, context=best)  # f32: never the AMX table
    amx = best.kernel.startswith("flash-amx")  # (or its emulation)
    assert best.last_kernel == ("flash-avx512" if amx else best.kernel)
    with pytest.raises(ValueError, match="max_isa"):
        sdpa.Context(max_isa="sse")
    info = sdpa.info()
    assert info["version"] == sdpa.__version__ and info["n_threads"] >= 1


def test_threads_share_and_not():
    q, k, v = randn(1, 4, 64, 16), randn(1, 4, 64, 16), randn(1, 4, 64, 16)
    want = sdpa.scaled_dot_product_attention(q, k, v)
    shared = sdpa.Context(n_threads=1)
    errors, results = [], []

    def work(ctx):
        for _ in range(20):
            try:
                results.append(sdpa.scaled_dot_product_attention(q, k, v, context=ctx))
            except RuntimeError as e:  # a shared context busy in another thread
                errors.append(str(e))

    threads = [threading.Thread(target=work, args=(c,)) for c in (None, None, shared, shared)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(r, want) for r in results)
    assert all("SDPA_ERR_BUSY" in e for e in errors)
    assert len(results) + len(errors) == 80 and len(results) >= 40


def test_no_leaks():
    q, k, v = randn(1, 2, 8, 8), randn(1, 2, 8, 8), randn(1, 2, 8, 8)
    refs = [sys.getrefcount(x) for x in (q, k, v)]
    for _ in range(300):
        out, lse = sdpa.scaled_dot_product_attention(q, k, v, return_lse=True)
        sdpa.attention_backward(q, k, v, out, lse, out)
        try:
            sdpa.scaled_dot_product_attention(q, k[..., :4], v)
        except ValueError:
            pass
    gc.collect()
    assert [sys.getrefcount(x) for x in (q, k, v)] == refs
    assert sys.getrefcount(out) == 2
