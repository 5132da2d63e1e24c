"""Which kernel `layers.attend` uses: EngineConfig.attention, read when a step is run or captured.

"auto" (default): our split-KV decode / verify kernel (kernels/decode_attention.py) for every call it
takes (CUDA, bf16, D in {64, 128}, T <= 32, Hq/Hkv <= 8, mask with `last`), SDPA for the rest (the
prefill), and SDPA inside torch.compile (compile_layers) or where the kernel is not built.
"specpilot": the same, but an error on CUDA where this build has no kernel. "sdpa": torch's
scaled_dot_product_attention everywhere. The kernel was measured faster than SDPA (cuDNN) on the
H200 at every decode / verify shape (Qwen3-8B heads, per layer: T = 1 at 600 of 1024 slots 9.2 vs
26.3 us, T = 16 12.3 vs 30.9 us, T = 16 at 3000 of 4096 20.0 vs 97.7 us).
Exactness: both compute softmax(q k^T * scale + mask) v; they differ only by floating-point
summation order (the kernel also rounds P to bf16 before P.V, as flash attention does; bf16 engines
are token-forced against stock; fp32 results agree to fp32 rounding). CPU and fp32 calls never
reach the kernel.

AttentionMask(additive, last): one visibility in two forms, made once per forward
(layers.attention_mask): `last` int64 [T] (key slot j visible to query row t iff j <= last[t]) for
the kernel, and the additive 0 / -inf mask [1, 1, g*T, S] for SDPA, built on its first use.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specpilot import config


class AttentionMask:
    """additive: [1, 1, g*T, S] 0 / -inf, rows j*T + t, or a function of no arguments that builds it:
    then it is built on first use (an SDPA call), so a step that our kernel runs end to end launches
    none of its kernels (five per step). last: int64 [T], key slot j
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


def use_decode_kernel(q, k, mask) -> bool:
    """Whether `layers.attend` hands this call (q [B, Hq, T, D], k [B, Hkv, S, D]) to our kernel."""
    choice = config.current().attention
    if choice == "sdpa" or not isinstance(mask, AttentionMask) or mask.last is None:
        return False
    if choice == "auto" and torch.compiler.is_compiling():
        return False                      # compile_layers traces SDPA, as before the kernel existed
    from specpilot.kernels import decode_attention as kernel

    if choice == "specpilot" and q.is_cuda and not kernel.available():
        raise RuntimeError("attention backend 'specpilot' needs specpilot._C built with CUDA kernels "
                           "(SPECPILOT_CUDA=1 pip install --no-build-isolation -e .)")
    return kernel.supports(q, k)


def masked_attention(q, k, v, mask, scale: float):
    """q [B, H, R, D], k/v [B, H, S, D], additive mask broadcastable to [B, H, R, S] (or an
    AttentionMask: its additive part) -> [B, H, R, D] through SDPA: the kernel is dispatched by
    `layers.attend`, which knows the unfolded rows and the output layout."""
    if isinstance(mask, AttentionMask):
        mask = mask.additive
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
