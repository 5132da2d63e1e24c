"""Which kernel `layers.attend` uses (a process-wide knob, read when a step is traced/captured).

"specpilot": our split-KV decode / verify kernel (kernels/decode_attention.py) for every call it
takes (CUDA, bf16, D in {64, 128}, T <= 32, Hq/Hkv <= 8, mask with `last`), SDPA for the rest (the
prefill); raises if this build has no CUDA kernels. "auto" (default): the same, but falls back to
SDPA quietly where the kernel is not built, and keeps SDPA inside torch.compile (compile_layers).
The kernel was measured faster than SDPA (cuDNN) on the H200 at every decode / verify shape
(Qwen3-8B heads, per layer: T = 1 at 600 of 1024 slots 9.2 vs 26.3 us, T = 16 12.3 vs 30.9 us,
T = 16 at 3000 of 4096 20.0 vs 97.7 us). "efficient" / "math" / "cudnn": SDPA restricted to that
backend. "matmul": scores = q k^T (bmm), + mask, fp32 softmax, p v (bmm): a few small kernels, no
SDPA dispatch.
Exactness: every choice computes softmax(q k^T * scale + mask) v; they differ only by
floating-point summation order / intermediate precision (the kernel also rounds P to bf16 before
P.V, as flash attention does; bf16 engines are token-forced against stock; fp32 results agree to
fp32 rounding). CPU and fp32 calls never reach the kernel.

AttentionMask(additive, last): one visibility in two forms, made once per forward
(layers.attention_mask): `last` int64 [T] (key slot j visible to query row t iff j <= last[t]) for
the kernel, and the additive 0 / -inf mask [1, 1, g*T, S] for SDPA, built on its first use.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "efficient", "math", "cudnn", "matmul", "specpilot")
_current = "auto"


class AttentionMask:
    """additive: [1, 1, g*T, S] 0 / -inf, rows j*T + t, or a function of no arguments that builds it:
    then it is built on first use (an SDPA call), so a step that our kernel runs end to end launches
    none of its kernels (five per step: PERF_NOTES, twelfth session). last: int64 [T], key slot j
    visible to row t iff j <= last[t] (None: unknown). writes_at_last: the forward writes exactly the
    cache slots `last` names (causal)."""

    __slots__ = ("_additive", "last", "writes_at_last")

    def __init__(self, additive, last: Optional[torch.Tensor], writes_at_last: bool = False):
        self._additive = additive
        self.last = last
        self.writes_at_last = writes_at_last

    @property
    def additive(self) -> torch.Tensor:
        if callable(self._additive):
            self._additive = self._additive()
        return self._additive

    def built(self) -> "AttentionMask":
        """This mask with its additive form built now: before layers that torch.compile traces (they
        run SDPA), so that no trace holds the builder."""
        _ = self.additive
        return self


def set_attention_backend(name: str) -> str:
    """Sets the backend for attention traced from now on; returns the previous one."""
    global _current
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: use one of {BACKENDS}")
    previous, _current = _current, name
    return previous


def get_attention_backend() -> str:
    return _current


def use_decode_kernel(q, k, mask) -> bool:
    """Whether `layers.attend` hands this call (q [B, Hq, T, D], k [B, Hkv, S, D]) to our kernel."""
    if _current not in ("auto", "specpilot") or not isinstance(mask, AttentionMask) or mask.last is None:
        return False
    if _current == "auto":
        if torch.compiler.is_compiling():
            return False                  # compile_layers traces SDPA, as before the kernel existed
    from specpilot.kernels import decode_attention as kernel

    if _current == "specpilot" and q.is_cuda and not kernel.available():
        raise RuntimeError("attention backend 'specpilot' needs specpilot._C built with CUDA kernels "
                           "(SPECPILOT_CUDA=1 pip install --no-build-isolation -e .)")
    return kernel.supports(q, k)


def masked_attention(q, k, v, mask, scale: float):
    """q [B, H, R, D], k/v [B, H, S, D], additive mask broadcastable to [B, H, R, S] (or an
    AttentionMask: its additive part) -> [B, H, R, D]. Always SDPA / matmul: the kernel is
    dispatched by `layers.attend`, which knows the unfolded rows and the output layout."""
    if isinstance(mask, AttentionMask):
        mask = mask.additive
    if _current == "matmul":
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask   # [B, H, R, S] fp32
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v)
    if _current in ("auto", "specpilot"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[_current]
    with sdpa_kernel([backend]) if q.is_cuda else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
