"""The attention family's dispatch: `attend(q, k, v, mask, scale)` runs our decode kernel or the
reference, SDPA (`masked_attention`), as EngineConfig.attention says (read when a step is run or
captured). `attention_mask` builds the visibility once per forward in both forms.

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
(attention_mask): `last` int64 [T] (key slot j visible to query row t iff j <= last[t]) for
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
    """Whether `attend` hands this call (q [B, Hq, T, D], k [B, Hkv, S, D]) to our kernel."""
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
    AttentionMask: its additive part) -> [B, H, R, D] through SDPA, the reference: the kernel is
    dispatched by `attend`, which knows the unfolded rows and the output layout."""
    if isinstance(mask, AttentionMask):
        mask = mask.additive
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def attention_mask(last: torch.Tensor, kv_len: int, groups: int, dtype, writes_at_last: bool = False) -> AttentionMask:
    """The visibility "key slot j visible to row t iff j <= last[t]" (last: int64 [T], one per row) over
    kv_len slots, in both forms: `last` for the decode kernel, and the additive mask [1, 1, g*T, S]
    (0 / -inf) for SDPA over `attend`'s folded GQA rows, built on first use only. writes_at_last: the
    forward writes exactly the cache slots `last` names (the target's causal steps; the decode kernel
    then loads older keys early). Built once per forward instead of once per layer."""
    last = last.reshape(-1).to(torch.int64).contiguous()

    def additive():
        visible = torch.arange(kv_len, device=last.device)[None, :] <= last[:, None]            # [T, S]
        mask = torch.zeros(visible.shape, dtype=dtype, device=last.device).masked_fill_(~visible, float("-inf"))
        return mask.repeat(groups, 1)[None, None]

    return AttentionMask(additive, last, writes_at_last)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, scale: float) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, S, D], mask from attention_mask -> [B, T, Hq*D].

    GQA without copying K/V: the g query heads sharing a KV head (HF's repeat_kv order: q head h
    uses KV head h // g) are folded into the row axis, so K/V are read once per KV head.
    On CUDA bf16 our decode kernel takes T <= 32 calls and writes [B, T, Hq*D].
    """
    if use_decode_kernel(q, k, mask):
        from specpilot.kernels.decode_attention import decode_attention
        return decode_attention(q, k, v, mask.last, scale, writes_at_last=mask.writes_at_last)
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    q = q.reshape(b, hkv, (hq // hkv) * t, d)                # rows j*T + t
    out = masked_attention(q, k, v, mask, scale)             # SDPA
    out = out.reshape(b, hq, t, d)
    return out.transpose(1, 2).reshape(b, t, hq * d)
