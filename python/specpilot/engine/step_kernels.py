"""The greedy DFlash step's bookkeeping between the drafter's and the target's GEMMs (fused_steps.py):
the draft argmax into the verify block, then the verify argmax, the accepted count, the packed
output and the next step's control.

On CUDA with bf16 logits these run as two kernels (csrc/cuda/spec_step.cu: a CTA per row for the
argmax, the bookkeeping in the last CTA), in place of ~25 small torch kernels that each cost a
launch inside the step's graph. Elsewhere (CPU, fp32, a build without the op, or
EngineConfig.step_kernels False) the torch reference below runs. Both write the same integers: argmax is
torch.argmax's (first index of the largest value), the rest is integer arithmetic.

Control layout: CONTROL below (csrc/include/specpilot/spec_step.h mirrors it).
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext

from . import accept

# The spec step's control scalars, in buffer order (int64 on the device). accept_block rewrites the
# first five for the following step and bumps `step`.
CONTROL = ("start", "ctx_start", "ctx_count", "vs", "anchor", "replay", "max_length", "step")
START, CTX_START, CTX_COUNT, VS, ANCHOR, REPLAY, MAX_LENGTH, STEP = range(len(CONTROL))

@functools.lru_cache(maxsize=None)
def available() -> bool:
    return _ext.has_cuda_op("spec_accept_block")


def _use_kernels(logits: torch.Tensor, kernels: bool) -> bool:
    return kernels and logits.is_cuda and logits.dtype == torch.bfloat16 and logits.is_contiguous() and available()


def pick_drafts(logits, control, replay_drafts, block, kernels: bool = True) -> None:
    """logits [B-1, V] (the draft's) -> block [B] = [anchor, drafts]: each row's argmax, or under
    replay (control "replay" > 0) row `step` of replay_drafts [steps, B-1]. kernels: the CUDA kernel
    where it applies (EngineConfig.step_kernels), else the torch reference."""
    if _use_kernels(logits, kernels):
        _ext.ops().spec_pick_drafts(logits, control, replay_drafts, block)
        return
    anchor, replay, step = (control[i:i + 1] for i in (ANCHOR, REPLAY, STEP))
    drafts = torch.where(replay > 0, replay_drafts[step][0], torch.argmax(logits, dim=-1))
    block.copy_(torch.cat([anchor, drafts]))


def accept_block(logits, block, replay_accepted, control, posterior, out, counter, kernels: bool = True) -> None:
    """logits [B, V] (the verify's) of block [B] -> posterior [B] (row argmaxes), out [2 + 2B] =
    [matched, block, posterior, start], and control advanced to the next step by the rule of
    accept.py (replay: the planned count replay_accepted[step]); a stop token is the host's to see.
    counter: int32 [1], zero, used by the kernel only. kernels: as pick_drafts'."""
    if _use_kernels(logits, kernels):
        _ext.ops().spec_accept_block(logits, block, replay_accepted, control, posterior, out, counter)
        return
    start, vs, replay, max_length, step = (control[i:i + 1] for i in (START, VS, REPLAY, MAX_LENGTH, STEP))
    posterior.copy_(torch.argmax(logits, dim=-1))
    matched = accept.accepted_prefix(block[1:], posterior, vs - 1)[None]     # [1]
    acc = torch.where(replay > 0, replay_accepted[step], matched)
    produced = accept.produced_count(acc, max_length - start - 1)            # >= 1 when launched
    last = accept.last_committed(block, posterior, acc, produced)
    after = start + produced
    out.copy_(torch.cat([matched, block, posterior, start]))
    next_vs = (max_length - after).clamp(max=block.shape[0])
    control[START:ANCHOR + 1].copy_(torch.cat([after, start, produced, next_vs, last]))
    control[STEP:STEP + 1].add_(1)
