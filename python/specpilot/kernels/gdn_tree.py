"""The Gated DeltaNet tree ops (torch.ops.specpilot.gdn_tree / gdn_tree_conv, CUDA builds; kernels
csrc/cuda/gdn_chain.cu and csrc/cuda/gdn_tree_conv.cu): a GDN layer's forward over a draft tree
(engine/tree/layout.py) in two launches, where models/gdn_tree.py (the torch reference, and the CPU
path) runs a conv over gathered windows and the recurrence node by node.

`tree_conv(qkv, conv_state, weight, window_index)`: qkv [N, C] bf16 (the nodes' conv inputs, unit
channel stride), conv_state [C, K-1] bf16, weight [C, K] bf16, window_index [N, K] (TreeLayout.
conv_window_index) -> (mixed [N, C] bf16: conv + SiLU, windows [C, N, K] bf16: node i's window, a
view of an [N, K, C] tensor; the reference's windows[0]).

`tree_recurrence(mixed, nk, dk, g, beta, state, parents)`: as kernels/gdn_chain.gdn_chain over the N
nodes, node i starting from the state after parents[i] (TreeLayout.parents, -1: the committed state)
-> (out [N, hv, dv] bf16, states [N, hv, dk, dv] fp32: the state after each node; written into
`states_out` when given, as gdn_chain's).

Both take calls with batch 1, bf16 CUDA tensors, 1..64 nodes, a conv width of 2..8, dk in {64, 128},
dv a multiple of 32, while EngineConfig.fused_kernels is on (`takes` says which).

Exactness. Conv: each node's window is gathered exactly; the K products are summed in fp32, rounded
to bf16, SiLU'd in fp32, rounded to bf16 (the bf16 torch conv1d then silu): only the summation order
differs, so mixed is within one bf16 rounding of the reference's. Recurrence: the chain kernel's
arithmetic (fp32 state, one bf16 rounding of the output); on a chain-shaped tree it runs the very same
instructions, so it equals gdn_chain bit for bit (tests/test_gdn_tree_gpu.py).
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext, config

from .gdn_chain import KEY_HEAD_DIMS

MAX_NODES = 64          # kMaxTreeNodes in specpilot/gdn_tree.h
CONV_WIDTHS = range(2, 9)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    return _ext.has_cuda_op("gdn_tree") and _ext.has_cuda_op("gdn_tree_conv")


def takes(qkv: torch.Tensor, conv_weight: torch.Tensor, dk: int, dv: int) -> bool:
    """Whether the kernels run this GDN layer's tree forward (qkv [B, N, C]: the nodes' conv inputs)."""
    return (qkv.is_cuda and qkv.dtype == torch.bfloat16 and conv_weight.dtype == torch.bfloat16
            and qkv.dim() == 3 and qkv.shape[0] == 1 and 1 <= qkv.shape[1] <= MAX_NODES
            and conv_weight.dim() == 2 and conv_weight.shape[1] in CONV_WIDTHS
            and dk in KEY_HEAD_DIMS and dv % 32 == 0 and config.current().fused_kernels and available())


def tree_conv(qkv, conv_state, weight, window_index):
    n, c = qkv.shape
    width = weight.shape[1]
    windows = torch.empty(n, width, c, dtype=qkv.dtype, device=qkv.device)
    mixed = torch.empty(n, c, dtype=qkv.dtype, device=qkv.device)
    _ext.ops().gdn_tree_conv(qkv, conv_state.contiguous(), weight.contiguous(), window_index.contiguous(),
                             windows, mixed)
    return mixed, windows.permute(2, 0, 1)


def tree_recurrence(mixed, nk: int, dk: int, g, beta, state, parents, states_out=None):
    n, hv, dv = mixed.shape[0], state.shape[0], state.shape[2]
    states = torch.empty(n, hv, dk, dv, dtype=torch.float32, device=mixed.device) if states_out is None \
        else states_out
    out = torch.empty(n, hv, dv, dtype=torch.bfloat16, device=mixed.device)
    _ext.ops().gdn_tree(mixed, nk, dk, g.contiguous(), beta.contiguous(), state.contiguous(), parents.contiguous(),
                        states, out)
    return out, states
