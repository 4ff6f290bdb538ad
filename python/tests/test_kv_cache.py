"""sdpa.forward_kv on plain (ragged) and paged caches, against scaled_dot_product_attention on
each sequence's own keys, materialised as a contiguous cache: mixed lengths, GQA, page sizes
16 and 64, every feature with the per-sequence bottom-right alignment, f32/f16/bf16 caches,
torch tensors, the rows past a sequence's queries, bad lengths and block tables, leaks."""

import gc
import sys

import numpy as np
import pytest

import sdpa

RNG = np.random.default_rng(5)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def paged(k, v, lens, page_size, spare=3):
    """The plain caches k, v (B, Hkv, Lk, D) cut into pages of a shuffled pool, with `spare`
    pages nobody uses, NaN in every unread row, and -1 past each sequence's last page: (k_pool,
    v_pool, block_table)."""
    B, H, Lk, _ = k.shape
    max_pages = -(-Lk // page_size)
    used = [-(-n // page_size) for n in lens]
    n_pages = sum(used) + spare
    order = RNG.permutation(n_pages)
    kp = np.full((n_pages, H, page_size, k.shape[3]), np.nan, k.dtype)
    vp = np.full((n_pages, H, page_size, v.shape[3]), np.nan, v.dtype)
    table = np.full((B, max_pages), -1, np.int32)
    nxt = 0
    for b in range(B):
        for e in range(used[b]):
            page = order[nxt]
            nxt += 1
            table[b, e] = page
            rows = min(page_size, lens[b] - e * page_size)
            kp[page, :, :rows] = k[b, :, e * page_size:e * page_size + rows]
            vp[page, :, :rows] = v[b, :, e * page_size:e * page_size + rows]
    return kp, vp, table


def expected(q, k, v, lens_k, lens_q, **kw):
    """(out, lse) of forward_kv, sequence by sequence through scaled_dot_product_attention on
    k[b, :, :lens_k[b]]: rows past lens_q[b] are 0 with lse -inf (or the sink), and so are the
    rows of a sequence with no key."""
    B, Hq, Lq, _ = q.shape
    sinks = kw.get("sinks")
    idle = np.full(Hq, -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    out = np.zeros((B, Hq, Lq, v.shape[3]))
    lse = np.broadcast_to(idle[None, :, None], (B, Hq, Lq)).copy()
    mask = kw.pop("attn_mask", None)
    for b in range(B):
        lk, lq = lens_k[b], lens_q[b]
        if lk == 0 or lq == 0:
            continue
        m = None if mask is None else mask[b:b + 1, :, :lq, :lk]
        o, lv = sdpa.scaled_dot_product_attention(q[b:b + 1, :, :lq], k[b:b + 1, :, :lk],
                                                  v[b:b + 1, :, :lk], attn_mask=m,
                                                  enable_gqa=True, return_lse=True, **kw)
        out[b, :, :lq] = o[0].astype(np.float64)
        lse[b, :, :lq] = lv[0]
    return out, lse


def check(got, want, tol):
    (o, lv), (wo, wl) = got, want
    o = np.asarray(o, np.float64)
    assert np.all(np.isfinite(o)), "a NaN of an unread row or page came through"
    assert np.abs(o - wo).max() <= tol * max(1.0, np.abs(wo).max())
    assert np.array_equal(np.isneginf(lv), np.isneginf(wl))
    fin = np.isfinite(wl)
    assert np.abs(np.where(fin, lv, 0) - np.where(fin, wl, 0)).max() <= tol * 10


LENS_K = [37, 1, 0, 64, 20]
LENS_Q = [3, 1, 2, 0, 4]
FEATURES = [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, alignment="top-left"),
    dict(window=(8, 0)),
    dict(softcap=5.0, alibi_slopes=[0.5, 0.25, 0.125, 0.0625, 0.03, 0.02, 0.01, 0.005]),
    dict(sinks=[0.5, -1.0, 2.0, -np.inf, 0.0, 1.0, -0.5, 3.0], is_causal=True, scale=0.3),
    dict(attn_mask="bool"),
]


@pytest.mark.parametrize("layout", ["plain", "paged16", "paged64"])
@pytest.mark.parametrize("kw", FEATURES, ids=lambda kw: ",".join(sorted(kw)) or "plain")
def test_matches_sequence_by_sequence(layout, kw):
    kw = dict(kw)
    B, Hq, Hkv, Lq, Lk = 5, 8, 2, 4, 64
    q, k, v = randn(B, Hq, Lq, 16), randn(B, Hkv, Lk, 16), randn(B, Hkv, Lk, 8)
    for b, (nk, nq) in enumerate(zip(LENS_K, LENS_Q)):  # rows past the lengths are not read
        k[b, :, nk:] = v[b, :, nk:] = np.nan
        q[b, :, nq:] = np.nan
    kw.setdefault("alignment", "bottom-right")
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = RNG.random((B, 1, Lq, Lk)) > 0.3
    want = expected(q, k, v, LENS_K, LENS_Q, **dict(kw))
    if layout == "plain":
        got = sdpa.forward_kv(q, k, v, seqlens_k=LENS_K, seqlens_q=LENS_Q, return_lse=True,
                              **kw)
    else:
        kp, vp, table = paged(k, v, LENS_K, int(layout[5:]))  # capacity Lk: the mask fits
        got = sdpa.forward_kv(q, kp, vp, seqlens_k=np.array(LENS_K), seqlens_q=LENS_Q,
                              block_table=table, return_lse=True, **kw)
    assert got[0].shape == (B, Hq, Lq, 8) and got[0].dtype == np.float32
    assert got[1].shape == (B, Hq, Lq) and got[1].dtype == np.float32
    check(got, want, 1e-5)


def test_full_caches_are_ordinary_attention():
    q, k, v = randn(2, 4, 3, 16), randn(2, 4, 40, 16), randn(2, 4, 40, 16)
    got = sdpa.forward_kv(q, k, v, is_causal=True, return_lse=True)
    want = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, alignment="bottom-right",
                                             return_lse=True)
    check(got, [np.asarray(x, np.float64) for x in want], 1e-6)
    kp, vp, table = paged(k, v, [40, 40], 16, spare=0)
    out = sdpa.forward_kv(q, kp, vp, block_table=table, seqlens_k=[40, 40], is_causal=True)
    assert np.abs(out - want[0]).max() <= 1e-6


def test_decode_one_token():
    q, k, v = randn(3, 8, 1, 64), randn(3, 1, 128, 64), randn(3, 1, 128, 64)  # MQA
    lens = [128, 5, 77]
    kp, vp, table = paged(k, v, lens, 16)
    got = sdpa.forward_kv(q, kp, vp, seqlens_k=lens, block_table=table, return_lse=True)
    check(got, expected(q, k, v, lens, [1, 1, 1]), 1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_caches(dtype):
    if dtype == "bfloat16":
        dt = pytest.importorskip("ml_dtypes").bfloat16
    else:
        dt = np.float16
    q = randn(2, 4, 2, 32)
    k, v = randn(2, 2, 48, 32).astype(dt), randn(2, 2, 48, 32).astype(dt)
    lens = [48, 30]
    kp, vp, table = paged(k.astype(np.float32), v.astype(np.float32), lens, 16)
    kp, vp = kp.astype(dt), vp.astype(dt)
    want = expected(q, k, v, lens, [2, 2], is_causal=True, alignment="bottom-right")
    for kc, vc, bt in ((k, v, None), (kp, vp, table)):
        got = sdpa.forward_kv(q, kc, vc, seqlens_k=lens, block_table=bt, is_causal=True,
                              return_lse=True)
        assert got[0].dtype == np.float32
        check(got, want, 1e-5)
    out = sdpa.forward_kv(q.astype(dt), k, v, seqlens_k=lens)  # the query's dtype is out's
    assert out.dtype == dt


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    q, k, v = randn(2, 4, 3, 16), randn(2, 2, 32, 16), randn(2, 2, 32, 16)
    lens = [32, 9]
    kp, vp, table = paged(k, v, lens, 16)
    want = expected(q, k, v, lens, [3, 3], is_causal=True, alignment="bottom-right")
    t = torch.from_numpy
    got = sdpa.forward_kv(t(q), t(kp).to(torch.bfloat16), t(vp).to(torch.bfloat16),
                          seqlens_k=torch.tensor(lens), block_table=t(table).long(),
                          is_causal=True, return_lse=True)
    assert isinstance(got[0], torch.Tensor) and got[0].dtype == torch.float32
    check([x.numpy() for x in got], want, 2e-2)  # the caches rounded to bfloat16


def test_block_table_entries_past_the_length_are_not_read():
    q, k, v = randn(2, 2, 1, 8), randn(2, 2, 64, 8), randn(2, 2, 64, 8)
    kp, vp, table = paged(k, v, [20, 64], 16)
    table[0, 2:] = 10**6  # sequence 0 uses pages 0 and 1 only
    got = sdpa.forward_kv(q, kp, vp, seqlens_k=[20, 64], block_table=table, return_lse=True)
    check(got, expected(q, k, v, [20, 64], [1, 1]), 1e-5)


@pytest.mark.parametrize("change,exc,match", [
    (dict(page=(1, 0, 99)), ValueError, r"block_table\[1\]\[0\]=99 is outside"),
    (dict(page=(0, 1, -1)), ValueError, r"block_table\[0\]\[1\]=-1"),
    (dict(seqlens_k=[-1, 20]), ValueError, r"seqlens_k\[0\]=-1"),
    (dict(seqlens_k=[20, 65]), ValueError, r"seqlens_k\[1\]=65 is outside"),
    (dict(seqlens_q=[1, 3]), ValueError, r"seqlens_q\[1\]=3"),
    (dict(seqlens_k=[20]), ValueError, r"seqlens_k: shape \(1,\), expected \(2,\)"),
    (dict(seqlens_k=[20.0, 3.0]), TypeError, "integers"),
    (dict(seqlens_k=[2**32, 3]), ValueError, "int32"),
    (dict(table_shape=(2, 4, 1)), ValueError, "block_table: shape"),
    (dict(heads=3), ValueError, "SDPA_ERR_HEADS"),
    (dict(mask=np.ones((2, 1, 2, 63), bool)), ValueError, "does not broadcast"),
    (dict(rank3=True), ValueError, "rank 3"),
])
def test_bad_arguments(change, exc, match):
    q = randn(2, change.get("heads", 4), 2, 8)
    k, v = randn(2, 2, 64, 8), randn(2, 2, 64, 8)
    kp, vp, table = paged(k, v, [20, 64], 16)
    if "page" in change:
        b, e, val = change["page"]
        table[b, e] = val
    if "table_shape" in change:
        table = np.zeros(change["table_shape"], np.int32)
    if change.get("rank3"):
        q = q[0]
    with pytest.raises(exc, match=match):
        sdpa.forward_kv(q, kp, vp, block_table=table,
                        seqlens_k=change.get("seqlens_k", [20, 64]),
                        seqlens_q=change.get("seqlens_q", [1, 2]), attn_mask=change.get("mask"))


def test_plain_cache_errors_and_outputs_untouched():
    q, k = randn(2, 2, 1, 8), randn(2, 2, 16, 8)
    with pytest.raises(ValueError, match=r"seqlens_k\[1\]=17 is outside \[0, 16\]"):
        sdpa.forward_kv(q, k, k, seqlens_k=[3, 17])
    with pytest.raises(TypeError, match="dropout_p"):  # no such argument: an inference call
        sdpa.forward_kv(q, k, k, dropout_p=0.1)


def test_no_leaks():
    q, k = randn(2, 2, 1, 8), randn(2, 2, 32, 8)
    kp, vp, table = paged(k, k, [32, 5], 16)
    lens, sinks = np.array([32, 5], np.int32), np.zeros(2, np.float32)
    objs = (q, kp, vp, table, lens, sinks)
    refs = [sys.getrefcount(x) for x in objs]
    for _ in range(200):
        sdpa.forward_kv(q, kp, vp, seqlens_k=lens, block_table=table, sinks=sinks,
                        return_lse=True)
        try:
            sdpa.forward_kv(q, kp, vp, seqlens_k=[33, 5], block_table=table, sinks=sinks)
        except ValueError:
            pass
    gc.collect()
    assert [sys.getrefcount(x) for x in objs] == refs


def test_extension_checks_array_lengths():
    # the library reads B lengths, B x max_pages entries and Hq sinks without knowing the
    # arrays' sizes: the extension checks them, also when called directly
    q, k = randn(2, 2, 1, 8), randn(2, 2, 16, 8)
    out = np.empty((2, 2, 1, 8), np.float32)
    F32, params = sdpa._sdpa.F32, sdpa._params(2, None, False, "bottom-right", None, None,
                                               None, None)
    args = (sdpa.Context(n_threads=1), (q, F32), (k, F32), (k, F32), (out, F32), None)
    with pytest.raises(ValueError, match="seqlens_k: 1 values, expected 2"):
        sdpa._sdpa.forward_kv(*args, np.array([3], np.int32), None, None, 0, None, params)
    with pytest.raises(TypeError, match="int32"):
        sdpa._sdpa.forward_kv(*args, np.array([3, 4]), None, None, 0, None, params)
    with pytest.raises(ValueError, match="block_table: 2 values, expected 4"):
        sdpa._sdpa.forward_kv(*args, None, None, np.zeros(2, np.int32), 2, None, params)
    short = params[:-1] + (np.zeros(1, np.float32),)
    with pytest.raises(ValueError, match="sinks: 1 values for 2 query heads"):
        sdpa._sdpa.forward_kv(*args, None, None, None, 0, None, short)
