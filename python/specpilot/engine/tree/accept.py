"""Greedy acceptance over a draft tree (lossless: the accepted tokens are the target's own argmax).

From the root, step to the child whose token is the target's argmax at the current node, while one
exists: the longest root-to-node path whose every token is the target's argmax at its parent (the
chain rule of engine/accept.py when the tree is a chain). The bonus is the target's argmax at the
path's last node. accepted_on_device is the same rule as tensor ops (no host sync, static shapes).
"""
from __future__ import annotations

import torch

from .build import DraftTree, TreeTensors


def accepted_path(tree: DraftTree, posterior: list) -> tuple:
    """posterior [N]: the target's argmax at each node -> (path: node indices from the root, bonus token)."""
    if len(posterior) != len(tree):
        raise ValueError(f"posterior has {len(posterior)} rows for a tree of {len(tree)} nodes")
    children = tree.children()
    path = [0]
    while True:
        want = posterior[path[-1]]
        nxt = next((c for c in children[path[-1]] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)


def accepted_on_device(tree: TreeTensors, argmax: torch.Tensor) -> torch.Tensor:
    """argmax [N] (the target's argmax at each node, on the tree's device) -> int64 [2 + W]: the
    accepted drafts a, the bonus token, then the accepted path's nodes, root first (W = tree.path's
    width; past the path: N). A node is on the path when every node of its root path carries the
    target's argmax at its parent; siblings carry distinct tokens, so those nodes form one path, and
    its end is the deepest of them."""
    n = len(tree)
    if argmax.shape != (n,):
        raise ValueError(f"argmax has shape {tuple(argmax.shape)} for a tree of {n} nodes")
    match = torch.cat([torch.ones(1, dtype=torch.bool, device=argmax.device),
                       tree.tokens[1:] == argmax[tree.parents[1:]],
                       torch.ones(1, dtype=torch.bool, device=argmax.device)])     # [N + 1]: the padding matches
    on_path = match[tree.path].all(dim=1)
    end = torch.where(on_path, tree.depth, -1).argmax().view(1)     # index_select: a 0-dim index would sync
    return torch.cat([tree.depth.index_select(0, end), argmax.index_select(0, end), tree.path.index_select(0, end)[0]])


def read_step(read: torch.Tensor, n: int) -> tuple:
    """A tree step's read (graphs.tree_step: accepted_on_device's output, then the tree's tokens,
    parents and depths), copied to the host once -> (path, bonus, the DraftTree)."""
    flat = read.tolist()
    width = len(flat) - 2 - 3 * n
    accepted, bonus = flat[0], flat[1]
    tree = DraftTree(*(flat[2 + width + k * n:2 + width + (k + 1) * n] for k in range(3)))
    return flat[2:3 + accepted], bonus, tree
