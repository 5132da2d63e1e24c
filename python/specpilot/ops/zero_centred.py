"""The hybrid target's elementwise work (models/hybrid.py) in few kernels: the zero-centred RMSNorm
(weight 1 + w, transformers' Qwen3NextRMSNorm), the gated attention's q/k head norms with partial RoPE,
and its output gate, each beside its op-for-op reference.

  zero_centred_rms_norm(x, weight, eps)              the reference: fp32 statistics, x * rstd * (1 + w)
                                                     in fp32, one cast back (~10 kernels)
  add_zero_centred_rms_norm(x, delta, weight, ...)   (x + delta, its norm): one CUDA kernel
                                                     (torch.ops.specpilot.zero_centred_add_rms_norm,
                                                     csrc/cuda/fused_norm.cu) where the build has it,
                                                     else the add and compact_zero_centred_rms_norm
  compact_zero_centred_rms_norm(x, plus_one, eps)    cast, fused rms_norm, multiply-and-cast: 3 kernels
  rope_rows(sin)                                     a step's sin rows for the compact RoPE (once a step)
  compact_qk_norm_rope(q, k, plus_one, cos, sin_rows, eps) -> (q, k) normed and rotated, [B, T, H, D]:
                                                     ~8 kernels for both where the reference runs ~32
  output_gate(out, gate)                             out * sigmoid(gate) from the strided gate view: 2

Dispatch (`takes`): the compact forms run on bf16 tensors while EngineConfig.fused_kernels is on and no
torch.compile trace runs; fp32 (the CPU reference tier) always runs the reference, unchanged. The CUDA
norm kernel runs where they would and the tensors are CUDA, contiguous and 16-byte aligned.

Exactness: the compact forms keep every rounding of the reference; what changes is only the fp32
sum-of-squares order and rsqrt of the norms (torch's fused rms_norm kernel on CUDA, or ours), as for the
dense fused kernels (ops/norm_rope.py): the normed values within 1 bf16 ulp (one rounding at the end),
residual sums bit-identical. The RoPE is bit-identical: rotate_half(x) * sin = cat(-x2, x1) * sin
equals cat(x2, x1) * cat(-sin1, sin2) elementwise, IEEE negation being exact.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specpilot import _ext, config
from specpilot.kernels import registry

MAX_NORM_HIDDEN = 32768                # csrc/include/specpilot/fused_ops.h kMaxHidden


def takes(x: torch.Tensor) -> bool:
    """Whether the compact forms run on activations like x (else the references)."""
    return x.dtype == torch.bfloat16 and config.current().fused_kernels and not torch.compiler.is_compiling()


# -- references ------------------------------------------------------------------------------------
def zero_centred_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with weight (1 + w), both in fp32, one cast back (transformers' Qwen3NextRMSNorm)."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def partial_rope(x, cos, sin):
    """x [B, H, T, D]; cos/sin [T, R] with R <= D: rotate the first R dims, pass the rest."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


# -- the weight (1 + w) in fp32, kept -----------------------------------------------------------------
class PlusOne:
    """1 + the given weights in fp32 (stacked per head by `repeats`, see `get`), recomputed when a weight
    changes (its storage or version; inference tensors have no version: there only a new storage shows).
    A recompute writes into the same tensor when the shape allows, so a CUDA graph that captured it
    keeps reading live memory."""

    def __init__(self):
        self.key, self.value = None, None

    def get(self, weights, repeats=None) -> torch.Tensor:
        """weights: 1-D tensors [D]; repeats None: one weight -> [D]; else the counts per weight ->
        [sum(repeats), D] (row h: 1 + the weight head h uses)."""
        key = tuple((w.data_ptr(), None if w.is_inference() else w._version, w.device, w.dtype)
                    for w in weights) + (tuple(repeats or ()),)
        if key != self.key:
            with torch.no_grad():
                if repeats is None:
                    fresh = weights[0].float() + 1.0
                else:
                    fresh = torch.cat([w.float().expand(n, -1) for w, n in zip(weights, repeats)]) + 1.0
                if self.value is not None and self.value.shape == fresh.shape and self.value.device == fresh.device:
                    self.value.copy_(fresh)
                else:
                    self.value = fresh
            self.key = key
        return self.value


# -- the residual add + norm ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def kernel_available() -> bool:
    return _ext.has_cuda_op("zero_centred_add_rms_norm")


