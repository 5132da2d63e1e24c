"""Varlen forwards over paged caches: the target over many requests' rows at once, and the drafter's
context append and block forward over many requests at once.

Layout: the rows of all requests are concatenated into one [1, N, H] activation (no padding), so every
linear, norm and MLP runs once over N rows. Each request is a `Segment` (its page table, its first
position, its row count). Rope uses each row's logical position; K/V are written at each row's
physical slot (paged.slots_of). Attention is the only per-request part: a request's queries attend
over its own K/V gathered from the pool in logical order (ops.attention.attend, the single-request
engine's call with the same shapes), so a row's result does not depend on the other requests.

The arithmetic is the models' own, step for step (PreNormBlock: add_rms_norm, attention, add_rms_norm,
SwiGLU; the target's feature taps; the drafter's fc / hidden_norm / compute_logits), written over
segments because the models' forwards take one position vector for the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.ops import linear
from specpilot.ops.attention import attend, attention_mask
from specpilot.ops.norm_rope import add_rms_norm, qk_norm_rope_cache

from .paged import slots_of


@dataclass
class Segment:
    table: torch.Tensor          # int64 [pages] on the device: the request's page table
    start: int                   # logical position of the first row
    rows: int

    def positions(self, device) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.rows, device=device)


class Layout:
    """Positions, slots and per-segment attention inputs of one varlen forward."""

    def __init__(self, segments: list, page_size: int, device):
        if not segments or any(s.rows < 1 for s in segments):
            raise ValueError("a varlen forward needs at least one segment, each of >= 1 row")
        self.segments = segments
        pos = [s.positions(device) for s in segments]
        self.positions = torch.cat(pos)
        self.slots = torch.cat([slots_of(s.table, p, page_size) for s, p in zip(segments, pos)])
        bounds = [0]
        for s in segments:
            bounds.append(bounds[-1] + s.rows)
        self.bounds = bounds
        # Each segment's visible K/V: logical positions [0, start + rows), gathered through its table.
        self.kv_slots = [slots_of(s.table, torch.arange(s.start + s.rows, device=device), page_size)
                         for s in segments]

    def attend(self, q, k_pool, v_pool, masks, scale):
        """q [1, Hq, N, D] -> [1, N, Hq*D]: each segment's rows over its own gathered K/V."""
        outs = []
        for i, slots in enumerate(self.kv_slots):
            a, b = self.bounds[i], self.bounds[i + 1]
            outs.append(attend(q[:, :, a:b], k_pool[:, :, slots], v_pool[:, :, slots], masks[i], scale))
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


def target_forward(target, cache, layout: Layout, ids: torch.Tensor, feature_layers=(), logit_rows=None):
    """ids [N] at the layout's rows -> (logits [R, V] for the rows `logit_rows` (int64 [R]; None: all),
    features [N, F] or None). Causal per segment: row t sees its request's positions <= its own."""
    c = target.config
    x, delta = target.embed(ids[None]), None                     # [1, N, H]
    cos, sin = target.rope_cos[layout.positions], target.rope_sin[layout.positions]
    groups = c.num_heads // c.num_kv_heads
    masks = [attention_mask(s.positions(ids.device), s.start + s.rows, groups, x.dtype, writes_at_last=True)
             for s in layout.segments]
    feats, last = {}, len(target.layers) - 1
    for i, layer in enumerate(target.layers):
        block_input, normed = add_rms_norm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
        attn = layer.attn
        qkv = linear.linear(attn.qkv, normed).view(1, -1, attn.nq + 2 * attn.nkv, attn.d)
        q, k, v = qkv.split((attn.nq, attn.nkv, attn.nkv), dim=2)
        qk_norm = attn.q_norm is not None
        q = qk_norm_rope_cache(q, k, v, attn.q_norm.weight if qk_norm else None,
                               attn.k_norm.weight if qk_norm else None, cos, sin, layout.slots, attn.eps,
                               cache.k[i], cache.v[i])
        attn_out = linear.linear(attn.o, layout.attend(q, cache.k[i], cache.v[i], masks, attn.scale))
        h, normed = add_rms_norm(block_input, attn_out, layer.mlp_norm.weight, layer.mlp_norm.eps)
        x, delta = h, layer.mlp(normed)
        if i > 0 and i - 1 in feature_layers:
            feats[i - 1] = block_input
    _, x = add_rms_norm(x, delta, target.norm.weight, target.norm.eps)
    if last in feature_layers:
        feats[last] = x
    features = torch.cat([feats[i] for i in feature_layers], dim=-1)[0] if feature_layers else None
    rows = x[0] if logit_rows is None else x[0, logit_rows]
    logits = linear.linear(target.lm_head, rows[None])[0] if rows.shape[0] else rows.new_zeros(0, c.vocab_size)
    return logits, features


def draft_context(drafter, cache, layout: Layout, features: torch.Tensor) -> None:
    """Target features [N, F] of committed rows -> the drafter's context K/V at those rows' slots
    (DFlashDrafter.write_context over segments)."""
    h = drafter.hidden_norm(drafter.fc(features[None]))          # [1, N, H]
    cos, sin = drafter.rope_cos[layout.positions], drafter.rope_sin[layout.positions]
    for i, layer in enumerate(drafter.layers):
        layer.attn.project_to_cache(h, cos, sin, layout.slots, cache.k[i], cache.v[i])


def draft_block(drafter, cache, layout: Layout, block_ids: torch.Tensor) -> torch.Tensor:
    """Each segment a block [anchor, mask ...] -> draft logits [N - segments, V] (rows after each anchor,
    segment by segment). Non-causal: every row of a block sees its request's context and the whole
    block (DFlashDrafter.forward_block over segments)."""
    c = drafter.config
    x, delta = drafter.target.embed(block_ids[None]), None
    if c.input_embedding_scale != 1.0:
        x = x * c.input_embedding_scale
    cos, sin = drafter.rope_cos[layout.positions], drafter.rope_sin[layout.positions]
    groups = c.num_heads // c.num_kv_heads
    masks = []
    for s in layout.segments:
        last = torch.full((s.rows,), s.start + s.rows - 1, dtype=torch.long, device=block_ids.device)
        masks.append(attention_mask(last, s.start + s.rows, groups, x.dtype))
    for i, layer in enumerate(drafter.layers):
        block_input, normed = add_rms_norm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
        attn = layer.attn
        q = attn.project_to_cache(normed, cos, sin, layout.slots, cache.k[i], cache.v[i],
                                  q=linear.linear(attn.q, normed))
        attn_out = linear.linear(attn.o, layout.attend(q, cache.k[i], cache.v[i], masks, attn.scale))
        h, normed = add_rms_norm(block_input, attn_out, layer.mlp_norm.weight, layer.mlp_norm.eps)
        x, delta = h, layer.mlp(normed)
    _, x = add_rms_norm(x, delta, drafter.norm.weight, drafter.norm.eps)
    keep = torch.cat([torch.arange(a + 1, b, device=block_ids.device)
                      for a, b in zip(layout.bounds[:-1], layout.bounds[1:])])
    return drafter.compute_logits(x[:, keep])[0]
