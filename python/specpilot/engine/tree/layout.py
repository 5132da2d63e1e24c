"""What one target forward over a draft tree needs, as tensors (TargetLM / HybridLM `tree=`).

Node i of a tree verified at anchor position `start` is written to cache slot start + i (its scratch
slot: siblings share a position, so they cannot share a slot) and rotated at position start + depth[i].
It sees the committed slots [0, start) and the slots of its ancestors and itself. Commit
(engine/tree/commit.py) moves the accepted path's K/V from start + node to start + depth.

The forward reads only TreeInputs: views of one int64 device tensor `packed` [4N + N*N] (tokens,
parents, slots, rope positions, ancestor matrix), from which everything else (the attention mask,
the conv windows) is derived on the device. So the shapes depend on N alone, one host-to-device copy
carries a tree, and a CUDA graph of the forward (engine/tree/graphs.py) takes a new tree by a copy into
its static `packed`. TreeLayout adds the host side (the DraftTree, the anchor position).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.ops.attention import AttentionMask

from specpilot.kernels import tree_build

from .build import DraftTree, TreeTensors, grow_tree, tree_size


def packed_size(n: int) -> int:
    return 4 * n + n * n


class TreeInputs:
    def __init__(self, packed: torch.Tensor, n: int):
        """packed: int64 [4n + n*n] = [tokens | parents (-1: the root) | slots | rope positions |
        ancestors (row i, column j: 1 where j is i or an ancestor of i)]."""
        if packed.dtype != torch.long or packed.shape != (packed_size(n),):
            raise ValueError(f"a tree of {n} nodes is packed as int64 [{packed_size(n)}], got "
                             f"{packed.dtype} {list(packed.shape)}")
        self.packed, self.size = packed, n
        self.tokens = packed[:n].view(1, n)
        self.parents = packed[n:2 * n]
        self.slots = packed[2 * n:3 * n]
        self.rope_positions = packed[3 * n:4 * n]
        self.ancestors = packed[4 * n:].view(n, n)
        self._windows = {}

    def attention_mask(self, kv_len: int, groups: int, dtype) -> AttentionMask:
        """The ancestor mask over kv_len >= start + N slots (a graph's kv span may be longer: the slots
        past the tree are masked), additive [1, 1, g*N, kv_len] over attend's folded GQA rows (row
        j*N + i), with no `last` (it is not causal: our decode kernel declines)."""
        n, device = self.size, self.packed.device
        committed = torch.arange(kv_len, device=device)[None, :] < self.slots[:1, None]     # [1, kv_len]
        in_tree = torch.zeros(n, kv_len, dtype=torch.long, device=device)
        in_tree.index_copy_(1, self.slots, self.ancestors)                                   # [N, kv_len]
        visible = committed | (in_tree != 0)
        additive = torch.zeros(visible.shape, dtype=dtype, device=device)
        additive.masked_fill_(~visible, float("-inf"))
        return AttentionMask(additive.repeat(groups, 1)[None, None], None)

    def conv_window_index(self, width: int) -> torch.Tensor:
        """[N, width] indices into [the width - 1 committed conv inputs, the N nodes' inputs]: node i's
        conv window, oldest first, ending with i itself (its ancestors before it; above the root, the
        committed inputs). Walked up the parents on the device, width - 1 gathers."""
        if width in self._windows:                                  # every GDN layer asks
            return self._windows[width]
        past, device = width - 1, self.packed.device
        # the previous entry of each extended index: committed inputs their predecessor, a node its
        # parent's entry (the root: the last committed input)
        before = torch.cat([(torch.arange(past, device=device) - 1).clamp(min=0),
                            torch.where(self.parents >= 0, self.parents + past, torch.full_like(self.parents, past - 1))])
        col = torch.arange(past, past + self.size, device=device)
        cols = [col]
        for _ in range(past):
            col = before[col]
            cols.append(col)
        self._windows[width] = torch.stack(cols[::-1], dim=1)
        return self._windows[width]


def pack_tensors(tree: TreeTensors, start) -> torch.Tensor:
    """TreeInputs' int64 [4N + N*N] on the tree's device, without a host sync; start: the anchor
    position, an int or an int64 tensor of one element on that device (a graph's input)."""
    n, device = len(tree), tree.tokens.device
    at = start.reshape(1) if torch.is_tensor(start) else torch.full((1,), int(start), dtype=torch.long, device=device)
    ancestors = torch.zeros(n, n + 1, dtype=torch.long, device=device)     # column n takes the paths' padding
    ancestors.scatter_(1, tree.path, 1)
    return torch.cat([tree.tokens, tree.parents, at + torch.arange(n, device=device), at + tree.depth,
                      ancestors[:, :n].reshape(-1)])


def grown_and_packed(draft_logits: torch.Tensor, meta: torch.Tensor, budget: int) -> tuple:
    """A step's tree from its draft logits [D, V] (meta: int64 [3] anchor token, anchor position, depths
    drafted; grow_tree's depths) -> (grow_tree's TreeTensors, pack_tensors' packed at the anchor
    position): one kernel where kernels/tree_build.py takes the call, else the two torch functions."""
    rows, vocab = draft_logits.shape
    n = tree_size(rows, vocab, budget)
    if tree_build.takes(draft_logits, budget, n):
        out = tree_build.grow_packed(draft_logits, meta, budget, n)
        size = packed_size(n)
        packed = out[:size]
        return TreeTensors(packed[:n], packed[n:2 * n], out[size:size + n], out[size + n:].view(n, rows + 1)), packed
    grown = grow_tree(draft_logits, meta[:1], budget, depths=meta[2:])
    return grown, pack_tensors(grown, meta[1:2])


def host_tensors(tree: DraftTree) -> TreeTensors:
    """A host-made DraftTree as TreeTensors (CPU), its parent order checked."""
    n = len(tree)
    for i, p in enumerate(tree.parents):                        # the per-node kernels rely on this order
        if not (p == -1 if i == 0 else 0 <= p < i):
            raise ValueError(f"tree node {i} has parent {p}: node 0 is the root (parent -1) and every "
                             f"other node's parent must come before it")
    width = max(tree.depth) + 1
    path = torch.full((n, width), n, dtype=torch.long)
    for i in range(n):
        nodes = tree.path_to(i)
        path[i, :len(nodes)] = torch.tensor(nodes)
    return TreeTensors(*(torch.tensor(v, dtype=torch.long) for v in (tree.tokens, tree.parents, tree.depth)), path)


def pack_tree(tree: DraftTree, start: int) -> torch.Tensor:
    """The host tensor TreeInputs reads (int64 [4N + N*N], CPU)."""
    return pack_tensors(host_tensors(tree), start)


@dataclass
class PendingTree:
    """The host's record of a tree forward at anchor position `start` over `size` nodes (the hybrid
    cache's begin_tree / commit_path and the K/V commit read it); `tree`: the DraftTree once read."""
    start: int
    size: int
    device: torch.device
    tree: DraftTree | None = None


class TreeLayout(TreeInputs):
    """A tree forward's inputs at anchor position `start`. tree: a DraftTree (packed on the host, one
    copy over) or grow_tree's TreeTensors (packed where they are; `tree` is then None until the host
    reads the tree back and sets it: the hybrid commit checks its path against it)."""

    def __init__(self, tree, start: int, device):
        if isinstance(tree, TreeTensors):
            packed, host = pack_tensors(tree, start), None
        else:
            packed, host = pack_tree(tree, start), tree
            if torch.device(device).type == "cuda":
                packed = packed.pin_memory().to(device, non_blocking=True)
        super().__init__(packed, len(tree))
        self.tree, self.start, self.device = host, start, packed.device

    def attention_mask(self, kv_len: int, groups: int, dtype) -> AttentionMask:
        if kv_len < self.start + self.size:
            raise ValueError(f"a tree forward attends to at least start + nodes = {self.start + self.size} "
                             f"slots, got kv_len={kv_len}")
        return super().attention_mask(kv_len, groups, dtype)
