"""The draft-tree build op (torch.ops.specpilot.grow_tree, CUDA builds; kernel csrc/cuda/tree_build.cu):
engine/tree/build.py grow_tree and engine/tree/layout.py pack_tensors in one launch, after the same
log_softmax + topk. The torch pair is ~300 small kernels (a sort, gathers and cats per depth): about
1 ms of a graphed tree step at the Qwen3-8B shape (docs/trees.md). Same nodes, same order, same packed
ints (tests/test_tree_build_gpu.py); a NaN log-prob counts as -inf (specpilot/tree_build.h).

`grow_packed(draft_logits [D, V], meta int64 [3] (anchor token, anchor position, depths drafted),
budget, nodes)` -> int64 [4n + n*n + n + n*(D + 1)]: TreeInputs' packed, then the tree's depth and
root paths (layout.grown_and_packed splits it). Taken on CUDA while EngineConfig.fused_kernels is on,
for budgets 2..256 and 1..64 depths (`takes`).
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext, config

MAX_BUDGET = 256        # kMaxBudget in specpilot/tree_build.h
MAX_ROWS = 64           # kMaxRows


@functools.lru_cache(maxsize=None)
def available() -> bool:
    return _ext.has_cuda_op("grow_tree")


def takes(draft_logits: torch.Tensor, budget: int, nodes: int) -> bool:
    return (draft_logits.is_cuda and draft_logits.dim() == 2 and 1 <= draft_logits.shape[0] <= MAX_ROWS
            and 2 <= nodes <= budget <= MAX_BUDGET and config.current().fused_kernels and available())


def grow_packed(draft_logits: torch.Tensor, meta: torch.Tensor, budget: int, nodes: int) -> torch.Tensor:
    rows, vocab = draft_logits.shape
    logp, ids = torch.log_softmax(draft_logits.float(), dim=-1).topk(min(budget - 1, vocab), dim=-1)
    out = torch.empty(5 * nodes + nodes * nodes + nodes * (rows + 1), dtype=torch.long, device=draft_logits.device)
    _ext.ops().grow_tree(logp, ids, meta[2:3], meta[0:1], meta[1:2], budget, nodes, out)
    return out
