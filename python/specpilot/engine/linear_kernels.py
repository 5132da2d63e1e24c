"""Which kernel the split12 / bf16-twin linears use for a call, by the number of token rows.

Split12Linear and Bf16Linear (formats/split12/linear.py) read their `kernel` attribute at call
time: "simt" (CUDA-core GEMV, fastest at M = 1), "skinny" (TMA + wgmma skinny GEMM, 2..16 rows,
while the skinny GEMM is on: ops/linear.py), "tc" (mma.sync tensor cores, 2..16 rows
when the skinny GEMM cannot run; the simt kernel is ~5x slower than torch at M = 16) or "dense"
(more rows, i.e. prefill: decode the weight, then cuBLAS). The engine sets it around each step, so
a CUDA graph bakes in the right one. Exactness: Split12Linear and its Bf16Linear twin stay
bit-identical under every kernel; the kernels differ from each other by fp32 summation order only
(see formats/split12/ops.py). "dense" is also what a bf16 model's nn.Linear runs for prefill rows
(F.linear), and "skinny" its skinny GEMM (ops/linear.py) on the same grid wherever the split12
pair keeps the planner's grid, so there a split12 engine's prefill and verify steps give the bf16
engine's bits. The pair's decode-bound grid (ops.skinny_pair_ctas: the 8B O projection cut in two K
pieces) and the one-token GEMV (split12 lane tree vs the fused bf16 GEMV) differ from it by fp32 order.
"""
from __future__ import annotations

import contextlib

from specpilot.formats.split12.ops import KERNELS
from specpilot.ops import linear as ops_linear


def switchable_linears(models):
    """Modules with a settable split12 `kernel` attribute, in the given models (None skipped)."""
    seen, out = set(), []
    for model in models:
        if model is None:
            continue
        for m in model.modules():
            if getattr(m, "kernel", None) in KERNELS and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


@contextlib.contextmanager
def linear_kernel_for_rows(mods, rows: int):
    """Within the block, the given switchable linears (cuda_switchable) use "simt" for rows == 1,
    "skinny" for 2..16 rows where it can run ("tc" where not), and "dense" for more rows."""
    if not mods:
        yield
        return
    saved = [m.kernel for m in mods]
    for m in mods:
        m.kernel = kernel_for(m, rows)
    try:
        yield
    finally:
        for m, k in zip(mods, saved):
            m.kernel = k


def kernel_for(module, rows: int) -> str:
    """The kernel a switchable linear uses for `rows` token rows."""
    return kernel_for_shape(rows, module.in_features)


def kernel_for_shape(rows: int, in_features: int) -> str:
    """The kernel for `rows` token rows times a weight with `in_features` columns (the cost model
    times the same choice)."""
    if rows == 1:
        return "simt"
    if rows > ops_linear.SKINNY_MAX_ROWS:
        return "dense"
    skinny = ops_linear.skinny_enabled() and ops_linear.skinny_available() and in_features % 8 == 0
    return "skinny" if skinny else "tc"


def cuda_switchable(models):
    """switchable_linears living on CUDA (the tc kernel is CUDA-only; CPU keeps its kernel)."""
    return [m for m in switchable_linears(models) if _on_cuda(m)]


def _on_cuda(module) -> bool:
    t = next(iter(module.buffers()), None)
    return t is not None and t.device.type == "cuda"
