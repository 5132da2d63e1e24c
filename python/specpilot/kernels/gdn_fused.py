"""The Gated DeltaNet layer's fused small ops (torch.ops.specpilot.gdn_prologue / gdn_gated_norm, CUDA
builds; kernels csrc/cuda/gdn_fused.cu), around the chain kernel (kernels/gdn_chain.py):

- `prologue`: the conv update over T new tokens (window [C, K-1+T] = [committed K-1 inputs | new
  inputs], the record a verify commit takes its K-1 inputs ending at any position from), the depthwise
  causal conv + SiLU -> mixed [T, C], and the gates beta = sigmoid(b), g = -exp(A_log) * softplus(a +
  dt_bias): one launch per layer where the torch path runs ~12 kernels.
- `gated_norm`: RMSNorm(o) * weight * silu(z) per head, one launch for ~8.

References: the torch path in models/hybrid.py (GatedDeltaNet.forward) and models/gdn.py
(causal_conv, gated_rms_norm) on the same inputs. The kernels round to bf16 exactly where that path
does (conv output, SiLU output, sigmoid, normed x, weight * normed) and accumulate in fp32, so only
the fp32 summation order differs: an element differs from the reference only when that order moves
an intermediate across a bf16 rounding boundary (tests/test_gdn_fused_gpu.py bounds how often and by
how much).

The prologue takes one sequence (batch 1) of 1..MAX_TOKENS tokens, bf16 CUDA activations, conv
state and conv weight, conv width 2..4; the norm takes bf16 CUDA x and z. Both only while
EngineConfig.fused_kernels is on and the extension has the ops; `takes_*` say so, `why_not_*` say why
not (the torch path runs then).
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext, config

MAX_TOKENS = 64          # the per-position (verify) forwards: engine/recurrent_state.py MAX_SNAPSHOT_T
CONV_WIDTHS = (2, 3, 4)
PARAM_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    return _ext.has_cuda_op("gdn_prologue") and _ext.has_cuda_op("gdn_gated_norm")


def _on_cuda_bf16(name: str, x: torch.Tensor):
    if not x.is_cuda:
        return f"{name} is on {x.device}, not CUDA"
    if x.dtype != torch.bfloat16:
        return f"{name} is {x.dtype}, not bfloat16"
    return None


def why_not_prologue(qkv: torch.Tensor, conv_state: torch.Tensor, conv_weight: torch.Tensor, params=()):
    """Why the prologue kernel cannot take this block (qkv [B, T, C], conv_state [B, C, K-1],
    conv_weight [C, K], params: A_log and dt_bias), or None when it can (on shape and dtype)."""
    for name, x in (("qkv", qkv), ("conv_state", conv_state), ("conv_weight", conv_weight)):
        reason = _on_cuda_bf16(name, x)
        if reason:
            return reason
    if qkv.dim() != 3 or qkv.shape[0] != 1:
        return f"qkv must be one sequence [1, T, C], got shape {list(qkv.shape)}"
    if not 1 <= qkv.shape[1] <= MAX_TOKENS:
        return f"the kernel takes 1..{MAX_TOKENS} tokens, got {qkv.shape[1]}"
    if conv_weight.dim() != 2 or conv_weight.shape[1] not in CONV_WIDTHS:
        return f"conv width must be one of {CONV_WIDTHS}, got conv_weight of shape {list(conv_weight.shape)}"
    for p in params:
        if p.dtype not in PARAM_DTYPES:
            return f"gate parameters must be float32 or bfloat16, got {p.dtype}"
    return None


def why_not_gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor):
    """Why the epilogue kernel cannot take x, z [..., H, Dv] with weight [Dv], or None when it can."""
    for name, y in (("x", x), ("z", z)):
        reason = _on_cuda_bf16(name, y)
        if reason:
            return reason
    if weight.dtype not in PARAM_DTYPES:
        return f"the norm weight must be float32 or bfloat16, got {weight.dtype}"
    if x.shape != z.shape or weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        return f"x {list(x.shape)} and z {list(z.shape)} must match, ending in weight's {list(weight.shape)}"
    return None


def _enabled() -> bool:
    return config.current().fused_kernels and available()


def takes_prologue(qkv, conv_state, conv_weight, params=()) -> bool:
    return _enabled() and why_not_prologue(qkv, conv_state, conv_weight, params) is None


def takes_gated_norm(x, z, weight) -> bool:
    return _enabled() and why_not_gated_norm(x, z, weight) is None


def prologue(qkv, b, a, conv_state, conv_weight, A_log, dt_bias, window_out=None):
    """qkv [1, T, C], b, a [1, T, hv] (column slices of the projection), conv_state [1, C, K-1] ->
    (mixed [T, C] bf16, window [1, C, K-1+T] bf16: window_out when given, g [T, hv] fp32, beta
    [T, hv] fp32)."""
    reason = why_not_prologue(qkv, conv_state, conv_weight, (A_log, dt_bias))
    if reason:
        raise ValueError(f"gdn prologue kernel: {reason}")
    _, t, c = qkv.shape
    hv, width = b.shape[-1], conv_weight.shape[1]
    window = torch.empty(1, c, width - 1 + t, dtype=qkv.dtype, device=qkv.device) if window_out is None \
        else window_out
    mixed = torch.empty(t, c, dtype=qkv.dtype, device=qkv.device)
    g = torch.empty(t, hv, dtype=torch.float32, device=qkv.device)
    beta = torch.empty(t, hv, dtype=torch.float32, device=qkv.device)
    _ext.ops().gdn_prologue(qkv[0], b[0], a[0], conv_state[0], conv_weight, A_log, dt_bias, window[0], mixed, g,
                            beta)
    return mixed, window, g, beta


def gated_norm(x, z, weight, eps: float):
    """x, z [..., H, Dv] bf16 (z may be a column slice of the projection), weight [Dv] -> [..., H, Dv]
    bf16: models/gdn.py gated_rms_norm."""
    reason = why_not_gated_norm(x, z, weight)
    if reason:
        raise ValueError(f"gdn gated norm kernel: {reason}")
    shape, width = x.shape, x.shape[-1] * x.shape[-2]
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    _ext.ops().gdn_gated_norm(x.reshape(-1, width), z.reshape(-1, width), weight.contiguous(), eps,
                              out.view(-1, width))
    return out
