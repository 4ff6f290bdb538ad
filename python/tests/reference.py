"""The float64 numpy reference the tests compare sdpa with, written out from sdpa.h's
Semantics: the forward (with every feature and attention sinks), its gradients, and the
comparison with a tolerance relative to the result's size."""

import numpy as np


def reference(q, k, v, mask=None, causal=False, scale=None, window=None, align="top-left",
              softcap=None, slopes=None, gqa=False, sinks=None):
    """The forward in float64; returns (out, lse, weights). Fully masked rows: out 0, lse -inf
    (or the sink). sinks (Hq values): each row's softmax denominator gains exp(sink_h), as a
    key of score sink_h and value 0 would add it, so the weights sum to less than 1."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if gqa and q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = 1 / np.sqrt(E) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * sc
    if softcap:
        s = softcap * np.tanh(s / softcap)
    off = S - L if align == "bottom-right" else 0
    i = np.arange(L)[:, None] + off
    j = np.arange(S)[None, :]
    if slopes is not None:
        sl = np.asarray(slopes, np.float64).reshape((-1, 1, 1))
        s = s - sl * np.abs(i - j)
    vis = np.ones((L, S), bool)
    if causal:
        vis &= j <= i
    if window is not None:
        lft, rgt = window
        if lft >= 0:
            vis &= j >= i - lft
        if rgt >= 0:
            vis &= j <= i + rgt
    s = np.where(vis, s, -np.inf)
    if mask is not None:
        m = np.asarray(mask)
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    if sinks is not None:  # the sink as one more key, always visible, whose value is 0
        sk = np.asarray(sinks, np.float64).reshape((-1, 1, 1))
        s = np.concatenate([s, np.broadcast_to(sk, s.shape[:-1] + (1,))], axis=-1)
    mx = s.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(mx)
    e = np.where(empty, 0.0, np.exp(s - np.where(empty, 0.0, mx)))
    tot = e.sum(axis=-1, keepdims=True)
    w = np.where(empty, 0.0, e / np.where(empty, 1.0, tot))[..., :S]
    lse = np.where(empty[..., 0], -np.inf, (mx + np.log(np.where(empty, 1.0, tot)))[..., 0])
    return w @ v, lse, w


def close(got, want, tol):
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= tol * scale, "max error %.3g > %.3g" % (err, tol * scale)


def close_lse(got, want, tol):
    """lse values, where -inf must match -inf exactly and the finite ones within tol."""
    got = np.asarray(got, dtype=np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    close(np.where(fin, got, 0.0), np.where(fin, want, 0.0), tol)


def grads_reference(q, k, v, dout, **kw):
    """dq, dk, dv of the float64 reference (no GQA, no softcap, default scale), by the
    backward's formulas; with sinks too (out = sum_j p_ij v_j still holds)."""
    out, _, w = reference(q, k, v, **kw)
    dout = dout.astype(np.float64)
    dv = np.swapaxes(w, -1, -2) @ dout
    dp = dout @ np.swapaxes(v.astype(np.float64), -1, -2)
    ds = w * (dp - (dout * out).sum(axis=-1, keepdims=True))
    sc = 1 / np.sqrt(q.shape[-1])
    return ds @ k.astype(np.float64) * sc, np.swapaxes(ds, -1, -2) @ q.astype(np.float64) * sc, dv
