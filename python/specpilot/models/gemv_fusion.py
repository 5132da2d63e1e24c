"""The AR step's linears as one-token GEMVs with the elementwise work before them fused in
(torch.ops.specpilot.gemv_m1, csrc/cuda/gemv_m1.cu):

  norm_linear(x, delta, norm_w, eps, w) -> (x + delta, W @ RMSNorm(x + delta))   add_rms_norm + linear
  silu_mul_linear(gate_up, w)           -> W @ (silu(gate) * up)                 silu_mul + linear
  linear(x, w)                          -> W @ x

so a decoder layer's T = 1 step runs 4 GEMV kernels, qk_norm_rope_cache and attention, instead of
those plus two add_rms_norm and one silu_mul kernels; each GEMV is launched with programmatic
dependent launch, so its first weight loads overlap the end of the previous kernel.

On by default (EngineConfig.fused_gemv): measured on the H200 (Qwen3-8B shape, side by side) the AR
step took 4.49 ms with the layer linears and the LM head fused vs 5.25 ms with cuBLAS and the
separate kernels. split12 weights keep split12_linear after the separate norm / gate kernels: a
streamed split12 GEMV with the prologue fused in measured slower (3.883 vs 3.835 ms), because it
fills the SM and the next GEMV cannot start beside it (docs/design_notes_deleted.md).

`takes(...)` says when it applies: EngineConfig.fused_gemv and .fused_kernels are on, one token
row, CUDA bf16, every linear a plain nn.Linear without bias with K a multiple of 8
(torch.ops.specpilot.gemv_m1), and the norm's hidden size <= 4096. Otherwise callers run the
separate ops.

Exactness: the prologue's output is bit-identical to add_rms_norm / silu_mul's CUDA kernels (same
arithmetic, same summation order). For nn.Linear the GEMV sums in fp32 in its own fixed order, so
results differ from cuBLAS by summation rounding only (bf16 engines are held to token forcing
against stock).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from specpilot import _ext, config
from specpilot.kernels import registry

from . import fused_ops

PLAIN, ADD_NORM, SILU_MUL = 0, 1, 2    # csrc/include/specpilot/gemv_m1.h GemvPrologue
MAX_K = 16384                          # kMaxK
MAX_NORM_HIDDEN = 4096                 # kMaxNormHidden

@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not)."""
    return _ext.has_cuda_op("gemv_m1")


def enabled() -> bool:
    return config.current().fused_gemv


def weight_ok(w: torch.Tensor) -> bool:
    """A weight [N, K] the kernel reads: CUDA bf16, contiguous, 16-byte aligned, K % 8 == 0, K <= MAX_K."""
    return (w.dim() == 2 and w.is_cuda and w.dtype == torch.bfloat16 and w.is_contiguous()
            and w.shape[1] % 8 == 0 and w.shape[1] <= MAX_K and w.data_ptr() % 16 == 0)


def _gemv_linear(m) -> bool:
    return type(m) is nn.Linear and m.bias is None and weight_ok(m.weight)


def _launch(proj, x, delta, norm_weight, eps: float, prologue: int, y, total) -> None:
    """One GEMV launch: `proj` is a bf16 weight tensor or an nn.Linear."""
    weight = proj.weight if isinstance(proj, nn.Module) else proj
    _ext.ops().gemv_m1(weight, x, delta, norm_weight, eps, prologue, config.current().gemv_pdl, y, total)


def _out_features(proj) -> int:
    return proj.out_features if isinstance(proj, nn.Module) else proj.shape[0]


def takes(x: torch.Tensor, *linears, norm_hidden: int | None = None) -> bool:
    """Whether the fused GEMVs run for input x [..., H] (one token row) through these linears."""
    if not (enabled() and fused_ops.fused_kernels_enabled()) or torch.compiler.is_compiling():
        return False                     # its prologues are the fused kernels' arithmetic: off with them
    if not (x.is_cuda and x.dtype == torch.bfloat16 and x.numel() == x.shape[-1]):
        return False
    if norm_hidden is not None and norm_hidden > MAX_NORM_HIDDEN:
        return False
    return all(_gemv_linear(m) for m in linears) and available()


def _contiguous(t):
    return t if t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) else t.contiguous()


# `proj` below: a bf16 weight tensor [N, K], or a module `takes` accepts.

def norm_linear(x, delta, norm_weight, eps: float, proj, keep_sum: bool = True):
    """(sum, y): sum = x + delta (x when delta is None; None when keep_sum is False and there is a
    delta: not stored), y = proj(rms_normalize(sum) * norm_weight)."""
    x, delta, norm_weight = _contiguous(x), _contiguous(delta), _contiguous(norm_weight)
    y = x.new_empty(*x.shape[:-1], _out_features(proj))
    total = torch.empty_like(x) if delta is not None and keep_sum else None
    _launch(proj, x, delta, norm_weight, eps, ADD_NORM, y, total)
    return (x if delta is None else total), y


def silu_mul_linear(gate_up, proj):
    """proj(silu(gate) * up) for gate_up [..., 2I] = [gate | up]."""
    gate_up = _contiguous(gate_up)
    y = gate_up.new_empty(*gate_up.shape[:-1], _out_features(proj))
    _launch(proj, gate_up, None, None, 0.0, SILU_MUL, y, None)
    return y


def linear(x, proj):
    """proj(x) for one token row."""
    x = _contiguous(x)
    y = x.new_empty(*x.shape[:-1], _out_features(proj))
    _launch(proj, x, None, None, 0.0, PLAIN, y, None)
    return y


registry.register("gemv_m1", "cuda-sm90a", lambda: available() and torch.cuda.is_available())
registry.register("gemv_m1", "torch-linear+separate-ops", lambda: True)
