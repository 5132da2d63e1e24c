"""The linear family's dispatch: which kernel a model's bf16 nn.Linear runs, by the token rows.

  rows 2..16 (verify blocks, drafts)  `linear(proj, x)` / `matmul(x, w)`: our skinny tensor-core
      GEMM (torch.ops.specpilot.skinny_gemm, csrc/cuda/skinny_gemm.cu: TMA + wgmma) where
      `skinny_takes` says yes, else the reference, proj's own forward / F.linear (cuBLAS).
      EngineConfig.skinny_gemm (default on): Qwen3-8B verify step 4.74 ms vs 5.10 with cuBLAS,
      draft 1.14 vs 1.17 (H200). Launched with PDL: after our PDL elementwise kernels it streams
      its first weights while they run.
  one row (the AR step)  the one-token GEMV with the elementwise work before it fused in
      (torch.ops.specpilot.gemv_m1, csrc/cuda/gemv_m1.cu), where `gemv_takes` says yes:
        norm_gemv(x, delta, norm_w, eps, w) -> (x + delta, W @ RMSNorm(x + delta))  add_rms_norm + linear
        silu_mul_gemv(gate_up, w)           -> W @ (silu(gate) * up)                silu_mul + linear
        gemv(x, w)                          -> W @ x
      so a decoder layer's T = 1 step runs 4 GEMV kernels, qk_norm_rope_cache and attention instead
      of those plus two add_rms_norm and one silu_mul kernels, each GEMV with PDL
      (EngineConfig.gemv_pdl). EngineConfig.fused_gemv (default on): AR step 4.49 vs 5.25 ms with
      cuBLAS and the separate kernels (Qwen3-8B shape, H200). The reference: the separate ops of
      ops/norm_rope.py, then proj(x). split12 weights keep split12_linear after the separate norm /
      gate kernels (a fused split12 GEMV measured slower: docs/design.md, "What lost").
  more rows (prefill)  proj's own forward.
Both kernels take only plain bias-free nn.Linear (or bare bf16 weights) whose CUDA bf16 weight they
read (K % 8 == 0, 16-byte aligned), and neither runs while EngineConfig.fused_kernels is off (their
prologues / PDL chain are the fused kernels'). split12 weights choose their kernel by rows in
engine/linear_kernels.py (Split12Linear's `kernel`).

Exactness: both sum in fp32 in one fixed order per weight shape (never dependent on the row count
or on timing), so results differ from cuBLAS by summation rounding only; bf16 engines are held to
token forcing against stock. The GEMV's prologue output is bit-identical to add_rms_norm /
silu_mul's CUDA kernels (same arithmetic, same summation order).
Workspace of the skinny GEMM: kernels/skinny_workspace.py (per device, grown outside capture).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from specpilot import _ext, config
from specpilot.kernels import registry, skinny_workspace

from .norm_rope import fused_kernels_enabled

SKINNY_MAX_ROWS = skinny_workspace.MAX_ROWS
GEMV_PLAIN, GEMV_ADD_NORM, GEMV_SILU_MUL = 0, 1, 2    # csrc/include/specpilot/gemv_m1.h GemvPrologue
GEMV_MAX_K = 16384                                      # kMaxK
GEMV_MAX_NORM_HIDDEN = 4096                             # kMaxNormHidden


def _bf16_weight_ok(w: torch.Tensor, max_k: int | None = None) -> bool:
    """A weight [N, K] our kernels read: CUDA bf16, contiguous, 16-byte aligned, K % 8 == 0 (<= max_k)."""
    return (w.dim() == 2 and w.is_cuda and w.dtype == torch.bfloat16 and w.is_contiguous()
            and w.shape[1] % 8 == 0 and (max_k is None or w.shape[1] <= max_k) and w.data_ptr() % 16 == 0)


def _plain(m) -> bool:
    return type(m) is nn.Linear and m.bias is None


# -- 2..16 rows: the skinny GEMM ---------------------------------------------------------------------
def skinny_enabled() -> bool:
    return config.current().skinny_gemm


@functools.lru_cache(maxsize=None)
def skinny_available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not)."""
    return _ext.has_cuda_op("skinny_gemm")


