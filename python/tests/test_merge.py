"""sdpa.merge: attention over slices of the keys, merged, against attention over all of them
(numpy always, torch tensors when torch is installed); the row rules, dtypes, determinism and
bad inputs."""

import sys

import numpy as np
import pytest

import sdpa

RNG = np.random.default_rng(13)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def band_mask(L, S, H):
    """A bool mask (H, L, S) stated with the keys' global positions: even heads a
    bottom-right causal band of 6 keys, odd heads 70 % of the keys; row 2 sees nothing."""
    i = np.arange(L)[:, None] + (S - L)
    j = np.arange(S)[None, :]
    m = np.empty((H, L, S), bool)
    m[0::2] = (j <= i) & (j >= i - 5)
    m[1::2] = RNG.random((H // 2, L, S)) < 0.7
    m[:, 2] = False
    return m


def parts_of(q, k, v, mask, cuts, **kw):
    """(outs, lses) of attention over keys [cuts[p], cuts[p + 1]); an empty part is given
    directly as out = 0, lse = -inf."""
    outs, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        if a == b:
            outs.append(np.zeros(q.shape[:-1] + (v.shape[-1],), v.dtype))
            lses.append(np.full(q.shape[:-1], -np.inf, np.float32))
            continue
        o, lv = sdpa.scaled_dot_product_attention(q, k[..., a:b, :], v[..., a:b, :],
                                                  attn_mask=mask[..., a:b], return_lse=True,
                                                  **kw)
        outs.append(o)
        lses.append(lv)
    return outs, lses


CUTS = [(0, 23), (0, 17, 23), (0, 4, 4, 23), (0, 1, 6, 6, 12, 13, 20, 23)]


@pytest.mark.parametrize("cuts", CUTS, ids=lambda c: "%d-parts" % (len(c) - 1))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_merge_matches_one_shot(cuts, dtype):
    q, k, v = randn(2, 4, 7, 8, dtype=dtype), randn(2, 4, 23, 8, dtype=dtype), \
        randn(2, 4, 23, 6, dtype=dtype)
    mask = band_mask(7, 23, 4)
    want, want_lse = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                       return_lse=True)
    out, lse = sdpa.merge(*parts_of(q, k, v, mask, cuts))
    assert out.shape == want.shape and out.dtype == dtype
    assert lse.shape == want_lse.shape and lse.dtype == np.float32
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), atol=tol,
                               rtol=tol)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5, rtol=1e-5)
    assert np.all(out[..., 2, :] == 0) and np.all(lse[..., 2] == -np.inf)


def test_row_rules():
    o = [np.array([[1.0, 2.0]], np.float32), np.array([[5.0, np.nan]], np.float32),
         np.array([[np.nan, np.nan]], np.float32)]
    lv = [np.array([0.0], np.float32), np.array([np.log(3.0)], np.float32),
          np.array([-np.inf], np.float32)]
    out, lse = sdpa.merge(o, lv)
    np.testing.assert_allclose(out[0, 0], 4.0, rtol=1e-6)  # (1 + 3 * 5) / 4
    assert np.isnan(out[0, 1])  # a NaN of a part that counts
    np.testing.assert_allclose(lse, [np.log(4.0)], rtol=1e-6)
    # every part -inf: 0 and -inf, whatever the outputs hold; a NaN lse: the row NaN
    out, lse = sdpa.merge([o[2], o[2]], [lv[2], lv[2]])
    assert np.all(out == 0) and lse[0] == -np.inf
    out, lse = sdpa.merge([o[0], o[0]], [lv[0], np.array([np.nan], np.float32)])
    assert np.all(np.isnan(out)) and np.isnan(lse[0])


def test_bfloat16_and_strides():
    ml = pytest.importorskip("ml_dtypes")
    base = [randn(2, 9, 3, 8) for _ in range(3)]
    outs = [b.transpose(0, 2, 1, 3).astype(ml.bfloat16) for b in base]  # contiguous copies
    outs[1] = base[1].astype(ml.bfloat16).transpose(0, 2, 1, 3)  # a (B, L, H, D) view
    lses = [randn(2, 3, 9) for _ in range(3)]
    out, lse = sdpa.merge(outs, lses)
    assert out.dtype == ml.bfloat16 and out.shape == (2, 3, 9, 8)
    m = np.maximum.reduce(lses)
    w = [np.exp(x - m)[..., None] for x in lses]
    want = sum(wi * o.astype(np.float64) for wi, o in zip(w, outs)) / sum(w)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(lse, m + np.log(sum(np.exp(x - m) for x in lses)), rtol=1e-6)


def test_deterministic_over_threads():
    outs = [randn(2, 4, 300, 32) for _ in range(5)]
    lses = [randn(2, 4, 300) for _ in range(5)]
    got = [sdpa.merge(outs, lses, context=sdpa.Context(n_threads=n)) for n in (1, 2, 3, 7)]
    assert all(np.array_equal(g[0], got[0][0]) and np.array_equal(g[1], got[0][1])
               for g in got[1:])


@pytest.mark.parametrize("case,exc,match", [
    ("none", ValueError, "0 outputs and 0 lses"),
    ("count", ValueError, "2 outputs and 1 lses"),
    ("shape", ValueError, r"outs\[1\] has shape"),
    ("lse_shape", ValueError, r"lses\[0\] has shape"),
    ("lse_dtype", TypeError, r"lses\[1\].dtype=f16"),
    ("float64", TypeError, "float64"),
])
def test_bad_inputs(case, exc, match):
    o = [np.zeros((1, 2, 3, 4), np.float32) for _ in range(2)]
    lv = [np.zeros((1, 2, 3), np.float32) for _ in range(2)]
    if case == "none":
        o, lv = [], []
    elif case == "count":
        lv = lv[:1]
    elif case == "shape":
        o[1] = np.zeros((1, 2, 3, 5), np.float32)
    elif case == "lse_shape":
        lv[0] = np.zeros((1, 2, 4), np.float32)
    elif case == "lse_dtype":
        lv[1] = lv[1].astype(np.float16)
    elif case == "float64":
        o[0] = o[0].astype(np.float64)
    with pytest.raises(exc, match=match):
        sdpa.merge(o, lv)


def test_no_leaks():
    o = [randn(1, 2, 4, 8) for _ in range(3)]
    lv = [randn(1, 2, 4) for _ in range(3)]
    refs = [sys.getrefcount(x) for x in o + lv]
    for _ in range(200):
        sdpa.merge(o, lv)
        with pytest.raises(TypeError):
            sdpa.merge(o, [lv[0], lv[1], lv[2].astype(np.float16)])
    assert [sys.getrefcount(x) for x in o + lv] == refs


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k, v = torch.randn(1, 2, 11, 8, generator=g), torch.randn(1, 2, 11, 8, generator=g)
    want, want_lse = sdpa.scaled_dot_product_attention(q, k, v, return_lse=True)
    outs, lses = [], []
    for a, b in ((0, 4), (4, 11)):
        o, lv = sdpa.scaled_dot_product_attention(q, k[..., a:b, :], v[..., a:b, :],
                                                  return_lse=True)
        outs.append(o.to(torch.bfloat16))
        lses.append(lv)
    out, lse = sdpa.merge(outs, lses)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
