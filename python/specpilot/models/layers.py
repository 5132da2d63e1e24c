"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU MLP, masked attention.

Exactness: RMSNorm and RoPE follow Hugging Face transformers' Qwen3/LLaMA arithmetic step by step
(fp32 statistics, cast back, then the weight multiply; cos/sin computed in fp32 and cast to the model
dtype), so per-row results match HF up to GEMM/attention kernel rounding. The elementwise work runs
through ops/norm_rope.py (fused CUDA kernels on bf16 CUDA, else the unchanged eager formulas; see
there for what the kernels change: only the fp32 sum-of-squares order of the norms); linears through
ops/linear.py, attention through ops/attention.py.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from specpilot.ops import linear
from specpilot.ops.norm_rope import add_rms_norm, silu_mul

from .config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_rms_norm(x, None, self.weight, self.eps)[1]


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


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused in one plain nn.Linear ([gate; up] rows)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.inter = inter
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear.linear(self.down, silu_mul(linear.linear(self.gate_up, x)))


class PreNormBlock(nn.Module):
    """The decoder block of both the target and the DFlash drafter (they differ only in attention):
    x + attn(norm(x)), then x + mlp(norm(x)).

    Each residual add is fused with the norm that follows it (add_rms_norm), so the block's own
    final add is left to the next block (or the model's final norm): the block takes its input as
    (x, delta) with input = x + delta (delta None: x itself) and returns (input, h, mlp_out), its
    input materialised (the previous layer's output, HF hidden_states[i]) and its output as the
    pending sum h + mlp_out. Same bf16 adds in the same order as the unfused block.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float, attn: nn.Module):
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x, delta, cos, sin, positions, k_cache, v_cache, kv_len, mask):
        block_input, normed = add_rms_norm(x, delta, self.attn_norm.weight, self.attn_norm.eps)
        attn_out = self.attn(normed, cos, sin, positions, k_cache, v_cache, kv_len, mask)
        h, normed = add_rms_norm(block_input, attn_out, self.mlp_norm.weight, self.mlp_norm.eps)
        return block_input, h, self.mlp(normed)


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
