"""sdpa.torch: sdpa as a PyTorch custom operator, with autograd.

    import torch, sdpa.torch
    q, k, v = (torch.randn(2, 8, 128, 64, requires_grad=True) for _ in range(3))
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()                      # q.grad, k.grad, v.grad through sdpa_backward

The forward and the backward are registered with torch.library as the operators
sdpa::attention and sdpa::attention_backward (each with a fake implementation, so
torch.compile traces them without graph breaks), and autograd connects them: the backward
reads the forward's out and log-sum-exp, and with dropout the same seed and offset, so it
sees the same mask. The gradient of the log-sum-exp output is not propagated (it is an
auxiliary output; the library's backward differentiates out). CPU tensors of float32,
float16 and bfloat16.

Attention sinks (sinks=, one logit per query head) take part in the forward and, through the
log-sum-exp, in the gradients of q, k and v; the sink logits themselves get no gradient,
because the library computes none. Rather than hand back a silent None, the operator refuses
sinks that require a gradient (ValueError): pass sinks.detach() to keep them fixed.
"""

from typing import List, Optional, Tuple

import torch

from . import _next_dropout
from . import attention_backward as _backward
from . import scaled_dot_product_attention as _forward

__all__ = ["scaled_dot_product_attention"]


def _kwargs(window_left, window_right, use_window, bottom_right, softcap, slopes, sinks):
    return dict(window=(window_left, window_right) if use_window else None,
                alignment="bottom-right" if bottom_right else "top-left",
                softcap=softcap if softcap > 0 else None, alibi_slopes=slopes, sinks=sinks)


_NO_SINK_GRAD = ("sinks: the tensor requires a gradient, which sdpa does not compute (the "
                 "library differentiates q, k and v only); pass sinks.detach() to keep the "
                 "sinks fixed")


@torch.library.custom_op("sdpa::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool,
              window_left: int, window_right: int, use_window: bool, bottom_right: bool,
              softcap: float, slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
              seed: int, offset: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """sdpa_forward: (out, lse)."""
    return _forward(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa, return_lse=True, dropout_seed=seed,
                    dropout_offset=offset,
                    **_kwargs(window_left, window_right, use_window, bottom_right, softcap,
                              slopes, sinks))


@attention.register_fake
def _attention_fake(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, window_left,
                    window_right, use_window, bottom_right, softcap, slopes, sinks, seed,
                    offset):
    return (q.new_empty(q.shape[:-1] + (v.shape[-1],)),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.custom_op("sdpa::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, dout: torch.Tensor, mask: Optional[torch.Tensor],
                       dropout_p: float, is_causal: bool, scale: Optional[float],
                       enable_gqa: bool, window_left: int, window_right: int, use_window: bool,
                       bottom_right: bool, softcap: float, slopes: Optional[torch.Tensor],
                       sinks: Optional[torch.Tensor], seed: int,
                       offset: int) -> List[torch.Tensor]:
    """sdpa_backward: [dq, dk, dv]."""
    dq, dk, dv = _backward(q, k, v, out, lse, dout, attn_mask=mask, dropout_p=dropout_p,
                           is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                           dropout_seed=seed, dropout_offset=offset,
                           **_kwargs(window_left, window_right, use_window, bottom_right,
                                     softcap, slopes, sinks))
    return [dq, dk, dv]


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, out, lse, dout, *args):
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]


_SINKS = 14  # the position of sinks among sdpa::attention's inputs


def _setup_context(ctx, inputs, output):
    if inputs[_SINKS] is not None and inputs[_SINKS].requires_grad:
        raise ValueError(_NO_SINK_GRAD)
    q, k, v, mask = inputs[:4]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mask = mask
    ctx.params = inputs[4:]


def _autograd_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.sdpa.attention_backward(q, k, v, out, lse, dout.contiguous(),
                                                   ctx.mask, *ctx.params)
    return (dq, dk, dv) + (None,) * 14


attention.register_autograd(_autograd_backward, setup_context=_setup_context)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, window=None,
                                 alignment="top-left", softcap=None, alibi_slopes=None,
                                 sinks=None, dropout_seed=None, dropout_offset=None):
    """torch.nn.functional.scaled_dot_product_attention through sdpa, with autograd: the
    arguments and extras of sdpa.scaled_dot_product_attention (see help(sdpa)); returns out.
    With dropout and no seed, a fresh (seed, offset) is drawn per call and the backward
    reuses it. Gradients flow to query, key and value; sinks (one logit per query head) get
    none, and sinks that require one are refused with ValueError (pass sinks.detach())."""
    if alignment not in ("top-left", "bottom-right"):
        raise ValueError("alignment=%r: expected 'top-left' or 'bottom-right'" % (alignment,))
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed, dropout_offset = _next_dropout()
    use_window = window is not None
    wl, wr = (int(window[0]), int(window[1])) if use_window else (-1, -1)
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = torch.tensor(alibi_slopes, dtype=torch.float32)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.tensor(sinks, dtype=torch.float32)
    if sinks is not None and sinks.requires_grad and torch.is_grad_enabled():
        raise ValueError(_NO_SINK_GRAD)
    out, _ = torch.ops.sdpa.attention(
        query, key, value, attn_mask, float(dropout_p), bool(is_causal),
        None if scale is None else float(scale), bool(enable_gqa), wl, wr, use_window,
        alignment == "bottom-right", 0.0 if softcap is None else float(softcap), alibi_slopes,
        sinks, int(dropout_seed or 0), int(dropout_offset or 0))
    return out
