"""A draft tree from the drafter's block distributions, under a node budget, built on the device.

The DFlash drafter gives one distribution per block depth d = 1..D (each conditioned on the context
only, not on the tokens drafted before it). A node at depth d holds one token of depth d's
distribution, named by its rank there; its score is the product of its path's draft probabilities
(a log sum here), the probability that the whole path is accepted if the drafter is calibrated and
the depths independent. The tree is the N - 1 best nodes (plus the anchor, the root) in the total
order: score descending, then depth ascending, then the order in which the depth's candidates are
enumerated (by the parent's place in that order, then rank). That is best-first growth: a child
never outranks its parent (its score is no higher, its depth is), a sibling never outranks a
lower-ranked one, so the N - 1 best form a tree, and the order is a topological one (a parent before
its children, node 0 the root, the anchor). A node's top-1 child outranks its other children, so the
top-1 chain from the root (the chain's drafts) grows where the drafter is confident, siblings where
it hesitates. (Laying the whole top-1 spine down first, as SGLang's dflash_tree does, lost:
docs/trees.md.)

Static shapes, no host sync (a CUDA graph can hold it): depth by depth, the N - 1 best of (previous
depth's kept nodes) x (the depth's top N - 1 ranks) are kept (stable sort: ties in enumeration
order), then the N - 1 best over all depths. Keeping N - 1 per depth loses nothing: if node z outranks
node p at depth d - 1, z's top-1 child outranks every child of p (its score is at least as high, and
rounded float addition is monotone; on a tie it is enumerated first), so a node among the best N - 1
of all has its parent among the best N - 1 of its parent's depth.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    tokens: list          # [N] token ids; tokens[0] the anchor
    parents: list         # [N] parent node index; parents[0] == -1
    depth: list           # [N] depth (the anchor 0): the node's position is anchor position + depth

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list:
        """[N] lists of child node indices."""
        out = [[] for _ in self.tokens]
        for i, p in enumerate(self.parents[1:], start=1):
            out[p].append(i)
        return out

    def path_to(self, node: int) -> list:
        """Node indices from the root to `node`, both included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


class TreeTensors:
    """A draft tree as device tensors (int64 [n] each), node 0 the root, nodes in topological order,
    and each node's root path: path[i, j] = node i's ancestor at depth j (i itself at depth[i]), n past
    its depth."""

    def __init__(self, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, path: torch.Tensor):
        self.tokens, self.parents, self.depth, self.path = tokens, parents, depth, path

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to_host(self) -> DraftTree:
        return DraftTree(*(t.tolist() for t in (self.tokens, self.parents, self.depth)))


def tree_size(depths: int, vocab: int, budget: int) -> int:
    """The node count grow_tree gives for draft logits [depths, vocab] (a static shape: the budget,
    unless fewer nodes exist)."""
    if budget < 1:
        raise ValueError(f"tree budget {budget} must be >= 1 (the anchor is a node)")
    keep, level, total = budget - 1, 1, 0
    for _ in range(depths):
        level = min(keep, level * min(keep, vocab))
        total += level
    return 1 + min(keep, total)


def fills_budget(vocab: int, budget: int) -> bool:
    """Whether every tree of at least one drafted depth has `budget` nodes (a static shape for the
    fused step: a tail's padding rows then never enter the tree)."""
    return tree_size(1, vocab, budget) == budget


def grow_tree(draft_logits: torch.Tensor, anchor, budget: int, depths: torch.Tensor | None = None) -> TreeTensors:
    """draft_logits [D, V] (depth d's draft logits in row d - 1), anchor (an int, or an int64 device
    tensor of one element) -> the tree of tree_size(D, V, budget) nodes of the module docstring, on
    draft_logits' device. depths (int64 [1] on that device): rows from it on are padding (a tail
    block in a graph of D rows), scored -inf, so they rank after every drafted node and stay out of
    the tree whenever tree_size(depths, V, budget) == tree_size(D, V, budget)."""
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [depths, vocab], got shape {tuple(draft_logits.shape)}")
    rows, vocab = draft_logits.shape
    n, device = tree_size(rows, vocab, budget), draft_logits.device
    root = (anchor.reshape(1).long() if torch.is_tensor(anchor)
            else torch.full((1,), int(anchor), dtype=torch.long, device=device))
    if n == 1:
        zero = torch.zeros(1, dtype=torch.long, device=device)
        return TreeTensors(root, zero - 1, zero, torch.zeros(1, rows + 1, dtype=torch.long, device=device))
    keep = budget - 1
    ranks = min(keep, vocab)
    logp, ids = torch.log_softmax(draft_logits.float(), dim=-1).topk(ranks, dim=-1)   # [D, ranks], best first
    if depths is not None:
        drafted = torch.arange(logp.shape[0], device=device)[:, None] < depths.reshape(1, 1)
        logp = torch.where(drafted, logp, torch.full_like(logp, float("-inf")))
    # per depth: the kept nodes' scores, tokens and root paths (global indices into the depths' concatenation)
    scores, tokens, paths, offset = [], [], [], 0
    score, path = torch.zeros(1, device=device), torch.zeros(1, 0, dtype=torch.long, device=device)
    for d in range(rows):
        cand = (score[:, None] + logp[d][None, :]).reshape(-1)           # (kept node, rank) order
        best = torch.sort(cand, descending=True, stable=True).indices[:keep]
        parent, rank = best // ranks, best % ranks
        score = cand[best]
        path = torch.cat([path[parent], (offset + torch.arange(best.shape[0], device=device))[:, None]], dim=1)
        scores.append(score)
        tokens.append(ids[d][rank])
        paths.append(path)
        offset += best.shape[0]
    chosen = torch.sort(torch.cat(scores), descending=True, stable=True).indices[:n - 1]   # global indices
    # node numbers: the root 0, the chosen 1..n-1 in order; `offset` (a non-node) maps to n
    number = torch.full((offset + 1,), n, dtype=torch.long, device=device)
    number.scatter_(0, chosen, torch.arange(1, n, device=device))
    width = rows + 1
    full_paths = torch.cat([torch.cat([p, torch.full((p.shape[0], width - 1 - p.shape[1]), offset, dtype=torch.long,
                                                     device=device)], dim=1) for p in paths])  # [offset, D]
    node_path = torch.cat([torch.zeros(n - 1, 1, dtype=torch.long, device=device), number[full_paths[chosen]]], dim=1)
    depth = (node_path < n).sum(dim=1) - 1                                # [n - 1]
    parents = node_path.gather(1, (depth - 1)[:, None])[:, 0]
    root_path = torch.cat([torch.zeros(1, 1, dtype=torch.long, device=device),
                           torch.full((1, width - 1), n, dtype=torch.long, device=device)], dim=1)
    return TreeTensors(torch.cat([root, torch.cat(tokens)[chosen]]),
                       torch.cat([torch.full((1,), -1, dtype=torch.long, device=device), parents]),
                       torch.cat([torch.zeros(1, dtype=torch.long, device=device), depth]),
                       torch.cat([root_path, node_path]))


def build_tree(draft_logits: torch.Tensor, anchor: int, budget: int) -> DraftTree:
    """grow_tree's tree on the host."""
    return grow_tree(draft_logits, anchor, budget).to_host()