def skinny_takes_weight(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x [..., K] (2..SKINNY_MAX_ROWS rows) times the weight w [N, K] runs through the skinny GEMM."""
    if not (skinny_enabled() and fused_kernels_enabled()) or torch.compiler.is_compiling():
        return False
    if not (x.is_cuda and x.dtype == torch.bfloat16 and 2 <= x.numel() // max(x.shape[-1], 1) <= SKINNY_MAX_ROWS):
        return False
    return _bf16_weight_ok(w) and skinny_available()


def skinny_takes(x: torch.Tensor, *linears) -> bool:
    """Whether x runs through the skinny GEMM for these linears (plain bias-free nn.Linear)."""
    return all(_plain(m) and skinny_takes_weight(x, m.weight) for m in linears)


def _skinny(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through the kernel (the caller checked skinny_takes_weight)."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    y = x.new_empty(rows.shape[0], n)
    skinny_workspace.run(rows, y, n, k, lambda xs, ys, partials, counters: _ext.ops().skinny_gemm(
        weight, xs, 0, True, ys, partials, counters))
    return y.view(*x.shape[:-1], n)


def linear(proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """proj(x), through the skinny GEMM when `skinny_takes(x, proj)`."""
    return _skinny(proj.weight, x) if skinny_takes(x, proj) else proj(x)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T, through the skinny GEMM when `skinny_takes_weight(x, w)` (else torch)."""
    return _skinny(w, x) if skinny_takes_weight(x, w) else torch.nn.functional.linear(x, w)


# -- one row: the fused one-token GEMV ---------------------------------------------------------------
def gemv_enabled() -> bool:
    return config.current().fused_gemv


@functools.lru_cache(maxsize=None)
def gemv_available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not)."""
    return _ext.has_cuda_op("gemv_m1")


def gemv_weight_ok(w: torch.Tensor) -> bool:
    """A weight [N, K] the GEMV reads: CUDA bf16, contiguous, 16-byte aligned, K % 8 == 0, K <= GEMV_MAX_K."""
    return _bf16_weight_ok(w, GEMV_MAX_K)


def gemv_takes(x: torch.Tensor, *linears, norm_hidden: int | None = None) -> bool:
    """Whether the fused GEMVs run for input x [..., H] (one token row) through these linears."""
    if not (gemv_enabled() and fused_kernels_enabled()) or torch.compiler.is_compiling():
        return False                     # its prologues are the fused kernels' arithmetic: off with them
    if not (x.is_cuda and x.dtype == torch.bfloat16 and x.numel() == x.shape[-1]):
        return False
    if norm_hidden is not None and norm_hidden > GEMV_MAX_NORM_HIDDEN:
        return False
    return all(_plain(m) and gemv_weight_ok(m.weight) for m in linears) and gemv_available()


def _launch_gemv(proj, x, delta, norm_weight, eps: float, prologue: int, y, total) -> None:
    """One GEMV launch: `proj` is a bf16 weight tensor or an nn.Linear."""
    weight = proj.weight if isinstance(proj, nn.Module) else proj
    _ext.ops().gemv_m1(weight, x, delta, norm_weight, eps, prologue, config.current().gemv_pdl, y, total)


def _out_features(proj) -> int:
    return proj.out_features if isinstance(proj, nn.Module) else proj.shape[0]


def _contiguous(t):
    return t if t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) else t.contiguous()


# `proj` below: a bf16 weight tensor [N, K], or a module `gemv_takes` accepts.

def norm_gemv(x, delta, norm_weight, eps: float, proj, keep_sum: bool = True):
    """(sum, y): sum = x + delta (x when delta is None; None when keep_sum is False and there is a
    delta: not stored), y = proj(rms_normalize(sum) * norm_weight)."""
    x, delta, norm_weight = _contiguous(x), _contiguous(delta), _contiguous(norm_weight)
    y = x.new_empty(*x.shape[:-1], _out_features(proj))
    total = torch.empty_like(x) if delta is not None and keep_sum else None
    _launch_gemv(proj, x, delta, norm_weight, eps, GEMV_ADD_NORM, y, total)
    return (x if delta is None else total), y


def silu_mul_gemv(gate_up, proj):
    """proj(silu(gate) * up) for gate_up [..., 2I] = [gate | up]."""
    gate_up = _contiguous(gate_up)
    y = gate_up.new_empty(*gate_up.shape[:-1], _out_features(proj))
    _launch_gemv(proj, gate_up, None, None, 0.0, GEMV_SILU_MUL, y, None)
    return y


def gemv(x, proj):
    """proj(x) for one token row."""
    x = _contiguous(x)
    y = x.new_empty(*x.shape[:-1], _out_features(proj))
    _launch_gemv(proj, x, None, None, 0.0, GEMV_PLAIN, y, None)
    return y


registry.register("skinny_gemm", "cuda-sm90a", lambda: skinny_available() and torch.cuda.is_available())
registry.register("skinny_gemm", "torch-linear", lambda: True)
registry.register("gemv_m1", "cuda-sm90a", lambda: gemv_available() and torch.cuda.is_available())
registry.register("gemv_m1", "torch-linear+separate-ops", lambda: True)
