"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU MLP, masked attention.

Exactness: RMSNorm and RoPE follow Hugging Face transformers' Qwen3/LLaMA arithmetic step by step
(fp32 statistics, cast back, then the weight multiply; cos/sin computed in fp32 and cast to the model
dtype), so per-row results match HF up to GEMM/attention kernel rounding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention_backend import masked_attention
from .config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps) * self.weight


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) computed in fp32 and rounded to x's dtype (HF's order: the weight is
    applied after this rounding, by the caller). One fused kernel on CUDA."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [D/2] in fp32 on the CPU, as HF computes them (default and llama3)."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "default":
        return inv_freq
    if rope.kind != "llama3":
        raise ValueError(f"rope type {rope.kind!r} is not supported")
    old = rope.original_max_position_embeddings
    low_wavelen, high_wavelen = old / rope.low_freq_factor, old / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_table(rope: RopeConfig, head_dim: int, num_positions: int, device, dtype):
    """(cos, sin), each [num_positions, D] in `dtype`, indexed by absolute position."""
    inv_freq = rope_inv_freq(rope, head_dim)
    pos = torch.arange(num_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]                   # one fp32 multiply, as HF's matmul
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D] (already gathered at the tokens' positions)."""
    return x * cos + rotate_half(x) * sin


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused in one plain nn.Linear ([gate; up] rows)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.inter = inter
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.inter, dim=-1)
        return self.down(F.silu(gate) * up)


def attention_mask(visible: torch.Tensor, groups: int, dtype) -> torch.Tensor:
    """visible bool [T, S] -> additive mask [1, 1, g*T, S] (0 / -inf) for `attend`'s folded GQA rows,
    built once per forward instead of once per layer."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    return mask.repeat(groups, 1)[None, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, S, D], mask from attention_mask [1, 1, g*T, S] -> [B, T, Hq*D].

    GQA without copying K/V: the g query heads sharing a KV head (HF's repeat_kv order: q head h
    uses KV head h // g) are folded into the row axis, so K/V are read once per KV head.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    q = q.reshape(b, hkv, (hq // hkv) * t, d)                # rows j*T + t
    out = masked_attention(q, k, v, mask, scale)             # SDPA unless attention_backend says otherwise
    out = out.reshape(b, hq, t, d)
    return out.transpose(1, 2).reshape(b, t, hq * d)


class PreNormBlock(nn.Module):
    """The decoder block of both the target and the DFlash drafter (they differ only in attention):
    x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float, attn: nn.Module):
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, positions, k_cache, v_cache, kv_len, mask)
        return x + self.mlp(self.mlp_norm(x))


class RopeTables:
    """Mixin for a model with `config.rope`, `config.head_dim`, `rope_device()` and `rope_dtype()`:
    cos/sin tables [P, D] grown on demand."""

    rope_cos = rope_sin = None

    def ensure_rope(self, num_positions: int, device=None, dtype=None):
        """(Re)builds the cos/sin tables [P, D] when they cover fewer than `num_positions` positions."""
        device = device or self.rope_device()
        dtype = dtype or self.rope_dtype()
        if self.rope_cos is None or self.rope_cos.shape[0] < num_positions or self.rope_cos.device != device:
            c = self.config
            # Keep the old tables alive: CUDA graphs captured earlier still read them (same values).
            self._retired_rope = getattr(self, "_retired_rope", []) + [(self.rope_cos, self.rope_sin)]
            self.rope_cos, self.rope_sin = rope_table(c.rope, c.head_dim, num_positions, device, dtype)
