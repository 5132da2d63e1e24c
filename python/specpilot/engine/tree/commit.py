"""Commit of a verified tree's accepted path into the target's caches.

Attention K/V: the path's node at depth d sits in scratch slot start + node (engine/tree/layout.py);
its K/V move to slot start + d, the slot a chain would have written (slot == position), so the next
step sees a plain sequence. Rejected nodes' slots lie past the committed length and are overwritten
later, as rejected chain slots are. Hybrid targets also take the path's last conv window and
recurrent state (HybridCache.commit_path).

The K/V move always has N rows (depth d < len(path) takes its node's slot, every other row copies a
slot onto itself), so its shapes depend on N alone and engine/tree/graphs.py can graph it.
"""
from __future__ import annotations

import torch


def kv_moves(layout, nodes: list) -> torch.Tensor:
    """int64 [2N] on the layout's device: the source slots, then the destination slots start..start+N-1."""
    n, start = layout.size, layout.start
    src = [start + (nodes[d] if d < len(nodes) else d) for d in range(n)]
    return torch.tensor(src + list(range(start, start + n)), dtype=torch.long).to(layout.device)


def move_kv(cache, moves: torch.Tensor) -> None:
    """Every attention layer's K/V: slot moves[N + r] takes slot moves[r]'s (r < N), all layers at once
    (KVCache's stacked tensors: four kernels, where a loop over layers launched four per layer)."""
    n = moves.numel() // 2
    src, dst = moves[:n], moves[n:]
    for stacked in (cache.k_layers, cache.v_layers):           # [L, B, H, S, D]
        stacked.index_copy_(3, dst, stacked.index_select(3, src))   # gathered first: overlaps are safe


def commit_path(cache, layout, nodes: list, move=move_kv) -> None:
    """nodes: the committed path (node indices, root first) of the tree forward `layout` just ran;
    move: move_kv or its graph (engine/tree/graphs.py: kv_mover). The hybrid state first: it reads the
    tree forward's records, which may be a graph's outputs, valid only until another graph replays."""
    if getattr(cache, "commit_path", None) is not None:
        cache.commit_path(nodes)
    if nodes:
        move(cache, kv_moves(layout, nodes))
