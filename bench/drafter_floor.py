"""The floor of one greedy draft step of a drafter of any kind: what it must at least read or compute.

Bytes: every weight the step reads whole, once (its linears; for DFlash and DFlash2 also the target's
LM head, which they borrow), plus its draft cache's K/V over the context it attends to. Embedding
tables (token embeddings, DSpark's Markov W1, DFlash2's codebooks) are gathered a few rows at a time
and are left out (their rows are < 0.1% of the bytes). FLOPs: 2 x (those weights' elements) x the K
tokens it drafts, a lower bound (each draft needs one row through every weight). The floor in ms is
the larger of bytes / the card's copy bandwidth and FLOPs / its matmul rate (bench/device_rates.py).
"""
from __future__ import annotations

from torch import nn

from specpilot.engine.engine import drafter_kind

TARGET_HEAD_KINDS = ("dflash", "dflash2")        # draft through the target's LM head (not their own)


def whole_read_weights(drafter, target) -> list:
    """The parameters a draft step reads whole (tied ones once): those of any module that is not an
    embedding table, plus the target's LM head for the kinds that borrow it."""
    gathered_only, whole = {}, {}
    for module in drafter.modules():
        for p in module.parameters(recurse=False):
            (gathered_only if isinstance(module, nn.Embedding) else whole)[id(p)] = p
    if drafter_kind(drafter) in TARGET_HEAD_KINDS:
        whole[id(target.lm_head.weight)] = target.lm_head.weight
    return list(whole.values())


def kv_read_bytes(drafter, kv_len: int, element_size: int) -> int:
    """K and V of every draft-cache layer over kv_len slots."""
    c = drafter.config
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_len * element_size


def draft_floor(drafter, target, block_size: int, context: int) -> dict:
    """{weight_bytes, kv_bytes, flops} of one steady draft step at `context` tokens of context."""
    weights = whole_read_weights(drafter, target)
    drafts = block_size - 1
    return {"weight_bytes": sum(p.numel() * p.element_size() for p in weights),
            "kv_bytes": kv_read_bytes(drafter, context + block_size, target.lm_head.weight.element_size()),
            "flops": 2 * sum(p.numel() for p in weights) * drafts}


def floor_ms(floor: dict, bytes_per_s: float, flops_per_s: float) -> float:
    memory = (floor["weight_bytes"] + floor["kv_bytes"]) / bytes_per_s
    return max(memory, floor["flops"] / flops_per_s) * 1e3


def drafter_shape(drafter) -> str:
    """A short description: layers (and the PARD model's width), the block the engine verifies."""
    kind = drafter_kind(drafter)
    c = drafter.config
    if kind == "pard":
        m = c.model
        return f"{m.num_layers} layers x {m.hidden_size}, K={c.num_drafts}"
    extra = f", Markov rank {c.markov_rank}" if kind == "dspark" else ""
    if kind == "dflash2":
        extra = f", selector top-{c.selector_top_k} rank {c.selector_rank}"
    return f"{c.num_layers} layers{extra}"

