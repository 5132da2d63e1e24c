"""Commit of a verified tree's accepted path into the target's caches.

Attention K/V: the path's node at depth d sits in scratch slot start + node (engine/tree/layout.py);
its K/V move to slot start + d, the slot a chain would have written (slot == position), so the next
step sees a plain sequence. Rejected nodes' slots lie past the committed length and are overwritten
later, as rejected chain slots are. Hybrid targets also take the path's last conv window and
recurrent state (HybridCache.commit_path).
"""
from __future__ import annotations

import torch


def commit_path(cache, layout, nodes: list) -> None:
    """nodes: the committed path (node indices, root first) of the tree forward `layout` just ran."""
    if nodes:
        device = layout.slots.device
        src = layout.start + torch.tensor(nodes, dtype=torch.long, device=device)
        dst = layout.start + torch.arange(len(nodes), device=device)
        if not torch.equal(src, dst):
            for k, v in zip(cache.k, cache.v):
                k.index_copy_(2, dst, k.index_select(2, src))      # gathered first: overlaps are safe
                v.index_copy_(2, dst, v.index_select(2, src))
    if getattr(cache, "commit_path", None) is not None:
        cache.commit_path(nodes)
