"""Varlen forwards over paged caches: the target over many requests' rows at once, and the drafter's
context append and block forward over many requests at once.

Layout: the rows of all requests are concatenated into one [1, N, H] activation (no padding), so every
linear, norm and MLP runs once over N rows. Each request is a `Segment` (its page table, its first
position, its row count). Rope uses each row's logical position; K/V are written at each row's
physical slot (its page table: paged.table_slots). Attention is one SDPA call over a padded per-request batch (Layout):
a request's queries attend over its own K/V gathered from the pool in logical order, so a row's result
does not depend on the other requests (beyond summation rounding).

The arithmetic is the models' own, step for step (PreNormBlock: add_rms_norm, attention, add_rms_norm,
SwiGLU; the target's feature taps; the drafter's fc / hidden_norm / compute_logits), written over
segments because the models' forwards take one position vector for the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from specpilot.kernels import paged_attention
from specpilot.ops import linear
from specpilot.ops.norm_rope import add_rms_norm, qk_norm_rope_cache

from .paged import key_slots, stack_tables, table_slots

KEY_PAD = 64        # the padded key count of the attention batch is a multiple of this: few shapes, aligned masks
# cuDNN's SDPA builds a graph per new shape on the host (~1 ms a call, every step a new key count), so CUDA
# runs the memory-efficient kernel, which takes the additive mask as it is.
CUDA_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class Segment:
    pages: list                  # the request's page table (host ints)
    start: int                   # logical position of the first row
    rows: int


@dataclass
class Rows:
    """Positions and cache slots of rows that only write K/V (the draft context append's layout)."""
    positions: torch.Tensor
    slots: torch.Tensor


class Staging:
    """Host-to-device uploads of a step's index arrays: everything a forward's layout needs goes in one
    int64 copy (pinned and asynchronous on CUDA), so no step waits on a per-request transfer. A ring of
    pinned buffers: a buffer is rewritten only after the copy that last read it has run."""

    RING = 4

    def __init__(self, device):
        self.device = torch.device(device)
        self._buffers = [None] * self.RING
        self._events = [None] * self.RING
        self._next = 0

    def upload(self, arrays: list) -> list:
        """int64 numpy arrays -> int64 device tensors (views of one upload), in order."""
        sizes = [int(a.size) for a in arrays]
        flat = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays])
        if self.device.type != "cuda":
            out = torch.from_numpy(flat).to(self.device)
        else:
            i, self._next = self._next, (self._next + 1) % self.RING
            if self._events[i] is not None:
                self._events[i].synchronize()              # normally long done: a step reads tokens back
            if self._buffers[i] is None or self._buffers[i].numel() < flat.size:
                self._buffers[i] = torch.empty(max(flat.size, 4096) * 2, dtype=torch.int64, pin_memory=True)
            host = self._buffers[i][:flat.size]
            host.numpy()[:] = flat
            out = host.to(self.device, non_blocking=True)
            self._events[i] = torch.cuda.Event()
            self._events[i].record()
        return list(torch.split(out, sizes))


class _PaddedAttention:
    """The attention of a varlen forward as one SDPA call over a padded batch [R requests, max rows,
    max keys]: each request's queries gathered from the N rows (q_index [R, Lm]), its keys and values
    gathered from the pool through its page table in logical order (kv_index [R, S]); keys past a row's
    `last` (padded_last [R, Lm]) are masked, padding query rows are dropped on the way back (out_index)."""

    def mask(self, groups: int, dtype) -> torch.Tensor:
        """The additive mask [R, 1, g*Lm, S] over the padded batch's folded GQA rows (rows j*Lm + t):
        key position j is visible to a row iff j <= its `last`."""
        keys = torch.arange(self.max_keys, device=self.padded_last.device)
        visible = keys[None, None, :] <= self.padded_last[..., None]
        additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
        return additive.repeat(1, groups, 1)[:, None]

    def attend(self, q, k_pool, v_pool, mask, scale):
        """q [1, Hq, N, D] -> [1, N, Hq*D] (mask from `mask`)."""
        hq, d = q.shape[1], q.shape[3]
        r, lm = self.q_index.shape
        hkv = k_pool.shape[1]
        qp = q[0][:, self.q_index].transpose(0, 1).reshape(r, hkv, (hq // hkv) * lm, d)     # [R, Hkv, g*Lm, D]
        k = k_pool[0][:, self.kv_index].transpose(0, 1)                                      # [R, Hkv, S, D]
        v = v_pool[0][:, self.kv_index].transpose(0, 1)
        if q.is_cuda:
            with sdpa_kernel(CUDA_SDPA):
                out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale)
        else:
            out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale)      # [R, Hkv, g*Lm, D]
        out = out.reshape(r, hq, lm, d).transpose(1, 2).reshape(r * lm, hq * d)
        return out[self.out_index][None]


