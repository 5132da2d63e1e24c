"""The linears of steps with a few token rows (verify blocks, drafts: 2..16 rows) through our skinny
tensor-core GEMM (torch.ops.specpilot.skinny_gemm, csrc/cuda/skinny_gemm.cu: TMA + wgmma) instead of
cuBLAS: `linear(proj, x)` is proj(x): through the kernel when `takes` says yes, else proj's own
forward. On by default (EngineConfig.skinny_gemm): on the
H200 the Qwen3-8B verify step takes 4.74 ms with it against 5.10 ms with cuBLAS, the draft step
1.14 vs 1.17 (docs/PERF_NOTES.md, seventh session). Launched with PDL: after our PDL elementwise
kernels it streams its first weights while they run. Used for the target's QKV, O, gate_up, down
and LM head, and the drafter's q, kv, o and logits. `matmul(x, w)` is the same for a bare weight.
`takes` says no when EngineConfig.skinny_gemm or .fused_kernels is off, the rows are not 2..MAX_ROWS of
CUDA bf16, or the linear is not a plain bias-free nn.Linear whose bf16 weight the kernel reads
(K % 8 == 0, 16-byte aligned). One token row stays with gemv_fusion / cuBLAS.

Exactness: fp32 accumulation in one fixed order per weight shape (never dependent on the row count
or on timing: K segments are summed in K order), so results differ from cuBLAS by summation
rounding only; bf16 engines are held to token forcing against stock.

Workspace: kernels/skinny_workspace.py (per device, grown outside capture; one stream only).
split12 weights use the same kernel family through Split12Linear's kernel="skinny".
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from specpilot import _ext, config
from specpilot.kernels import registry, skinny_workspace

from . import fused_ops

MAX_ROWS = skinny_workspace.MAX_ROWS

def enabled() -> bool:
    return config.current().skinny_gemm


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not)."""
    return _ext.has_cuda_op("skinny_gemm")


def weight_ok(w: torch.Tensor) -> bool:
    """A weight [N, K] the kernel reads: CUDA bf16, contiguous, 16-byte aligned, K % 8 == 0."""
    return (w.dim() == 2 and w.is_cuda and w.dtype == torch.bfloat16 and w.is_contiguous()
            and w.shape[1] % 8 == 0 and w.data_ptr() % 16 == 0)


def takes_weight(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x [..., K] (2..MAX_ROWS rows) times the weight w [N, K] runs through the skinny GEMM."""
    if not (enabled() and fused_ops.fused_kernels_enabled()) or torch.compiler.is_compiling():
        return False
    if not (x.is_cuda and x.dtype == torch.bfloat16 and 2 <= x.numel() // max(x.shape[-1], 1) <= MAX_ROWS):
        return False
    return weight_ok(w) and available()


def takes(x: torch.Tensor, *linears) -> bool:
    """Whether x runs through the skinny GEMM for these linears (plain bias-free nn.Linear)."""
    return all(type(m) is nn.Linear and m.bias is None and takes_weight(x, m.weight) for m in linears)


def _run(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through the kernel (the caller checked takes_weight)."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    y = x.new_empty(rows.shape[0], n)
    skinny_workspace.run(rows, y, n, k, lambda xs, ys, partials, counters: _ext.ops().skinny_gemm(
        weight, xs, 0, True, ys, partials, counters))
    return y.view(*x.shape[:-1], n)


def linear(proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """proj(x), through the skinny GEMM when `takes(x, proj)`."""
    return _run(proj.weight, x) if takes(x, proj) else proj(x)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T, through the skinny GEMM when `takes_weight(x, w)` (else torch)."""
    return _run(w, x) if takes_weight(x, w) else torch.nn.functional.linear(x, w)


registry.register("skinny_gemm", "cuda-sm90a", lambda: available() and torch.cuda.is_available())
registry.register("skinny_gemm", "torch-linear", lambda: True)
