"""Which kernel `layers.attend` uses (a process-wide knob, read when a step is traced/captured).

"auto" (default): torch's SDPA picks (on the H200 with our additive mask: cuDNN flash, ~24 us per
layer for a T=1 decode step at a 1024-slot span). "efficient" / "math" / "cudnn": SDPA restricted
to that backend. "matmul": scores = q k^T (bmm), + mask, fp32 softmax, p v (bmm): a few small
kernels, no SDPA dispatch.
Exactness: every choice computes softmax(q k^T * scale + mask) v; they differ only by
floating-point summation order / intermediate precision (bf16 engines are token-forced against
stock; fp32 results agree to fp32 rounding).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "efficient", "math", "cudnn", "matmul")
_current = "auto"


def set_attention_backend(name: str) -> str:
    """Sets the backend for attention traced from now on; returns the previous one."""
    global _current
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: use one of {BACKENDS}")
    previous, _current = _current, name
    return previous


def get_attention_backend() -> str:
    return _current


def masked_attention(q, k, v, mask, scale: float):
    """q [B, H, R, D], k/v [B, H, S, D], additive mask broadcastable to [B, H, R, S] -> [B, H, R, D]."""
    if _current == "matmul":
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask   # [B, H, R, S] fp32
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v)
    if _current == "auto":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[_current]
    with sdpa_kernel([backend]) if q.is_cuda else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
