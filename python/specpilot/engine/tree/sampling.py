"""Acceptance over a draft tree at temperature > 0: recursive rejection sampling over each node's
children, which keeps the target's distribution exactly.

The tree's candidates are chosen deterministically (top ranks of the draft distributions), so each
child is a proposal that puts all its mass on its token x. Rejection sampling of such a proposal
against the target's p accepts x with probability p(x); on rejection the residual is
norm(max(p - 1[x], 0)) = p with x removed, renormalised. Trying the children one after the other
against the running residual therefore emits x_1 with probability p(x_1), x_2 with
(1 - p(x_1)) p(x_2) / (1 - p(x_1)) = p(x_2), ... and, when every child is rejected, a token drawn
from the final residual, i.e. with probability p(y) for every other y: the emitted token has law p
exactly (SpecInfer's multi-candidate rule with one-hot proposals). An accepted child continues
with its own target distribution, so every emitted token follows the target's law given the ones
before it.
"""
from __future__ import annotations

import torch

from .build import DraftTree


def sampled_path(tree: DraftTree, target_probs: torch.Tensor, generator=None) -> tuple:
    """target_probs [N, V] (the target's sampling distribution after each node) -> (path: node
    indices from the root, the next token: drawn from the residual at the path's last node)."""
    if target_probs.shape[0] != len(tree):
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows for a tree of {len(tree)} nodes")
    children = tree.children()
    path = [0]
    while True:
        node = path[-1]
        residual = target_probs[node].clone()
        accepted = None
        for child in children[node]:
            x = tree.tokens[child]
            u = torch.rand((), generator=generator, device=residual.device)
            if u < residual[x]:
                accepted = child
                break
            residual[x] = 0                                    # rejected: p without x, renormalised
            residual /= residual.sum()
        if accepted is None:
            return path, int(torch.multinomial(residual, 1, generator=generator))
        path.append(accepted)