def _aligned(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def kernel_takes(x: torch.Tensor, delta, weight: torch.Tensor) -> bool:
    """Whether add_zero_centred_rms_norm runs these through the CUDA kernel."""
    return (takes(x) and x.is_cuda and weight.dtype == torch.bfloat16 and weight.is_cuda
            and x.shape[-1] % 8 == 0 and x.shape[-1] <= MAX_NORM_HIDDEN and _aligned(x) and _aligned(weight)
            and (delta is None or (delta.shape == x.shape and delta.dtype == x.dtype and _aligned(delta)))
            and kernel_available())


def add_zero_centred_rms_norm(x: torch.Tensor, delta, weight: torch.Tensor, plus_one: PlusOne, eps: float):
    """(total, normed): total = x + delta (x itself when delta is None), normed =
    zero_centred_rms_norm(total, weight, eps). plus_one: the norm's PlusOne (the compact form's 1 + w)."""
    if kernel_takes(x, delta, weight):
        normed = torch.empty_like(x)
        total = None if delta is None else torch.empty_like(x)
        _ext.ops().zero_centred_add_rms_norm(x, delta, weight, eps, total, normed)
        return (x if total is None else total), normed
    total = x if delta is None else x + delta
    if takes(total):
        return total, compact_zero_centred_rms_norm(total, plus_one.get((weight,)), eps)
    return total, zero_centred_rms_norm(total, weight, eps)


# -- compact forms ---------------------------------------------------------------------------------
def compact_zero_centred_rms_norm(x: torch.Tensor, plus_one: torch.Tensor, eps: float) -> torch.Tensor:
    """zero_centred_rms_norm(x, w, eps) with plus_one = 1 + w in fp32 [D]: x's fp32 copy, torch's rms_norm
    over it (x * rstd in fp32: one fused kernel on CUDA), then (x * rstd) * (1 + w) rounded once into x's
    dtype by the multiply itself."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return torch.mul(normed, plus_one, out=torch.empty_like(x))


def rope_rows(sin: torch.Tensor) -> torch.Tensor:
    """sin [T, R] at a step's positions -> cat(-sin1, sin2), what compact_qk_norm_rope multiplies the
    swapped halves by (made once per step, shared by the attention layers)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def compact_qk_norm_rope(q, k, plus_one, cos, sin_rows, eps: float):
    """q [B, T, Hq, D], k [B, T, Hkv, D] (strided views of the projection are fine); plus_one [Hq + Hkv, D]
    fp32 (1 + q_norm weight for the q heads, 1 + k_norm's for the k heads); cos [T, R], sin_rows from
    rope_rows -> (q, k), views of one new [B, T, Hq + Hkv, D] tensor: each head zero-centred-RMSNormed,
    its first R dims rotated (partial RoPE), the rest passed."""
    b, t, hq, d = q.shape
    heads = hq + k.shape[2]
    if k.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[3] != d:
        raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} must be [B, T, heads, D] with the same B, T, D")
    if tuple(plus_one.shape) != (heads, d) or plus_one.dtype != torch.float32:
        raise ValueError(f"plus_one must be fp32 [{heads}, {d}] (one row per q and k head), got "
                         f"{plus_one.dtype} {list(plus_one.shape)}")
    fp32 = torch.empty(b, t, heads, d, dtype=torch.float32, device=q.device)
    torch.cat([q, k], dim=2, out=fp32)                                  # fp32 copies of both
    normed = F.rms_norm(fp32, (d,), None, eps)
    qk = torch.mul(normed, plus_one, out=torch.empty(fp32.shape, dtype=q.dtype, device=q.device))
    rope_in_place(qk, cos, sin_rows)
    return qk[:, :, :hq], qk[:, :, hq:]


def rope_in_place(x: torch.Tensor, cos: torch.Tensor, sin_rows: torch.Tensor) -> None:
    """Partial RoPE of x [B, T, H, D] in place (its first R dims), cos [T, R] and sin_rows = rope_rows(sin):
    4 kernels, bit-identical to partial_rope on x.transpose(1, 2)."""
    t, r = cos.shape
    if r % 2 or r > x.shape[-1] or x.shape[1] != t or tuple(sin_rows.shape) != (t, r):
        raise ValueError(f"rope over x {list(x.shape)} needs cos and sin_rows [T={x.shape[1]}, R] with R even and "
                         f"<= {x.shape[-1]}, got cos {list(cos.shape)}, sin_rows {list(sin_rows.shape)}")
    rot = x[..., :r]
    turned = rot * cos[:, None]
    swapped = rot.unflatten(-1, (2, r // 2)).flip(-2).flatten(-2)       # cat(x2, x1): one kernel
    swapped.mul_(sin_rows[:, None])                                     # * cat(-s1, s2)
    torch.add(turned, swapped, out=rot)


def output_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """out [B, T, H*D] * sigmoid(gate [B, T, H, D], any strides) -> [B, T, H*D], each op rounded as the
    reference out * torch.sigmoid(gate.reshape(B, T, H*D)), without the reshape's copy."""
    return torch.sigmoid(gate).mul_(out.reshape(gate.shape)).view(out.shape)


registry.register("zero_centred_add_rms_norm", "cuda-sm90a", lambda: kernel_available() and torch.cuda.is_available())
registry.register("zero_centred_add_rms_norm", "torch-compact", lambda: True)
