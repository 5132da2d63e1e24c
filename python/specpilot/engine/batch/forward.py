"""Varlen forwards over paged caches: the target over many requests' rows at once, and the drafter's
context append and block forward over many requests at once.

Layout: the rows of all requests are concatenated into one [1, N, H] activation (no padding), so every
linear, norm and MLP runs once over N rows. Each request is a `Segment` (its page table, its first
position, its row count). Rope uses each row's logical position; K/V are written at each row's
physical slot (paged.slots_of). Attention is one SDPA call over a padded per-request batch (Layout):
a request's queries attend over its own K/V gathered from the pool in logical order, so a row's result
does not depend on the other requests (beyond summation rounding).

The arithmetic is the models' own, step for step (PreNormBlock: add_rms_norm, attention, add_rms_norm,
SwiGLU; the target's feature taps; the drafter's fc / hidden_norm / compute_logits), written over
segments because the models' forwards take one position vector for the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.ops import linear
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
    """Positions, slots and the padded attention batch of one varlen forward.

    Attention runs as one SDPA call over a padded batch [R requests, max rows, max keys]: each
    request's queries gathered from the N rows, its keys and values gathered from the pool through its
    page table in logical order; padding keys are masked, padding query rows (which see their
    request's last row's keys, so no row is all -inf) are dropped when the output is gathered back."""

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
        self.max_rows = max(s.rows for s in segments)
        self.max_keys = max(s.start + s.rows for s in segments)
        rows = torch.arange(self.max_rows, device=device)
        keys = torch.arange(self.max_keys, device=device)
        self.q_index = torch.stack([b + rows.clamp(max=s.rows - 1) for b, s in zip(bounds, segments)])   # [R, Lm]
        self.kv_index = torch.stack([slots_of(s.table, keys.clamp(max=s.start + s.rows - 1), page_size)
                                     for s in segments])                                                   # [R, S]
        self.out_index = torch.cat([i * self.max_rows + torch.arange(s.rows, device=device)
                                    for i, s in enumerate(segments)])                                      # [N]

    def mask(self, last: torch.Tensor, groups: int, dtype) -> torch.Tensor:
        """last [N] (key position j visible to row n iff j <= last[n]) -> the additive mask
        [R, 1, g*Lm, S] over the padded batch's folded GQA rows (rows j*Lm + t)."""
        padded_last = last[self.q_index]                                                     # [R, Lm]
        visible = torch.arange(self.max_keys, device=last.device)[None, None, :] <= padded_last[..., None]
        additive = torch.zeros(visible.shape, dtype=dtype, device=last.device).masked_fill_(~visible, float("-inf"))
        return additive.repeat(1, groups, 1)[:, None]

    def attend(self, q, k_pool, v_pool, mask, scale):
        """q [1, Hq, N, D] -> [1, N, Hq*D] (mask from `mask`)."""
        hq, d = q.shape[1], q.shape[3]
        r, lm = self.q_index.shape
        hkv = k_pool.shape[1]
        qp = q[0][:, self.q_index].transpose(0, 1).reshape(r, hkv, (hq // hkv) * lm, d)     # [R, Hkv, g*Lm, D]
        k = k_pool[0][:, self.kv_index].transpose(0, 1)                                      # [R, Hkv, S, D]
        v = v_pool[0][:, self.kv_index].transpose(0, 1)
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale)          # [R, Hkv, g*Lm, D]
        out = out.reshape(r, hq, lm, d).transpose(1, 2).reshape(r * lm, hq * d)
        return out[self.out_index][None]


def target_forward(target, cache, layout: Layout, ids: torch.Tensor, feature_layers=(), logit_rows=None):
    """ids [N] at the layout's rows -> (logits [R, V] for the rows `logit_rows` (int64 [R]; None: all),
    features [N, F] or None). Causal per segment: row t sees its request's positions <= its own."""
    c = target.config
    x, delta = target.embed(ids[None]), None                     # [1, N, H]
    cos, sin = target.rope_cos[layout.positions], target.rope_sin[layout.positions]
    groups = c.num_heads // c.num_kv_heads
    mask = layout.mask(layout.positions, groups, x.dtype)     # causal: row t sees positions <= its own
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
        attn_out = linear.linear(attn.o, layout.attend(q, cache.k[i], cache.v[i], mask, attn.scale))
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
    last = torch.cat([torch.full((s.rows,), s.start + s.rows - 1, dtype=torch.long, device=block_ids.device)
                      for s in layout.segments])
    mask = layout.mask(last, groups, x.dtype)                 # non-causal: every row sees its whole block
    for i, layer in enumerate(drafter.layers):
        block_input, normed = add_rms_norm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
        attn = layer.attn
        q = attn.project_to_cache(normed, cos, sin, layout.slots, cache.k[i], cache.v[i],
                                  q=linear.linear(attn.q, normed))
        attn_out = linear.linear(attn.o, layout.attend(q, cache.k[i], cache.v[i], mask, attn.scale))
        h, normed = add_rms_norm(block_input, attn_out, layer.mlp_norm.weight, layer.mlp_norm.eps)
        x, delta = h, layer.mlp(normed)
    _, x = add_rms_norm(x, delta, drafter.norm.weight, drafter.norm.eps)
    keep = torch.cat([torch.arange(a + 1, b, device=block_ids.device)
                      for a, b in zip(layout.bounds[:-1], layout.bounds[1:])])
    return drafter.compute_logits(x[:, keep])[0]
