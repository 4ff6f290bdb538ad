#!/usr/bin/env python3
"""make_golden.py — writes tests/golden/golden.bin, the PyTorch golden fixtures of sdpa.

Every case holds its parameters, its inputs exactly as stored (f32, or the raw 16-bit patterns
of f16/bf16), its mask, and three results: out64 and lse64, computed by PyTorch in float64
from the exactly widened inputs (the golden), and out_lp, PyTorch's own result in the storage
dtype (the same-precision baseline of testing.md). For the backward it holds a dout and the
gradients of sum(dout * out) by PyTorch autograd: dq64, dk64, dv64 in float64 (the golden) and
dq_lp, dk_lp, dv_lp in the storage dtype (the baseline). The format is described in README.md next
to this file; tests/test_golden.c reads it. The output is deterministic: fixed seeds, numpy's
PCG64 for the inputs.

Run without options, the script creates a virtual environment at tests/golden/.venv,
pip-installs torch and numpy into it and runs itself there. `--python PATH` (or the
environment variable SDPA_GOLDEN_PYTHON) runs it with an interpreter that already has them.
"""

import argparse
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "golden.bin")

MAGIC = b"SDPAGOLD"
VERSION = 2  # 2: the backward arrays (dout, dq64, dk64, dv64, dq_lp, dk_lp, dv_lp)
END_MARK = b"END."
FLAG_BACKWARD = 1  # the case's flags: bit 0, the backward arrays follow out_lp

# sdpa_dtype codes of include/sdpa.h.
F32, F16, BF16, BOOL = 0, 1, 2, 3
NO_MASK = -1

# The fixed part of a case record: name, 7 extents, 4 dtypes, scale, causal, align,
# use_window, window_left, window_right, softcap, alibi, mask dtype, mask shape, empty rows,
# flags (FLAG_BACKWARD). Little-endian, no padding.
CASE_HEADER = struct.Struct("<64s7q4if3i2qfii4qii")


# ---- bootstrap: find or make an interpreter with torch and numpy ----------------------------


def venv_python(venv):
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")


