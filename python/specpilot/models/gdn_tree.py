"""Gated DeltaNet over a draft tree (engine/tree/layout.py), in plain torch: the torch reference of
SGLang's tree conv and parent-indexed recurrence.

Each node continues its parent's sequence, not the previous node's: its short conv reads the K - 1
inputs of its ancestor path (above the root: the committed conv state), and its recurrence starts
from its parent's state after the parent (the root: the committed state). Along any root-to-node path
this is the chain recurrence over that path, step for step, so the accepted path's states are the
ones AR decoding reaches.
"""
from __future__ import annotations

import torch

from . import gdn


def tree_conv(qkv: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, window_index: torch.Tensor):
    """qkv [B, N, C] (the nodes' conv inputs), conv_state [B, C, K-1], weight [C, K], window_index [N, K]
    (TreeLayout.conv_window_index) -> (conv + SiLU outputs [B, N, C], windows [B, C, N, K]: node i's
    window, whose last K - 1 columns are the conv state after it)."""
    b, n, c = qkv.shape
    extended = torch.cat([conv_state, qkv.transpose(1, 2)], dim=-1)       # [B, C, K-1+N]
    windows = extended[:, :, window_index]                                  # [B, C, N, K]
    per_node = windows.permute(0, 2, 1, 3).reshape(b * n, c, -1)           # one length-K window per node
    out = gdn.causal_conv(per_node, weight)                                 # [B*N, C, 1]
    return out.reshape(b, n, c), windows


def tree_gated_delta_rule(q, k, v, g, beta, state, layout, states_out=None):
    """q, k [B, N, H, Dk], v [B, N, H, Dv], g, beta [B, N, H] of the tree's nodes (as
    gdn.recurrent_gated_delta_rule's), state [B, H, Dk, Dv] (committed), layout: TreeInputs (its
    device `parents`) -> (out [B, N, H, Dv], states [B, N, H, Dk, Dv] fp32: the state after each node;
    written into states_out when given). Node by node, each one token of the chain recurrence from
    its parent's state: the same operations as AR decoding's steps, and shapes that depend on N
    alone (a CUDA graph of the tree forward replays it for any tree of N nodes)."""
    b, n, h, dk = k.shape
    dv = v.shape[-1]
    out = torch.empty(b, n, h, dv, dtype=v.dtype, device=v.device)
    states = gdn._states_buffer(states_out, (b, n, h, dk, dv), v.device)
    committed = state.float()
    for i in range(n):
        parent = layout.parents[i:i + 1]                                    # [1] on the device: no sync
        from_parent = states.index_select(1, parent.clamp(min=0))[:, 0]    # [B, H, Dk, Dv]
        initial = torch.where(parent < 0, committed, from_parent)           # the root: the committed state
        node = slice(i, i + 1)
        o, final, _ = gdn.recurrent_gated_delta_rule(q[:, node], k[:, node], v[:, node], g[:, node],
                                                     beta[:, node], initial)
        out[:, i] = o[:, 0]
        states[:, i] = final
    return out, states
