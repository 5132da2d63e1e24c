"""A draft tree from the drafter's block distributions, under a node budget.

The DFlash drafter gives one distribution per block depth d = 1..D (each conditioned on the context
only, not on the tokens drafted before it). A node at depth d holds one token of depth d's
distribution; its score is the product of its path's draft probabilities (a log sum here), the
probability that the whole path is accepted if the drafter is calibrated and the depths independent.
Best-first: the tree grows by the highest-scoring candidate, where a node's candidates are its next
unused child rank (the ranks of depth d + 1's distribution, best first) and its parent's next
sibling rank. A node's top-1 child always outranks its other children, so the top-1 chain from the
root (the chain's drafts) is grown wherever the drafter is confident, siblings where it hesitates.
(Laying the whole top-1 spine down first, as SGLang's dflash_tree does, lost: docs/trees.md.)

Nodes come out in topological order (a parent before its children; node 0 the root, the anchor).
"""
from __future__ import annotations

import heapq
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


def build_tree(draft_logits: torch.Tensor, anchor: int, budget: int) -> DraftTree:
    """draft_logits [D, V] (depth d's draft logits in row d - 1) -> a DraftTree of at most `budget`
    nodes (the anchor included) and depth at most D."""
    if budget < 1:
        raise ValueError(f"tree budget {budget} must be >= 1 (the anchor is a node)")
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [depths, vocab], got shape {tuple(draft_logits.shape)}")
    tokens, parents, depth, score = [int(anchor)], [-1], [0], [0.0]
    max_depth = draft_logits.shape[0]
    if budget == 1 or max_depth == 0:
        return DraftTree(tokens, parents, depth)
    k = min(budget - 1, draft_logits.shape[1])              # no node gets more children than this
    logp, ids = torch.log_softmax(draft_logits.float(), dim=-1).topk(k, dim=-1)
    logp, ids = logp.tolist(), ids.tolist()                 # [D][k], best first
    heap, order = [], 0                                     # (-score, order, parent, rank)

    def push(parent, rank):
        nonlocal order
        d = depth[parent] + 1
        if d <= max_depth and rank < k:
            heapq.heappush(heap, (-(score[parent] + logp[d - 1][rank]), order, parent, rank))
            order += 1

    push(0, 0)
    while heap and len(tokens) < budget:
        neg, _, parent, rank = heapq.heappop(heap)
        d = depth[parent] + 1
        tokens.append(ids[d - 1][rank])
        parents.append(parent)
        depth.append(d)
        score.append(-neg)
        push(parent, rank + 1)                              # the next sibling
        push(len(tokens) - 1, 0)                            # the new node's first child
    return DraftTree(tokens, parents, depth)
