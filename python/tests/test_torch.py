"""sdpa on torch tensors: against torch.nn.functional.scaled_dot_product_attention (in float64
for the values and the gradients), the custom operator's autograd, gradcheck, torch.compile
without graph breaks. Skipped when torch is not installed (.ci/run installs it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402


def rand(*shape, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(hash(shape) % 2**31)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)


def f64(*xs):
    return [x.detach().double().requires_grad_(True) for x in xs]


@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(scale=0.2),
                                dict(attn_mask="bool"), dict(attn_mask="add"),
                                dict(enable_gqa=True)],
                         ids=["plain", "causal", "scale", "bool-mask", "add-mask", "gqa"])
def test_forward_matches_torch(kw):
    hk = 2 if kw.get("enable_gqa") else 4
    q, k, v = rand(2, 4, 9, 16), rand(2, hk, 11, 16), rand(2, hk, 11, 8)
    kw = dict(kw)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(9, 11, generator=torch.Generator().manual_seed(1)) > 0.2
        kw["attn_mask"][:, 0] = True  # no fully masked row: PyTorch makes those NaN
    elif kw.get("attn_mask") == "add":
        kw["attn_mask"] = rand(1, 4, 9, 11)
    out = sdpa.scaled_dot_product_attention(q, k, v, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    want = F.scaled_dot_product_attention(*f64(q, k, v), **{
        n: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
        for n, x in kw.items()})
    assert torch.allclose(out.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
def test_half_tensors(dtype, tol):
    q, k, v = rand(1, 2, 8, 32, dtype=dtype), rand(1, 2, 8, 32, dtype=dtype), rand(
        1, 2, 8, 32, dtype=dtype)
    out = sdpa.scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert (out.double() - want).abs().max() <= tol


def test_autograd_matches_torch_float64():
    q, k, v = rand(2, 3, 7, 8, grad=True), rand(2, 3, 10, 8, grad=True), rand(2, 3, 10, 5,
                                                                             grad=True)
    dout = rand(2, 3, 7, 5)
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(dout)
    q64, k64, v64 = f64(q, k, v)
    F.scaled_dot_product_attention(q64, k64, v64, is_causal=True).backward(dout.double())
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=0)


def test_gqa_grads_sum_over_group():
    q, k, v = rand(1, 4, 5, 8, grad=True), rand(1, 2, 6, 8, grad=True), rand(1, 2, 6, 8,
                                                                            grad=True)
    sdpa.torch.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    q64, k64, v64 = f64(q, k, v)
    F.scaled_dot_product_attention(q64, k64, v64, enable_gqa=True).sum().backward()
    assert torch.allclose(k.grad.double(), k64.grad, atol=1e-5)
    assert torch.allclose(v.grad.double(), v64.grad, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Input #.*double precision")
def test_gradcheck():
    # the library computes in f32: gradcheck's finite differences in f32 need a coarse step
    q, k, v = rand(1, 2, 3, 4, grad=True), rand(1, 2, 4, 4, grad=True), rand(1, 2, 4, 3,
                                                                            grad=True)
    fn = lambda q, k, v: sdpa.torch.scaled_dot_product_attention(q, k, v, softcap=3.0)  # noqa
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-2, atol=2e-3, rtol=2e-2,
                                    nondet_tol=0.0, fast_mode=False)


def test_dropout_backward_sees_the_forward_mask():
    q, k, v = rand(1, 2, 6, 8, grad=True), rand(1, 2, 6, 8, grad=True), rand(1, 2, 6, 8,
                                                                            grad=True)
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_seed=5,
                                                  dropout_offset=1)
    out.sum().backward()
    out2, lse = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_seed=5,
                                                  dropout_offset=1, return_lse=True)
    assert torch.equal(out.detach(), out2)
    dq, dk, dv = sdpa.attention_backward(q, k, v, out2, lse, torch.ones_like(out2),
                                         dropout_p=0.4, dropout_seed=5, dropout_offset=1)
    assert torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv)


def test_compile_without_graph_breaks():
    q, k, v = rand(1, 2, 8, 16, grad=True), rand(1, 2, 8, 16, grad=True), rand(1, 2, 8, 16,
                                                                              grad=True)

    def fn(q, k, v):
        return sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    loss = compiled(q, k, v)
    loss.backward()
    assert torch.allclose(loss, fn(q.detach(), k.detach(), v.detach()))
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_errors():
    q = rand(1, 1, 2, 4)
    with pytest.raises(TypeError, match="float64"):
        sdpa.scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa.scaled_dot_product_attention(rand(1, 2, 2, 4), q, q)
    if torch.cuda.is_available():  # pragma: no cover - no GPU on the CI machines
        with pytest.raises(ValueError, match="CPU"):
            sdpa.scaled_dot_product_attention(q.cuda(), q.cuda(), q.cuda())


def test_views_not_copies():
    base = rand(2, 9, 4, 8)  # (B, L, H, E) memory, as a fused projection leaves it
    q = base.transpose(1, 2)
    out = sdpa.scaled_dot_product_attention(q, q, q)
    want = F.scaled_dot_product_attention(q.double(), q.double(), q.double())
    assert torch.allclose(out.double(), want, atol=1e-5)
    assert np.shares_memory(sdpa._view(q, "q")[0], base.numpy())


def sink_attention(q, k, v, sinks, is_causal=False):
    """Attention with sinks in plain torch (float64): the sink as one more key of score
    sink_h, always visible, whose value is 0."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).tril().logical_not(), float("-inf"))
    sk = sinks.double().reshape(-1, 1, 1).expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]
    return p @ v


