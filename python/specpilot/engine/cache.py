"""Static KV cache: one [B, H_kv, S, D] K and V tensor per layer, allocated once, each a view of one
[L, B, H_kv, S, D] tensor (`k_layers`, `v_layers`), so that moving slots in every layer (a tree's
commit) is one gather and one scatter.

Slot index == absolute position. The slot count is max_seq_len + 1 rounded up to a multiple of 64
(aligned attention spans); the last slot (`trash_slot`) absorbs padded writes of CUDA-graph steps.
No query position reaches it (positions < max_seq_len), so it is never visible.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_seq_len: int, head_dim: int,
                 device, dtype):
        if max_seq_len < 1 or batch < 1:
            raise ValueError(f"KVCache needs max_seq_len >= 1 and batch >= 1, got {max_seq_len}, {batch}")
        self.max_seq_len = max_seq_len
        self.slots = -(-(max_seq_len + 1) // 64) * 64
        shape = (batch, kv_heads, self.slots, head_dim)
        self.k_layers = torch.zeros((num_layers, *shape), device=device, dtype=dtype)
        self.v_layers = torch.zeros((num_layers, *shape), device=device, dtype=dtype)
        self.k, self.v = list(self.k_layers.unbind(0)), list(self.v_layers.unbind(0))

    @property
    def trash_slot(self) -> int:
        return self.slots - 1

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def target_cache(model, batch: int, max_seq_len: int) -> KVCache:
    """The target's decoding state: a KVCache, or for a hybrid recurrent target (HybridLM) a HybridCache
    (KV of its attention layers + conv / recurrent states with per-position snapshots)."""
    if getattr(model, "is_hybrid", False):
        from .recurrent_state import hybrid_cache
        return hybrid_cache(model, batch, max_seq_len)
    c = model.config
    return KVCache(c.num_layers, batch, c.num_kv_heads, max_seq_len, c.head_dim, model.device, model.dtype)


def drafter_cache(drafter, batch: int, max_seq_len: int) -> KVCache:
    c, t = drafter.config, drafter.target
    return KVCache(c.num_layers, batch, c.num_kv_heads, max_seq_len, c.head_dim, t.device, t.dtype)
