"""Greedy acceptance over a draft tree (lossless: the accepted tokens are the target's own argmax).

From the root, step to the child whose token is the target's argmax at the current node, while one
exists: the longest root-to-node path whose every token is the target's argmax at its parent (the
chain rule of engine/accept.py when the tree is a chain). The bonus is the target's argmax at the
path's last node.
"""
from __future__ import annotations

from .build import DraftTree


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