def test_sinks_autograd_matches_torch_float64():
    q, k, v = rand(2, 3, 6, 8, grad=True), rand(2, 3, 6, 8, grad=True), rand(2, 3, 6, 4,
                                                                            grad=True)
    sinks = torch.tensor([0.3, -2.0, float("-inf")])
    dout = rand(2, 3, 6, 4)
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=sinks)
    out.backward(dout)
    q64, k64, v64 = f64(q, k, v)
    want = sink_attention(q64, k64, v64, sinks, is_causal=True)
    want.backward(dout.double())
    assert torch.allclose(out.double(), want, atol=1e-5, rtol=0)
    for got, exp in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert torch.allclose(got.double(), exp, atol=1e-5, rtol=0)


@pytest.mark.filterwarnings("ignore:Input #.*double precision")
def test_gradcheck_with_sinks():
    q, k, v = rand(1, 2, 3, 4, grad=True), rand(1, 2, 4, 4, grad=True), rand(1, 2, 4, 3,
                                                                            grad=True)
    sinks = torch.tensor([0.5, -0.25])
    fn = lambda q, k, v: sdpa.torch.scaled_dot_product_attention(  # noqa: E731
        q, k, v, sinks=sinks, alignment="bottom-right", is_causal=True)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-2, atol=2e-3, rtol=2e-2,
                                    nondet_tol=0.0, fast_mode=False)


def test_sinks_that_require_grad_are_refused():
    q = rand(1, 2, 3, 4, grad=True)
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="sinks.detach"):
        sdpa.torch.scaled_dot_product_attention(q, q, q, sinks=sinks)
    with pytest.raises(ValueError, match="sinks.detach"):  # the operator itself, too
        torch.ops.sdpa.attention(q, q, q, None, 0.0, False, None, False, -1, -1, False, False,
                                 0.0, None, sinks, 0, 0)
    out = sdpa.torch.scaled_dot_product_attention(q, q, q, sinks=sinks.detach())
    out.sum().backward()
    assert q.grad is not None and sinks.grad is None
    with torch.no_grad():  # no gradient asked: nothing to refuse
        sdpa.torch.scaled_dot_product_attention(q, q, q, sinks=sinks)


def test_compile_with_sinks():
    q, k, v = rand(1, 2, 8, 16, grad=True), rand(1, 2, 8, 16, grad=True), rand(1, 2, 8, 16,
                                                                              grad=True)
    sinks = torch.tensor([1.0, -1.0])

    def fn(q, k, v):
        return sdpa.torch.scaled_dot_product_attention(q, k, v, sinks=sinks).sum()

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    compiled(q, k, v).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