class Layout(_PaddedAttention):
    """Positions, slots and the padded attention batch of one varlen forward (rows concatenated with no
    padding), built on the host and uploaded in one copy with `extra` (more int64 arrays the forward
    needs, e.g. its token ids: `.extra`). Padding query rows of the attention batch see their
    request's last row's keys, so no row is all -inf. `last` [N] (host): the last key position each
    row sees (None: causal, its own position)."""

    def __init__(self, segments: list, page_size: int, staging: Staging, last=None, extra=()):
        starts, counts = _starts_rows(segments)
        if not segments or counts.min() < 1:
            raise ValueError("a varlen forward needs at least one segment, each of >= 1 row")
        self.segments = segments
        ends = starts + counts - 1
        self.max_rows = int(counts.max())
        self.max_keys = -(-(int(ends.max()) + 1) // KEY_PAD) * KEY_PAD
        table = stack_tables([s.pages for s in segments], ends, page_size)
        bounds = np.cumsum(counts) - counts                      # each segment's first row
        segment = np.repeat(np.arange(len(segments)), counts)    # each row's segment
        within = np.arange(int(counts.sum())) - bounds[segment]  # each row's index in its segment
        positions = starts[segment] + within
        slots = table_slots(table, segment, positions, page_size)
        q_index = bounds[:, None] + np.minimum(np.arange(self.max_rows), counts[:, None] - 1)      # [R, Lm]
        kv_index = key_slots(table, ends, self.max_keys, page_size)                                 # [R, S]
        out_index = segment * self.max_rows + within
        last = positions if last is None else np.asarray(last, dtype=np.int64)
        uploaded = staging.upload([positions, slots, q_index, kv_index, out_index, last[q_index], *extra])
        self.positions, self.slots, q_index, kv_index, self.out_index, padded_last = uploaded[:6]
        self.q_index = q_index.view(len(segments), self.max_rows)
        self.kv_index = kv_index.view(len(segments), self.max_keys)
        self.padded_last = padded_last.view(len(segments), self.max_rows)
        self.extra = uploaded[6:]


class PaddedLayout(_PaddedAttention):
    """A forward of R requests x T rows each, request r's rows at [r*T, (r+1)*T) (the static shape a
    CUDA graph replays), from the arrays of `padded` as device tensors (a graph's static inputs).
    keys: kv_index [R, S] (SDPA over the gathered K/V), or with `page_size` the page table int32
    [R, P] for the paged kernel (kernels/paged_attention.py), which reads K/V in place."""

    def __init__(self, positions, slots, keys, padded_last, page_size: int | None = None):
        self.positions, self.slots, self.padded_last = positions, slots, padded_last
        self.page_size = page_size
        self.page_table, self.kv_index = (keys, None) if page_size else (None, keys)
        r, t = padded_last.shape
        self.max_rows, self.max_keys = t, keys.shape[1] * (page_size or 1)
        self.q_index = torch.arange(r * t, device=positions.device).view(r, t)
        self.out_index = torch.arange(r * t, device=positions.device)

    def mask(self, groups: int, dtype):
        return None if self.page_table is not None else super().mask(groups, dtype)

    def attend(self, q, k_pool, v_pool, mask, scale):
        if self.page_table is None:
            return super().attend(q, k_pool, v_pool, mask, scale)
        r, t = self.padded_last.shape
        hq, d = q.shape[1], q.shape[3]
        rows = q[0].view(hq, r, t, d).transpose(0, 1)                                      # [R, Hq, T, D]
        out = q.new_empty(r, t, hq * d)
        splits = paged_attention.default_splits(rows.shape, k_pool.shape[1], self.max_keys, q.device) if q.is_cuda else 1
        workspace = paged_attention.new_workspace(splits, rows.shape, q.device)
        paged_attention.paged_decode_attention(rows, k_pool, v_pool, self.page_table, self.page_size,
                                               self.padded_last, scale, out, workspace)
        return out.view(1, r * t, hq * d)


class SplitLayout:
    """Two padded layouts in one forward: a step's decode rows (R x T) and then its prefill tiles
    (P x tile), so that one pass over the weights serves both. Rope and the K/V writes run over the
    rows of both; attention runs once per part, each with its own page table and visible ends."""

    def __init__(self, decode: PaddedLayout, prefill: PaddedLayout):
        self.parts = (decode, prefill)
        self.decode_rows = decode.positions.shape[0]
        self.positions = torch.cat([decode.positions, prefill.positions])
        self.slots = torch.cat([decode.slots, prefill.slots])

    def mask(self, groups: int, dtype):
        return tuple(part.mask(groups, dtype) for part in self.parts)

    def attend(self, q, k_pool, v_pool, mask, scale):
        n = self.decode_rows
        return torch.cat([part.attend(rows, k_pool, v_pool, m, scale)
                          for part, rows, m in zip(self.parts, (q[:, :, :n], q[:, :, n:]), mask)], dim=1)


def padded(segments: list, requests: int, rows: int, keys: int, page_size: int, trash_slot: int, last=None,
           paged: bool = False) -> list:
    """Host arrays (positions, slots [requests*rows], keys, padded_last [requests, rows]) of `segments`
    padded to `requests` x `rows` over `keys` key positions; keys: kv_index [requests, keys], or with
    `paged` the page table [requests, keys / page_size]. A segment's padding rows sit at its last row's
    position, write their K/V to `trash_slot` (a page of its own that no real request reads) and see
    what its last row sees; padding requests write and read only the trash page. `last` [sum of
    rows]: as Layout's (None: causal)."""
    trash_page = trash_slot // page_size
    key_width = keys // page_size if paged else keys
    positions = np.zeros((requests, rows), dtype=np.int64)
    slots = np.full((requests, rows), trash_slot, dtype=np.int64)
    key_array = np.full((requests, key_width), trash_page if paged else trash_slot, dtype=np.int64)
    padded_last = np.zeros((requests, rows), dtype=np.int64)
    n = len(segments)
    if n:
        starts, counts = _starts_rows(segments)
        if counts.min() < 1 or counts.max() > rows:
            raise ValueError(f"padded: segments of {counts.min()}..{counts.max()} rows do not fit {rows} rows each")
        ends = starts + counts - 1
        table = stack_tables([s.pages for s in segments], ends, page_size, trash_page, key_width if paged else 0)
        real = np.arange(rows) < counts[:, None]
        own = np.minimum(np.arange(rows), counts[:, None] - 1)       # padding rows repeat the segment's last row
        positions[:n] = starts[:, None] + own
        slots[:n] = np.where(real, table_slots(table, np.arange(n)[:, None], positions[:n], page_size), trash_slot)
        if last is None:
            padded_last[:n] = positions[:n]
        else:
            padded_last[:n] = np.asarray(last, dtype=np.int64)[(np.cumsum(counts) - counts)[:, None] + own]
        # the page table as it is (trash pages past each table), or each key's slot
        key_array[:n] = table[:, :key_width] if paged else key_slots(table, ends, keys, page_size)
    return [positions.ravel(), slots.ravel(), key_array, padded_last]


def _starts_rows(segments: list) -> tuple:
    """The segments' first positions and row counts (int64 arrays)."""
    n = len(segments)
    return (np.fromiter((s.start for s in segments), dtype=np.int64, count=n),
            np.fromiter((s.rows for s in segments), dtype=np.int64, count=n))


def target_forward(target, cache, layout: Layout, ids: torch.Tensor, feature_layers=(), logit_rows=None):
    """ids [N] at the layout's rows -> (logits [R, V] for the rows `logit_rows` (int64 [R]; None: all),
    features [N, F] or None). Causal per segment: row t sees its request's positions <= its own."""
    c = target.config
    x, delta = target.embed(ids[None]), None                     # [1, N, H]
    cos, sin = target.rope_cos[layout.positions], target.rope_sin[layout.positions]
    groups = c.num_heads // c.num_kv_heads
    mask = layout.mask(groups, x.dtype)
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


def draft_context(drafter, cache, layout, features: torch.Tensor) -> None:
    """Target features [N, F] of committed rows -> the drafter's context K/V at those rows' slots
    (DFlashDrafter.write_context over segments)."""
    h = drafter.hidden_norm(drafter.fc(features[None]))          # [1, N, H]
    cos, sin = drafter.rope_cos[layout.positions], drafter.rope_sin[layout.positions]
    for i, layer in enumerate(drafter.layers):
        layer.attn.project_to_cache(h, cos, sin, layout.slots, cache.k[i], cache.v[i])


def draft_block(drafter, cache, layout: Layout, block_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each segment a block [anchor, mask ...] -> draft logits [N - segments, V] at the rows `keep`
    (block_keep: the rows after each anchor, segment by segment; the layout built with block_last).
    DFlashDrafter.forward_block over segments: the target's embedding, scaled as the drafter's config says."""
    x = drafter.target.embed(block_ids[None])
    if drafter.config.input_embedding_scale != 1.0:
        x = x * drafter.config.input_embedding_scale
    x = draft_layers(drafter, cache, layout, x)
    return drafter.compute_logits(x[:, keep])[0]


def draft_layers(drafter, cache, layout: Layout, x: torch.Tensor) -> torch.Tensor:
    """A block drafter's layers and final norm over the layout's rows: embedded blocks x [1, N, H] ->
    final-normed hidden [1, N, H]. Non-causal when the layout was built with block_last: every row sees
    its request's context and its whole block."""
    c = drafter.config
    delta = None
    cos, sin = drafter.rope_cos[layout.positions], drafter.rope_sin[layout.positions]
    mask = layout.mask(c.num_heads // c.num_kv_heads, x.dtype)
    for i, layer in enumerate(drafter.layers):
        block_input, normed = add_rms_norm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
        attn = layer.attn
        q = attn.project_to_cache(normed, cos, sin, layout.slots, cache.k[i], cache.v[i],
                                  q=linear.linear(attn.q, normed))
        attn_out = linear.linear(attn.o, layout.attend(q, cache.k[i], cache.v[i], mask, attn.scale))
        h, normed = add_rms_norm(block_input, attn_out, layer.mlp_norm.weight, layer.mlp_norm.eps)
        x, delta = h, layer.mlp(normed)
    _, x = add_rms_norm(x, delta, drafter.norm.weight, drafter.norm.eps)
    return x


def block_last(segments: list) -> np.ndarray:
    """`last` for a draft block forward: every row of a segment sees up to the segment's last row."""
    starts, counts = _starts_rows(segments)
    return np.repeat(starts + counts - 1, counts)


def block_keep(segments: list) -> np.ndarray:
    """The rows after each segment's anchor (the draft rows), as indices into the concatenated rows."""
    _, counts = _starts_rows(segments)
    keep = np.ones(int(counts.sum()), dtype=bool)
    keep[np.cumsum(counts) - counts] = False                     # the anchors
    return np.flatnonzero(keep)