def ensure_venv():
    """Creates tests/golden/.venv with torch and numpy (once) and returns its python."""
    venv = os.path.join(HERE, ".venv")
    py = venv_python(venv)
    if not os.path.exists(py):
        print(f"make_golden: creating {venv}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    probe = subprocess.call([py, "-c", "import torch, numpy"], stderr=subprocess.DEVNULL)
    if probe != 0:
        print("make_golden: pip install torch numpy (this downloads a few GB)", flush=True)
        subprocess.check_call([py, "-m", "pip", "install", "--upgrade", "pip"])
        subprocess.check_call([py, "-m", "pip", "install", "torch>=2.5", "numpy"])
    return py


# ---- the cases -----------------------------------------------------------------------------


def case(name, dtype="f32", B=1, Hq=2, Hkv=None, Lq=7, Lk=None, Dk=8, Dv=None, **kw):
    c = dict(name=name, dtype=dtype, B=B, Hq=Hq, Hkv=Hkv or Hq, Lq=Lq, Lk=Lk or Lq, Dk=Dk,
             Dv=Dv or Dk, scale=0.0, causal=0, align="tl", window=None, softcap=0.0,
             alibi=False, mask=None, qmul=1.0, kmul=1.0)
    for key in kw:
        if key not in c:
            raise KeyError(f"{name}: unknown option {key}")
    c.update(kw)
    return c


def mask(kind, shape, dtype="f32", empty_row=False):
    """kind 'bool' (True = may attend) or 'add' (additive, some -inf entries). shape uses
    'B', 'H', 'Lq', 'Lk' or 1 per dimension. empty_row: one row hides every key."""
    return dict(kind=kind, shape=shape, dtype=dtype, empty_row=empty_row)


FULL = ("B", "H", "Lq", "Lk")


def cases():
    cs = []
    for dt in ("f32", "f16", "bf16"):
        p = dt + "_"
        cs += [
            case(p + "plain", dt, B=2, Hq=3, Lq=7, Dk=16),
            case(p + "peaky", dt, B=1, Hq=2, Lq=9, Dk=16, qmul=5.0, kmul=3.0),
            case(p + "causal_tl_lt", dt, Lq=5, Lk=11, causal=1),
            case(p + "causal_br_lt", dt, Lq=5, Lk=11, causal=1, align="br"),
            case(p + "gqa_mask_add", dt, B=2, Hq=6, Hkv=2, Lq=6, Lk=9, Dk=8, Dv=12,
                 mask=mask("add", ("B", 1, "Lq", "Lk"), dt)),
            case(p + "alibi_window_br", dt, Hq=4, Lq=6, Lk=12, alibi=True, align="br",
                 window=(4, 1)),
            case(p + "softcap_causal", dt, Hq=2, Lq=8, causal=1, softcap=5.0, qmul=3.0,
                 kmul=2.0),
        ]
    cs += [
        # scale, lengths and head dimensions
        case("f32_scale", Hq=2, Lq=9, Dk=8, scale=0.3),
        case("f32_scale_negative", Hq=2, Lq=6, Lk=8, Dk=8, scale=-0.25),
        case("f32_lq_lt_lk", Hq=2, Lq=3, Lk=13, Dk=8),
        case("f32_lq_gt_lk", Hq=2, Lq=13, Lk=3, Dk=8),
        case("f32_lq1_decode", B=2, Hq=4, Hkv=2, Lq=1, Lk=17, Dk=16),
        case("f32_dk12_dv5", Hq=2, Lq=7, Lk=9, Dk=12, Dv=5),
        case("f32_dk5_dv20", Hq=1, Lq=6, Lk=5, Dk=5, Dv=20),
        case("f32_d1", Hq=2, Lq=5, Lk=6, Dk=1, Dv=1),
        # causal, both alignments, Lq <, =, > Lk (top-left is PyTorch's is_causal)
        case("f32_causal_tl_eq", Hq=2, Lq=9, causal=1),
        case("f32_causal_tl_gt", Hq=2, Lq=11, Lk=5, causal=1),
        case("f32_causal_br_eq", Hq=2, Lq=9, causal=1, align="br"),
        case("f32_causal_br_gt_empty_rows", Hq=2, Lq=11, Lk=5, causal=1, align="br"),
        # grouped and multi-query attention
        case("f32_gqa", B=2, Hq=6, Hkv=2, Lq=5, Lk=7, Dk=8),
        case("f32_mqa_causal", Hq=4, Hkv=1, Lq=7, causal=1, align="br"),
        # bool masks (True = may attend) at several broadcast shapes
        case("f32_mask_bool_full", B=2, Hq=2, Lq=5, Lk=7, mask=mask("bool", FULL)),
        case("f32_mask_bool_11LqLk", B=2, Hq=2, Lq=6, Lk=8, mask=mask("bool", (1, 1, "Lq", "Lk"))),
        case("f32_mask_bool_B11Lk_padding", B=3, Hq=2, Lq=4, Lk=9,
             mask=mask("bool", ("B", 1, 1, "Lk"))),
        case("f32_mask_bool_1HLq1_empty_row", B=2, Hq=3, Lq=5, Lk=6,
             mask=mask("bool", (1, "H", "Lq", 1), empty_row=True)),
        case("f32_mask_bool_causal_tl", Hq=2, Lq=7, Lk=7, causal=1,
             mask=mask("bool", (1, 1, "Lq", "Lk"))),
        # additive masks (-inf entries hide keys) at several broadcast shapes and dtypes
        case("f32_mask_add_full", B=2, Hq=2, Lq=5, Lk=7, mask=mask("add", FULL)),
        case("f32_mask_add_11LqLk", B=2, Hq=2, Lq=6, Lk=8, mask=mask("add", (1, 1, "Lq", "Lk"))),
        case("f32_mask_add_B11Lk", B=2, Hq=3, Lq=4, Lk=9, mask=mask("add", ("B", 1, 1, "Lk"))),
        case("f32_mask_add_1HLq1", B=2, Hq=3, Lq=5, Lk=6, mask=mask("add", (1, "H", "Lq", 1))),
        case("f32_mask_add_empty_row_neginf", B=1, Hq=2, Lq=6, Lk=7,
             mask=mask("add", (1, 1, "Lq", "Lk"), empty_row=True)),
        case("f32_mask_add_f16", B=1, Hq=2, Lq=5, Lk=8, mask=mask("add", FULL, "f16")),
        case("f32_mask_add_bf16", B=1, Hq=2, Lq=5, Lk=8, mask=mask("add", (1, "H", 1, "Lk"), "bf16")),
        # sliding windows
        case("f32_window_tl", Hq=2, Lq=10, window=(3, 1)),
        case("f32_window_left_only_lt", Hq=2, Lq=6, Lk=12, window=(2, -1)),
        case("f32_window_causal_br", Hq=2, Lq=7, Lk=10, causal=1, align="br", window=(3, 5)),
        case("f32_window_zero", Hq=1, Lq=6, window=(0, 0)),
        case("f32_window_gt_l", Hq=1, Lq=5, Lk=6, window=(20, 30)),
        # ALiBi (slopes 2^(-8(h+1)/Hq))
        case("f32_alibi_tl", Hq=4, Lq=8, alibi=True),
        case("f32_alibi_h6_causal_br", Hq=6, Hkv=3, Lq=5, Lk=9, alibi=True, causal=1,
             align="br"),
        # softcap: c * tanh(scale q.k / c), then ALiBi and the mask, in that order
        case("f32_softcap", Hq=2, Lq=7, Lk=9, softcap=2.0, qmul=3.0, kmul=2.0),
        case("f32_softcap_alibi_mask", B=2, Hq=4, Hkv=2, Lq=6, Lk=8, softcap=3.0, alibi=True,
             mask=mask("add", ("B", 1, "Lq", "Lk")), qmul=2.0, kmul=2.0),
        # half precision with bool masks
        case("f16_mask_bool_window", "f16", B=2, Hq=2, Lq=7, Lk=9, window=(2, 2),
             mask=mask("bool", ("B", 1, 1, "Lk"))),
        case("bf16_mqa_mask_bool", Hq=4, Hkv=1, Lq=6, Lk=10, dtype="bf16",
             mask=mask("bool", (1, 1, "Lq", "Lk"))),
        case("f16_causal_br_gt_empty_rows", "f16", Hq=2, Lq=9, Lk=4, causal=1, align="br"),
    ]
    return cs


# ---- computing one case --------------------------------------------------------------------


def generate(out_path):
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)  # thread count must not change any bit of the results
    tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    code = {"f32": F32, "f16": F16, "bf16": BF16}

    def to_bytes(t, dt):
        """The little-endian bytes of tensor t as stored in dtype dt."""
        t = t.contiguous()
        if dt == "bf16":
            return t.view(torch.int16).numpy().astype("<i2").tobytes()
        if dt == "f16":
            return t.numpy().astype("<f2").tobytes()
        if dt == "f32":
            return t.numpy().astype("<f4").tobytes()
        if dt == "f64":
            return t.numpy().astype("<f8").tobytes()
        if dt == "bool":
            return t.numpy().astype(np.uint8).tobytes()
        raise ValueError(dt)

    def visibility(c, Lq, Lk):
        """(Lq, Lk) bool: the window rule of sdpa.h, causal folded into window_right."""
        off = Lk - Lq if c["align"] == "br" else 0
        wl, wr = c["window"] if c["window"] is not None else (-1, -1)
        if c["causal"]:
            wr = 0
        i = torch.arange(Lq).view(Lq, 1)
        j = torch.arange(Lk).view(1, Lk)
        rel = j - (i + off)
        vis = torch.ones(Lq, Lk, dtype=torch.bool)
        if wl >= 0:
            vis &= rel >= -wl
        if wr >= 0:
            vis &= rel <= wr
        return vis, rel

    def math_attention(q, k, v, scale, softcap, bias, vis):
        """Attention written out in the dtype of q: the golden in float64, and the baseline of
        the softcap cases (PyTorch's SDPA has no softcap). bias and vis broadcast to
        (B, Hq, Lq, Lk). Returns out and the log-sum-exp over visible keys."""
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        s = (q @ k.transpose(-1, -2)) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s + bias.to(s.dtype)
        s = s.masked_fill(~vis, float("-inf"))
        lse = torch.logsumexp(s.double(), dim=-1)
        return torch.softmax(s, dim=-1) @ v, lse

    records = []
    for n, c in enumerate(cases()):
        rng = np.random.default_rng(1000 + n)
        B, Hq, Hkv, Lq, Lk, Dk, Dv = (c[x] for x in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv"))
        dt = c["dtype"]

        def randn(*shape, mul=1.0):
            x = torch.from_numpy(rng.standard_normal(shape)) * mul
            return x.to(tdt[dt])  # the stored values; the golden widens them exactly

        q = randn(B, Hq, Lq, Dk, mul=c["qmul"])
        k = randn(B, Hkv, Lk, Dk, mul=c["kmul"])
        v = randn(B, Hkv, Lk, Dv)
        q64, k64, v64 = q.double(), k.double(), v.double()  # exact widening

        # scale: stored as the f32 the C side passes; 0 means 1/sqrt(Dk)
        scale32 = float(np.float32(c["scale"]))
        scale64 = scale32 if scale32 != 0.0 else 1.0 / np.sqrt(Dk)

        vis_rule, rel = visibility(c, Lq, Lk)
        vis = vis_rule.view(1, 1, Lq, Lk).expand(B, Hq, Lq, Lk).clone()
        bias = torch.zeros(1, 1, Lq, Lk, dtype=torch.float64)

        slopes32 = None
        if c["alibi"]:
            slopes32 = torch.tensor([2.0 ** (-8.0 * (h + 1) / Hq) for h in range(Hq)],
                                    dtype=torch.float32)
            bias = -slopes32.double().view(1, Hq, 1, 1) * rel.abs().double().view(1, 1, Lq, Lk)

        m = c["mask"]
        mask_dt, mask_shape, mask_stored = NO_MASK, (0, 0, 0, 0), None
        if m is not None:
            full = {"B": B, "H": Hq, "Lq": Lq, "Lk": Lk}
            mask_shape = tuple(full[d] if isinstance(d, str) else d for d in m["shape"])
            if m["kind"] == "bool":
                mask_stored = torch.from_numpy(rng.random(mask_shape) < 0.7)
                if mask_shape[3] > 1:
                    mask_stored[..., 0] = True  # key 0 keeps rows alive (unless windowed)
                else:
                    mask_stored[...] = True  # a (.., 1) mask hides whole rows: keep them all
                if m["empty_row"]:
                    mask_stored[(0,) * (len(mask_shape) - 2) + (1,)] = False
                mask_dt = BOOL
                vis &= mask_stored
            else:
                x = torch.from_numpy(rng.standard_normal(mask_shape) * 2.0)
                hide = torch.from_numpy(rng.random(mask_shape) < 0.2)
                if mask_shape[3] > 1:  # a (.., 1) mask would hide whole rows: no -inf there
                    hide[..., 0] = False  # key 0 keeps rows alive (unless windowed)
                    x = x.masked_fill(hide, float("-inf"))
                if m["empty_row"]:
                    x[(0,) * (len(mask_shape) - 2) + (1,)] = float("-inf")
                mask_stored = x.to(tdt[m["dtype"]])
                mask_dt = code[m["dtype"]]
                bias = bias + mask_stored.double()
                vis &= bias != float("-inf")

        # ---- PyTorch: the golden (float64) and the same-precision baseline (storage dtype)
        gqa = Hq != Hkv
        empty = ~vis.any(dim=-1)  # (B, Hq, Lq): fully masked rows
        simple = c["window"] is None and not c["alibi"] and m is None
        has_bias = c["alibi"] or (m is not None and m["kind"] == "add")
        sc = scale32 if scale32 != 0.0 else None
        scale_lp = scale32 or 1.0 / np.sqrt(Dk)

        def sdpa(qq, kk, vv, mdtype, bias_, vis_):
            """PyTorch's SDPA with the case's causal/window/ALiBi/mask expressed through what it
            has (see README.md); bias_ and vis_ broadcast to (B, Hq, Lq, Lk)."""
            if simple and c["causal"] and c["align"] == "tl":
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=sc,
                                                      enable_gqa=gqa)
            if simple and not c["causal"]:
                return F.scaled_dot_product_attention(qq, kk, vv, scale=sc, enable_gqa=gqa)
            am = bias_.masked_fill(~vis_, float("-inf")).to(mdtype) if has_bias else vis_
            return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=am, scale=sc,
                                                  enable_gqa=gqa)

        out_m64, lse64 = math_attention(q64, k64, v64, scale64, c["softcap"], bias, vis)
        if c["softcap"] > 0:
            out64 = out_m64
            out_lp, _ = math_attention(q, k, v, scale_lp, c["softcap"], bias.to(tdt[dt]), vis)
        else:
            out64 = sdpa(q64, k64, v64, torch.float64, bias, vis)
            out_lp = sdpa(q, k, v, tdt[dt], bias, vis)
            live = ~empty
            diff = (out64 - out_m64)[live].abs().max().item()
            assert diff < 1e-12, f"{c['name']}: torch SDPA and math disagree by {diff}"

        # fully masked rows: PyTorch may give NaN, the contract says O = 0 and LSE = -inf
        n_empty = int(empty.sum())
        assert (n_empty > 0) == ("empty" in c["name"]), f"{c['name']}: {n_empty} empty rows"
        out64 = out64.masked_fill(empty.unsqueeze(-1), 0.0)
        out_lp = out_lp.masked_fill(empty.unsqueeze(-1), 0.0)
        lse64 = lse64.masked_fill(empty, float("-inf"))
        assert torch.isfinite(out64).all() and torch.isfinite(out_lp).all(), c["name"]
        assert (torch.isfinite(lse64) | empty).all(), c["name"]

        # ---- the backward: dL/dq, dL/dk, dL/dv of L = sum(dout * out) by autograd
        # dout is drawn last, so the inputs above are those of the forward-only fixtures.
        dout = randn(B, Hq, Lq, Dv)
        # Fully masked rows: the contract says dq = 0 there and nothing to dk, dv, whatever
        # dout holds. PyTorch's softmax of an all -inf row is NaN (written-out math) or 0 (its
        # SDPA), and NaN would reach every gradient through the chain rule. So such rows are
        # given every key back, with no bias, and a zero dout: with finite weights and dO = 0
        # their dS = P (dP - Delta) is exactly 0, so they add exactly 0 to dk and dv and their
        # dq is exactly 0; the other rows are untouched. The stored dout keeps its random
        # values there (sdpa must ignore them).
        vis_b = vis | empty.unsqueeze(-1)
        bias_b = bias.expand(B, Hq, Lq, Lk).masked_fill(empty.unsqueeze(-1), 0.0)
        dout_b = dout.masked_fill(empty.unsqueeze(-1), 0.0)

        def grads(qq, kk, vv, dO, how):
            """(dq, dk, dv) by torch.autograd.grad in the dtype of qq: how = 'sdpa' or 'math'.
            With GQA, autograd sums dk and dv over each group's query heads."""
            qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (qq, kk, vv))
            if how == "sdpa":
                o = sdpa(qq, kk, vv, qq.dtype, bias_b, vis_b)
            else:
                s_ = scale64 if qq.dtype == torch.float64 else scale_lp
                o, _ = math_attention(qq, kk, vv, s_, c["softcap"], bias_b.to(qq.dtype), vis_b)
            return torch.autograd.grad(o, (qq, kk, vv), dO.to(qq.dtype))

        g_m64 = grads(q64, k64, v64, dout_b.double(), "math")
        if c["softcap"] > 0:  # PyTorch's SDPA has no softcap: differentiate the written-out math
            g64 = g_m64
            g_lp = grads(q, k, v, dout_b, "math")
        else:
            g64 = grads(q64, k64, v64, dout_b.double(), "sdpa")
            g_lp = grads(q, k, v, dout_b, "sdpa")
            for a, b_ in zip(g64, g_m64):
                diff = (a - b_).abs().max().item()
                tol = 1e-12 * max(1.0, a.abs().max().item())
                assert diff <= tol, f"{c['name']}: SDPA and math gradients disagree by {diff}"
        dq64, dk64, dv64 = g64
        dq_lp, dk_lp, dv_lp = g_lp
        for g in (*g64, *g_lp):
            assert torch.isfinite(g).all(), f"{c['name']}: non-finite gradient"
        assert (dq64[empty] == 0).all() and (dq_lp[empty] == 0).all(), c["name"]

        align = 1 if c["align"] == "br" else 0
        wl, wr = c["window"] if c["window"] is not None else (0, 0)
        name = c["name"].encode()
        assert len(name) < 64
        rec = [CASE_HEADER.pack(name, B, Hq, Hkv, Lq, Lk, Dk, Dv, code[dt], code[dt], code[dt],
                                code[dt], scale32, c["causal"], align,
                                int(c["window"] is not None), wl, wr, c["softcap"],
                                int(c["alibi"]), mask_dt, *mask_shape, n_empty, FLAG_BACKWARD)]
        rec += [to_bytes(q, dt), to_bytes(k, dt), to_bytes(v, dt)]
        if slopes32 is not None:
            rec.append(to_bytes(slopes32, "f32"))
        if mask_stored is not None:
            rec.append(to_bytes(mask_stored, "bool" if mask_dt == BOOL else m["dtype"]))
        rec += [to_bytes(out64, "f64"), to_bytes(lse64, "f64"), to_bytes(out_lp.to(tdt[dt]), dt)]
        rec += [to_bytes(dout, dt), to_bytes(dq64, "f64"), to_bytes(dk64, "f64"),
                to_bytes(dv64, "f64"), to_bytes(dq_lp, dt), to_bytes(dk_lp, dt),
                to_bytes(dv_lp, dt)]
        rec.append(END_MARK)
        blob = b"".join(rec)
        records.append(blob)
        err_lp = (out_lp.double() - out64).abs().max().item()
        err_g = "/".join(f"{(b_.double() - a).abs().max().item():.1e}"
                         for a, b_ in zip(g64, g_lp))
        print(f"  {c['name']:<34} {dt:<4} B={B} Hq={Hq} Hkv={Hkv} Lq={Lq} Lk={Lk} Dk={Dk} "
              f"Dv={Dv} empty_rows={n_empty} err(lp)={err_lp:.1e} dq/dk/dv {err_g} "
              f"{len(blob)} bytes")

    data = MAGIC + struct.pack("<II", VERSION, len(records)) + b"".join(records)
    with open(out_path, "wb") as f:
        f.write(data)
    print(f"make_golden: wrote {out_path}: {len(records)} cases, {len(data)} bytes "
          f"(torch {torch.__version__}, numpy {np.__version__})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", help="an interpreter with torch 2.x and numpy "
                    "(default: $SDPA_GOLDEN_PYTHON, else tests/golden/.venv, created on demand)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output file (default: %(default)s)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        generate(args.out)
        return 0
    py = args.python or os.environ.get("SDPA_GOLDEN_PYTHON") or ensure_venv()
    return subprocess.call([py, os.path.abspath(__file__), "--inner", "--out",
                            os.path.abspath(args.out)])


if __name__ == "__main__":
    sys.exit(main())
