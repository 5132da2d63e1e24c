"""The workspace of the skinny GEMMs (torch.ops.specpilot.skinny_gemm and split12_skinny_gemm, one
contract: csrc/include/specpilot/skinny_gemm.h): an fp32 partials buffer for row blocks that CTAs
share, and a zeroed int32 counter per row block, which each launch leaves zero again; and `run`,
the one launch loop both ops go through (aligned rows, chunks of MAX_ROWS, this workspace).

One pair per device, sized for the largest weight shape seen (any row count), grown on demand
outside CUDA-graph capture (a zero fill captured into a graph would not run until its first replay)
and never freed (graphs captured earlier keep pointing at the old buffers). Kernels on one stream
only: two streams running skinny GEMMs at once would share the counters.
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext

MAX_ROWS = 16  # token rows per launch (kMaxM in csrc/include/specpilot/skinny_gemm.h)


@functools.lru_cache(maxsize=None)
def _size(n: int, k: int, ctas: int = 0) -> tuple:
    """(partial floats, counters) a launch over `ctas` CTAs (0: the planner's grid) for an N x K weight
    needs (any M): asked of the op once per shape and grid."""
    ops = _ext.ops()
    return ops.skinny_partials_count(ctas or ops.skinny_plan_ctas(n, k), n), ops.skinny_counter_count(n)


class _Workspace:
    """The partials and row-block counters of one device, grown on demand."""

    def __init__(self, device: torch.device):
        self.device = device
        self.partials = torch.empty(0, dtype=torch.float32, device=device)
        self.counters = torch.zeros(0, dtype=torch.int32, device=device)
        self._retired: list[torch.Tensor] = []          # kept alive for graphs captured earlier

    def buffers(self, n: int, k: int, ctas: int = 0):
        floats, counters = _size(n, k, ctas)
        if (self.partials.numel() < floats or self.counters.numel() < counters) and \
                torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"skinny GEMM: the workspace for a {n} x {k} weight must exist before CUDA-graph "
                               "capture; run the step once outside capture first (graphs.GraphedStep warms up)")
        if self.partials.numel() < floats:
            self._retired.append(self.partials)
            self.partials = torch.empty(floats, dtype=torch.float32, device=self.device)
        if self.counters.numel() < counters:
            self._retired.append(self.counters)
            self.counters = torch.zeros(counters, dtype=torch.int32, device=self.device)
        return self.partials, self.counters


_workspaces: dict[torch.device, _Workspace] = {}


def buffers(device: torch.device, n: int, k: int, ctas: int = 0):
    """(partials, counters) on `device` for a launch over an N x K weight on `ctas` CTAs (0: planned)."""
    ws = _workspaces.get(device) or _workspaces.setdefault(device, _Workspace(device))
    return ws.buffers(n, k, ctas)


def run(x: torch.Tensor, out: torch.Tensor, n: int, k: int, launch, ctas: int = 0) -> torch.Tensor:
    """out [M, N] = x [M, K] times an N x K weight through a skinny GEMM, in chunks of MAX_ROWS rows:
    launch(x rows, out rows, partials, counters) runs one on `ctas` CTAs (0: the planner's grid; the
    workspace is sized for it). TMA wants contiguous, 16-byte aligned
    rows: x is copied when it is not (a contiguous view at an odd offset too)."""
    if not (x.is_contiguous() and x.data_ptr() % 16 == 0):
        x = x.clone(memory_format=torch.contiguous_format)
    if not (out.is_contiguous() and out.data_ptr() % 16 == 0):
        raise ValueError(f"skinny GEMM: out must be contiguous and 16-byte aligned, got strides {out.stride()}")
    partials, counters = buffers(x.device, n, k, ctas)
    for i in range(0, x.shape[0], MAX_ROWS):
        launch(x[i:i + MAX_ROWS], out[i:i + MAX_ROWS], partials, counters)
    return out
