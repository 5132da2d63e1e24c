"""What one target forward over a draft tree needs, as tensors (TargetLM / HybridLM `tree=`).

Node i of a tree verified at anchor position `start` is written to cache slot start + i (its scratch
slot: siblings share a position, so they cannot share a slot) and rotated at position start + depth[i].
It sees the committed slots [0, start) and the slots of its ancestors and itself. Commit
(engine/tree/commit.py) moves the accepted path's K/V from start + node to start + depth.
"""
from __future__ import annotations

import torch

from specpilot.ops.attention import AttentionMask

from .build import DraftTree


class TreeLayout:
    def __init__(self, tree: DraftTree, start: int, device):
        n = len(tree)
        for i, p in enumerate(tree.parents):                    # the per-node kernels rely on this order
            if not (p == -1 if i == 0 else 0 <= p < i):
                raise ValueError(f"tree node {i} has parent {p}: node 0 is the root (parent -1) and every "
                                 f"other node's parent must come before it")
        self.tree, self.start, self.size = tree, start, n
        self.parents = torch.tensor(tree.parents, dtype=torch.long, device=device)
        self.slots = torch.arange(start, start + n, device=device)
        self.rope_positions = start + torch.tensor(tree.depth, dtype=torch.long, device=device)
        ancestors = torch.zeros(n, n, dtype=torch.bool)          # [i, j]: j is i or an ancestor of i
        for i, p in enumerate(tree.parents):
            if p >= 0:
                ancestors[i] = ancestors[p]
            ancestors[i, i] = True
        self.ancestors = ancestors.to(device)
        by_depth = {}
        for i, d in enumerate(tree.depth):
            by_depth.setdefault(d, []).append(i)
        self.levels = [torch.tensor(by_depth[d], dtype=torch.long, device=device) for d in sorted(by_depth)]
        self._windows = {}

    def attention_mask(self, kv_len: int, groups: int, dtype) -> AttentionMask:
        """The ancestor mask over kv_len = start + N slots, additive [1, 1, g*N, kv_len] over attend's
        folded GQA rows (row j*N + i), with no `last` (it is not causal: our decode kernel declines)."""
        if kv_len != self.start + self.size:
            raise ValueError(f"a tree forward attends to start + nodes = {self.start + self.size} slots, "
                             f"got kv_len={kv_len}")
        committed = torch.ones(self.size, self.start, dtype=torch.bool, device=self.ancestors.device)
        visible = torch.cat([committed, self.ancestors], dim=1)            # [N, kv_len]
        additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
        additive.masked_fill_(~visible, float("-inf"))
        return AttentionMask(additive.repeat(groups, 1)[None, None], None)

    def conv_window_index(self, width: int) -> torch.Tensor:
        """[N, width] indices into [the width - 1 committed conv inputs, the N nodes' inputs]: node i's
        conv window, oldest first, ending with i itself (its ancestors before it; above the root, the
        committed inputs)."""
        if width in self._windows:                                  # every GDN layer asks
            return self._windows[width]
        past = width - 1
        idx = torch.empty(self.size, width, dtype=torch.long)
        for i in range(self.size):
            e = past + i                                        # walk up the extended sequence
            for col in range(width - 1, -1, -1):
                idx[i, col] = e
                if e >= past:
                    p = self.tree.parents[e - past]
                    e = past + p if p >= 0 else past - 1
                else:
                    e -= 1
        self._windows[width] = idx.to(self.parents.device)
        return self._windows[width]
