"""Attention sinks (sinks=, one logit per query head) through scaled_dot_product_attention,
attention_weights and attention_backward, against the float64 reference of reference.py: the
sink joins each row's softmax denominator (lse includes exp(sink), the weights sum to less
than 1), a -inf sink is no sink, a fully masked row gives 0 with lse = sink."""

import numpy as np
import pytest

import sdpa
from reference import close, close_lse, grads_reference, reference

RNG = np.random.default_rng(77)
SINKS = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CASES = [
    dict(),
    dict(causal=True, align="bottom-right"),
    dict(window=(2, 1)),
    dict(softcap=2.0, slopes=[0.5, 0.25, 0.125, 0.0625]),
    dict(scale=0.7),
    dict(mask="bool"),
    dict(gqa=True),
]


def _extra(kw):
    return dict(is_causal=kw.get("causal", False), scale=kw.get("scale"),
                window=kw.get("window"), alignment=kw.get("align", "top-left"),
                softcap=kw.get("softcap"), alibi_slopes=kw.get("slopes"),
                enable_gqa=kw.get("gqa", False))


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(sorted(kw)) or "plain")
def test_forward_and_weights(kw):
    kw = dict(kw)
    hk = 2 if kw.get("gqa") else 4
    q, k, v = randn(2, 4, 7, 8), randn(2, hk, 9, 8), randn(2, hk, 9, 5)
    if kw.get("mask") == "bool":
        kw["mask"] = RNG.random((2, 1, 7, 9)) > 0.4
    want, want_lse, want_w = reference(q, k, v, sinks=SINKS, **kw)
    extra = _extra(kw)
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=kw.get("mask"),
                                                 sinks=SINKS, return_lse=True, **extra)
    close(out, want, 1e-5)
    close_lse(lse, want_lse, 1e-5)
    w = sdpa.attention_weights(q, k, attn_mask=kw.get("mask"), sinks=SINKS, **extra)
    close(w, want_w, 1e-6)
    sums = w.sum(axis=-1)
    seen = w.max(axis=-1) > 0
    assert np.all(sums[:, :3][seen[:, :3]] < 1 - 1e-6)  # finite sinks take a share
    assert np.allclose(sums[:, 3][seen[:, 3]], 1, atol=1e-5)  # -inf: no sink


def test_fully_masked_rows_give_zero_and_the_sink():
    q, k, v = randn(1, 4, 5, 8), randn(1, 4, 6, 8), randn(1, 4, 6, 8)
    m = np.ones((5, 6), bool)
    m[1] = False
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m, sinks=SINKS,
                                                 return_lse=True)
    assert np.all(out[..., 1, :] == 0) and np.all(np.isfinite(out))
    assert np.array_equal(lse[0, :, 1], SINKS)  # the last head's sink is -inf: lse -inf
    w = sdpa.attention_weights(q, k, attn_mask=m, sinks=SINKS)
    assert np.all(w[..., 1, :] == 0)


def test_minus_inf_sinks_are_no_sinks():
    q, k, v = randn(2, 4, 6, 8), randn(2, 4, 6, 8), randn(2, 4, 6, 8)
    none = np.full(4, -np.inf, np.float32)
    a = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    b = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=none, return_lse=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("kw", [dict(), dict(window=(-1, 0), align="bottom-right"),
                                dict(window=(1, 1))],
                         ids=["plain", "causal-bottom-right", "window"])
def test_backward(kw):
    q, k, v, do = randn(2, 4, 6, 8), randn(2, 4, 7, 8), randn(2, 4, 7, 4), randn(2, 4, 6, 4)
    m = np.ones((6, 7), bool)
    m[2] = False  # a fully masked row: no gradient from it, even with a finite sink
    extra = _extra(kw)
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m, sinks=SINKS,
                                                 return_lse=True, **extra)
    grads = sdpa.attention_backward(q, k, v, out, lse, do, attn_mask=m, sinks=SINKS, **extra)
    for got, want in zip(grads, grads_reference(q, k, v, do, mask=m, sinks=SINKS, **kw)):
        close(got, want, 1e-5)
    assert np.all(grads[0][..., 2, :] == 0)


@pytest.mark.parametrize("form", ["list", "float64", "float16-inputs"])
def test_sink_forms_and_dtypes(form):
    q, k, v = randn(1, 4, 5, 16), randn(1, 4, 5, 16), randn(1, 4, 5, 16)
    sinks = SINKS.tolist() if form == "list" else SINKS.astype(np.float64)
    tol = 1e-5
    if form == "float16-inputs":
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
        tol = 2e-3
    out = sdpa.scaled_dot_product_attention(q, k, v, sinks=sinks)
    assert out.dtype == q.dtype
    close(out, reference(q, k, v, sinks=SINKS)[0], tol)


@pytest.mark.parametrize("sinks,match", [
    ([0.0, 1.0], "one per query head"),
    ([0.0, np.nan, 0.0, 0.0], "params.sinks"),
    ([0.0, 0.0, np.inf, 0.0], "params.sinks"),
])
def test_bad_sinks(sinks, match):
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match=match):
        sdpa.scaled_dot_product_attention(q, q, q, sinks=sinks)
    with pytest.raises(ValueError, match=match):
        sdpa.attention_weights(q, q, sinks=sinks)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    q, k, v = randn(1, 4, 5, 8), randn(1, 4, 6, 8), randn(1, 4, 6, 8)
    out = sdpa.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k),
                                            torch.from_numpy(v),
                                            sinks=torch.tensor(SINKS, requires_grad=True))
    assert isinstance(out, torch.Tensor)
    close(out.numpy(), reference(q, k, v, sinks=SINKS)[0], 1e-5)
