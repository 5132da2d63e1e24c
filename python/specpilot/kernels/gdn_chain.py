"""The Gated DeltaNet chain op (torch.ops.specpilot.gdn_chain, CUDA builds; kernel
csrc/cuda/gdn_chain.cu): the gated delta rule over a block of T tokens from the committed state,
writing the state after every token, in one launch per layer instead of ~8 torch kernels per token.

`gdn_chain(mixed, nk, dk, g, beta, state, states_out=None)`: mixed [T, 2 nk dk + hv dv] bf16 (the conv
output: q and k per key head, then v), g [T, hv] fp32 (log decay), beta [T, hv] fp32, state [hv, dk, dv]
fp32 -> (out [T, hv, dv] bf16, states [T, hv, dk, dv] fp32: states_out when given). It takes calls with
batch 1, bf16 CUDA tensors, dk in {64, 128}, dv a multiple of 32, while EngineConfig.fused_kernels is
on; otherwise models/gdn.py's torch reference runs (`takes` says which).

Exactness: the reference's arithmetic in fp32 throughout (q and k L2-normalised in fp32, as fla's
kernels do, where transformers' torch path normalises in the model dtype), only the summation order
differs, then one bf16 rounding of the output (tests/test_gdn_gpu.py). bf16 engines are judged by the
referee rule (`specpilot verify`), not by bit identity with the reference.
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext, config

KEY_HEAD_DIMS = (64, 128)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    return _ext.has_cuda_op("gdn_chain")


def takes(mixed: torch.Tensor, dk: int, dv: int) -> bool:
    """Whether the kernel runs this layer's block (mixed [B, T, C] from the conv)."""
    return (mixed.is_cuda and mixed.dtype == torch.bfloat16 and mixed.shape[0] == 1 and dk in KEY_HEAD_DIMS
            and dv % 32 == 0 and config.current().fused_kernels and available())


def gdn_chain(mixed, nk: int, dk: int, g, beta, state, states_out=None):
    """states_out: a contiguous fp32 [T, hv, dk, dv] tensor the per-token states are written into
    (else a new one; the op checks it)."""
    t, hv, dv = mixed.shape[0], state.shape[0], state.shape[2]
    states = torch.empty(t, hv, dk, dv, dtype=torch.float32, device=mixed.device) if states_out is None \
        else states_out
    out = torch.empty(t, hv, dv, dtype=torch.bfloat16, device=mixed.device)
    _ext.ops().gdn_chain(mixed, nk, dk, g.contiguous(), beta.contiguous(), state.contiguous(), states, out)
    return out, states
