"""Decoding state of a hybrid recurrent target: the KV cache of its attention layers, and per Gated
DeltaNet layer a conv state (the last K-1 pre-conv inputs, model dtype) and a recurrent state (fp32).

Why snapshots: a verify block folds every draft token into the recurrent state, and a rejected token
cannot be taken back out of it (unlike KV slots, which the next write simply overwrites). So a forward
of T <= MAX_SNAPSHOT_T tokens does not touch the committed state: it leaves a pending record, the
recurrent state after each of its T positions and its conv window [K-1 previous inputs, T new ones].
`commit(length)` then makes the state after `length` tokens of the sequence the committed one: the
snapshot at that position and the conv window's K-1 inputs ending there, exactly the state AR
decoding would have reached (AR is the T = 1 case, committed at once by the next step).

The commit hook is positional, like the KV cache (slot == position): a forward starting at position p
first commits length p (HybridLM.forward calls `begin`), so the spec loop's accept rule stays where it
is (engine/accept.py) and any loop that advances by positions works unchanged. A forward at position
0 starts a new sequence. Longer forwards (the prefill) run the chunked form and keep only the final
state: committing inside one raises.

Reserved step buffers (`reserve(t)`): fixed per-layer tensors that t-token forwards write their conv
windows and per-position states into, instead of fresh ones, so that a CUDA graph of the step
(engine/hybrid_graphs.py) writes them at addresses fixed at capture. Every kv span's graph of one t
shares them: a forward's record is committed (by the next forward's `begin`) before the next
forward of that t overwrites it.
"""
from __future__ import annotations

import torch

from .cache import KVCache

MAX_SNAPSHOT_T = 64        # per-position states kept for forwards of at most this many tokens


class HybridCache:
    def __init__(self, cfg, batch: int, max_seq_len: int, device, dtype):
        self.config = cfg
        self.kv = KVCache(len(cfg.attention_layers), batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim,
                          device, dtype)
        self.k, self.v = self.kv.k, self.kv.v            # attention layers only, in layer order
        self.k_layers, self.v_layers = self.kv.k_layers, self.kv.v_layers
        self.max_seq_len, self.slots = self.kv.max_seq_len, self.kv.slots
        self.kv_index = {layer: i for i, layer in enumerate(cfg.attention_layers)}
        self.gdn_index = {layer: i for i, layer in enumerate(cfg.gdn_layers)}
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.conv = [torch.zeros(batch, cfg.conv_dim, cfg.conv_kernel - 1, device=device, dtype=dtype)
                     for _ in cfg.gdn_layers]
        self.state = [torch.zeros(batch, hv, dk, dv, device=device, dtype=torch.float32) for _ in cfg.gdn_layers]
        self.committed_len = 0          # tokens folded into conv / state
        self.pending = None             # (start, T, every_position) of the last forward
        self.pending_tree = None        # the tree record (TreeLayout, PendingTree) of the last forward when it was a tree's
        self.windows = [None] * len(cfg.gdn_layers)     # per layer: [B, C, K-1+T] of the last forward
        self.snapshots = [None] * len(cfg.gdn_layers)   # per layer: [B, T or 1, H, Dk, Dv] fp32
        self.step_buffers = {}          # t -> per layer (window [B, C, K-1+t], states [B, t, H, Dk, Dv])

    @property
    def trash_slot(self) -> int:
        return self.kv.trash_slot

    def nbytes(self) -> int:
        return self.kv.nbytes() + sum(t.numel() * t.element_size() for t in self.conv + self.state)

    # -- the hook --------------------------------------------------------------------------------
    def commit(self, length: int) -> None:
        """Makes the state after the first `length` tokens of the sequence the committed state."""
        if length == self.committed_len:
            self.pending = self.pending_tree = None
            return
        if self.pending_tree is not None:
            raise ValueError(f"recurrent state: cannot commit to length {length} after a tree forward: "
                             f"commit_path(nodes) names the accepted path")
        if self.pending is None:
            raise ValueError(f"recurrent state: cannot commit to length {length}: the committed state is at "
                             f"{self.committed_len} and no forward is pending")
        start, t, every = self.pending
        n = length - start
        if not 0 < n <= t:
            raise ValueError(f"recurrent state: cannot commit to length {length}: the last forward covered "
                             f"positions {start}..{start + t - 1} (committed state at {self.committed_len})")
        if not every and n != t:
            raise ValueError(f"recurrent state: cannot commit to length {length} inside a {t}-token forward "
                             f"at {start}: forwards longer than {MAX_SNAPSHOT_T} tokens keep only their final "
                             f"state")
        width = self.config.conv_kernel - 1
        for j in range(len(self.conv)):
            self.conv[j].copy_(self.windows[j][:, :, n:n + width])
            self.state[j].copy_(self.snapshots[j][:, n - 1 if every else 0])
        self.committed_len, self.pending = length, None
        self.windows = [None] * len(self.conv)
        self.snapshots = [None] * len(self.conv)

    # -- used by HybridLM.forward ----------------------------------------------------------------
    def begin(self, start: int, t: int) -> bool:
        """Before a forward of t tokens at positions start..start+t-1: commits length `start` (start 0:
        a new sequence, from zero state). Returns whether the forward keeps per-position states."""
        if t < 1:
            raise ValueError("a forward needs at least one token")
        if start + t > self.max_seq_len:
            raise ValueError(f"positions {start}..{start + t - 1} exceed the cache's max_seq_len={self.max_seq_len}")
        if start == 0:
            self.reset()
        else:
            self.commit(start)
        every = t <= MAX_SNAPSHOT_T
        self.pending = (start, t, every)
        return every

    def begin_tree(self, layout) -> bool:
        """Before a forward over a draft tree (a TreeLayout at anchor position layout.start): commits
        length start. Its nodes' states are all kept (for commit_path)."""
        start, n = layout.start, layout.size
        if start < 1:
            raise ValueError("a tree forward continues a committed sequence: its anchor position must be >= 1")
        if n > MAX_SNAPSHOT_T:
            raise ValueError(f"a tree of {n} nodes exceeds the {MAX_SNAPSHOT_T} per-node states kept")
        if start + n > self.max_seq_len:
            raise ValueError(f"tree slots {start}..{start + n - 1} exceed the cache's max_seq_len={self.max_seq_len}")
        self.commit(start)
        self.pending, self.pending_tree = (start, n, True), layout
        return True

    def commit_path(self, nodes: list) -> None:
        """After a tree forward: makes the state after the root-to-node path `nodes` (node indices,
        root first, each the previous one's child) the committed state, at length start + len(nodes)."""
        layout = self.pending_tree
        if layout is None:
            raise ValueError("recurrent state: commit_path needs a pending tree forward")
        tree = layout.tree
        if tree is None:
            raise ValueError("recurrent state: commit_path checks the path against the tree, which this tree "
                             "forward's record does not hold yet (read the step back first)")
        if not nodes or nodes[0] != 0 or any(tree.parents[c] != p for p, c in zip(nodes, nodes[1:])):
            raise ValueError(f"recurrent state: {nodes} is not a path from the tree's root")
        last = nodes[-1]
        for j in range(len(self.conv)):
            self.conv[j].copy_(self.windows[j][:, :, last, 1:])
            self.state[j].copy_(self.snapshots[j][:, last])
        self.committed_len = layout.start + len(nodes)
        self.pending = self.pending_tree = None
        self.windows = [None] * len(self.conv)
        self.snapshots = [None] * len(self.conv)

    def reset(self) -> None:
        for c, s in zip(self.conv, self.state):
            c.zero_()
            s.zero_()
        self.committed_len, self.pending, self.pending_tree = 0, None, None
        self.windows = [None] * len(self.conv)
        self.snapshots = [None] * len(self.conv)

    # -- reserved step buffers (graphed steps) ---------------------------------------------------
    def reserve(self, t: int) -> None:
        """Allocates the fixed buffers of t-token forwards (see the module doc); no-op when held."""
        if not 1 <= t <= MAX_SNAPSHOT_T:
            raise ValueError(f"step buffers are for forwards of 1..{MAX_SNAPSHOT_T} tokens, got {t}")
        if t in self.step_buffers:
            return
        cfg = self.config
        batch, device = self.conv[0].shape[0], self.conv[0].device
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        with torch.inference_mode(False):       # plain tensors, as the cache's own: written in and out of it
            self.step_buffers[t] = [
                (torch.empty(batch, cfg.conv_dim, cfg.conv_kernel - 1 + t, device=device, dtype=conv.dtype),
                 torch.empty(batch, t, hv, dk, dv, device=device, dtype=torch.float32))
                for conv in self.conv]

    def buffers(self, layer: int, t: int):
        """(window [B, C, K-1+t], states [B, t, H, Dk, Dv]) reserved for GDN layer `layer`'s t-token
        forwards, or None when t has none."""
        per_layer = self.step_buffers.get(t)
        return None if per_layer is None else per_layer[self.gdn_index[layer]]

    def adopt(self, t: int) -> None:
        """After a replayed t-token forward (none of its Python ran, so nothing was stashed): its
        record is the reserved buffers of t, which the replay wrote."""
        if t not in self.step_buffers:
            raise ValueError(f"no step buffers reserved for {t}-token forwards")
        if self.pending is None or self.pending[1] != t or not self.pending[2]:
            raise ValueError(f"recurrent state: adopt({t}) needs a pending {t}-token forward that keeps its "
                             f"per-position states (begin), got {self.pending}")
        for j, (window, states) in enumerate(self.step_buffers[t]):
            self.windows[j], self.snapshots[j] = window, states

    def layer_state(self, layer: int):
        """(conv [B, C, K-1], recurrent state [B, H, Dk, Dv]) committed for GDN layer `layer`."""
        j = self.gdn_index[layer]
        return self.conv[j], self.state[j]

    def stash(self, layer: int, window: torch.Tensor, snapshots: torch.Tensor) -> None:
        """The forward's conv window [B, C, K-1+T] and states [B, T or 1, H, Dk, Dv] for GDN layer `layer`."""
        j = self.gdn_index[layer]
        self.windows[j], self.snapshots[j] = window, snapshots


def hybrid_cache(model, batch: int, max_seq_len: int) -> HybridCache:
    return HybridCache(model.config, batch, max_seq_len, model.device, model.dtype)
