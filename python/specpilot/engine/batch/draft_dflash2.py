"""Batched drafting with the DFlash2 drafter (kind_drafting.py's contract): every request of a group
drafts in one varlen forward over the paged draft cache, then one candidate-selector walk over all
requests at once. Request by request it is DFlash2Session (models/drafters/dflash2.py):

  context   the request's committed target features -> context K/V (forward.draft_context, as DFlash)
  block     [anchor, mask x (rows - 1)] at positions start.., the target's embedding; each ConvBlock's
            grouped dynamic causal conv runs along each request's own rows (a tap never reaches into
            the request before it: rows past a block's start read exact zeros, as stock's padding);
            each layer's attention mask is stock's per-layer visibility (layer_mask) per row
  selector  top-k of every drafting row's logits in one call, then the left-to-right walk over
            positions, all requests at each position; at temperature > 0 each request draws from its
            own generator, position by position, as the single-request selector does

top_p: the single-request session has none (Engine.generate_spec takes no top_p), so the selector's q is
the softmax of its candidate scores at the temperature whatever the request's top_p; the verify's
target distribution honours top_p as for every kind (step.py), and rejection sampling stays lossless
for any q.
"""
from __future__ import annotations

import numpy as np
import torch

from specpilot.models.drafters.dflash2 import dense_draft_probs
from specpilot.ops import linear
from specpilot.ops.norm_rope import add_rms_norm
from specpilot.verify.sampling import sample_probs, sampling_probs

from . import forward
from .draft_context import append_context


class Drafting:
    def __init__(self, engine):
        self.engine, self.drafter = engine, engine.drafter

    def propose(self, group: list, segments: list) -> tuple:
        plan, inputs, hidden = self.draft_hidden(group, segments)
        with self.engine.kernels(hidden.shape[1]):
            return select(self.drafter, group, plan, inputs, hidden)

    def draft_hidden(self, group: list, segments: list) -> tuple:
        """The group's pending context appended, then one block forward over all its blocks:
        (plan, its uploaded inputs, hidden [1, M, H] of the drafting rows, blocks concatenated)."""
        engine, drafter = self.engine, self.drafter
        append_context(engine, group)
        plan = _BlockPlan(drafter.config, group, segments)
        layout = forward.Layout(segments, engine.page_size, engine.staging, last=forward.block_last(segments),
                                extra=plan.arrays())
        inputs = plan.take(layout.extra)
        with engine.kernels(layout.positions.shape[0]):
            return plan, inputs, block_hidden(drafter, engine.draft_cache, layout, inputs)

    def release(self, state) -> None:
        """Nothing kept per request: its context lives in the paged draft cache, its pending rows in state.ctx."""


class _BlockPlan:
    """Host arrays of a group's block forward and selector walk (uploaded with the layout in one copy)."""

    def __init__(self, cfg, group: list, segments: list):
        self.cfg, self.segments = cfg, segments
        self.rows = [seg.rows for seg in segments]
        self.drafts = [n - 1 for n in self.rows]
        self.positions = np.concatenate([np.arange(s.start, s.start + s.rows) for s in segments])
        self.block_end = forward.block_last(segments)
        bounds = np.cumsum([0] + self.rows)
        self.row_in_block = np.concatenate([np.arange(n) for n in self.rows])
        self.taps = min(cfg.conv_kernel_size, max(self.rows))
        self.walk = max(self.drafts)
        self.draft_start = np.cumsum([0] + self.drafts)[:-1]
        self.block_ids = np.full(bounds[-1], cfg.mask_token_id, dtype=np.int64)
        self.block_ids[bounds[:-1]] = [s.tokens[-1] for s in group]
        self.sampled = [i for i, s in enumerate(group) if s.req.temperature > 0]

    def arrays(self) -> list:
        n = len(self.positions)
        rows = np.arange(n)
        keep = forward.block_keep(self.segments)
        shifts = [np.maximum(rows - o, 0) for o in range(1, self.taps)]
        inside = [(self.row_in_block >= o).astype(np.int64) for o in range(1, self.taps)]
        lows, highs = zip(*(self.visible(kind) for kind in self.layer_kinds()))
        # the walk: position p reads request r's row min(p, drafts - 1) (a finished request repeats its last, unused)
        walk_rows = np.stack([self.draft_start + np.minimum(p, np.asarray(self.drafts) - 1) for p in range(self.walk)])
        path_index = np.concatenate([r + len(self.drafts) * np.arange(k) for r, k in enumerate(self.drafts)])
        anchors = self.block_ids[np.cumsum([0] + self.rows)[:-1]]
        return [self.block_ids, anchors, keep, *shifts, *inside, *lows, *highs, walk_rows.ravel(), path_index]

    def take(self, uploaded: list) -> dict:
        taps, kinds = self.taps - 1, len(self.layer_kinds())
        it = iter(uploaded)
        out = {"block_ids": next(it), "anchors": next(it), "keep": next(it)}
        out["shifts"] = [next(it) for _ in range(taps)]
        out["inside"] = [next(it).bool()[None, :, None, None] for _ in range(taps)]
        lows, highs = [next(it) for _ in range(kinds)], [next(it) for _ in range(kinds)]
        out["bounds"] = dict(zip(self.layer_kinds(), zip(lows, highs)))
        out["walk_rows"] = next(it).view(self.walk, len(self.drafts))
        out["path_index"] = next(it)
        return out

    def layer_kinds(self) -> list:
        """The distinct (causal, window) visibilities of the drafter's layers (layer_mask's rule)."""
        return sorted(set(layer_visibility(self.cfg, i) for i in range(self.cfg.num_layers)), key=str)

    def visible(self, kind) -> tuple:
        """(lowest, highest) key position each row sees under `kind` (layer_mask's rule over the block)."""
        causal, window = kind
        q = self.positions
        high = self.block_end.copy()
        if causal:
            high = np.minimum(high, q)
        elif window is not None:
            high = np.minimum(high, q + window - 1)
        low = q - window + 1 if window is not None else np.zeros_like(q)
        return low.astype(np.int64), high.astype(np.int64)


def layer_visibility(cfg, layer: int) -> tuple:
    """(causal, window) of a layer, as models/drafters/dflash2.layer_mask decides it."""
    kind = cfg.layer_types[layer]
    causal = kind == "sliding_attention" if cfg.is_causal is None else bool(cfg.is_causal)
    return causal, cfg.sliding_window if kind == "sliding_attention" else None


def interval_mask(layout, low, high, groups: int, dtype) -> torch.Tensor:
    """The padded attention batch's additive mask [R, 1, g*Lm, S]: key position j is visible to a row
    iff low <= j <= high (row arrays [N], spread to the padded rows as layout.q_index does)."""
    low, high = low[layout.q_index], high[layout.q_index]
    keys = torch.arange(layout.max_keys, device=low.device)
    visible = (keys >= low[..., None]) & (keys <= high[..., None])
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    return additive.repeat(1, groups, 1)[:, None]


def convolve(conv, x, dynamic, base, inputs) -> torch.Tensor:
    """GroupedDynamicCausalConv.convolve over concatenated blocks [1, N, H]: the tap at offset o reads
    row n - o of the same block, exact zero before the block's first row."""
    _, n, h = x.shape
    blocks = x.view(1, n, conv.groups, conv.group_size)
    dynamic = dynamic.reshape(1, n, conv.kernel_size, conv.groups, 1)
    out = torch.zeros_like(blocks)
    for offset in range(len(inputs["shifts"]) + 1):
        if offset == 0:
            shifted = blocks
        else:
            shifted = torch.where(inputs["inside"][offset - 1], blocks[:, inputs["shifts"][offset - 1]],
                                  blocks.new_zeros(()))
        out = out + base[offset].view(1, 1, conv.groups, conv.group_size).to(x.dtype) * shifted
        out = torch.addcmul(out, dynamic[:, :, offset], shifted)
    return out.view(1, n, h)


def conv_prepare(conv, x, inputs):
    dynamic = linear.linear(conv.kernel_projection, x).view(*x.shape[:-1], 2, conv.kernel_size, conv.groups)
    return convolve(conv, x, dynamic[..., 0, :, :], conv.base_kernel[0], inputs), dynamic[..., 1, :, :]


def conv_finish(conv, y, dynamic, inputs):
    return convolve(conv, y, dynamic, conv.base_kernel[1], inputs)


def block_hidden(drafter, cache, layout, inputs) -> torch.Tensor:
    """DFlash2Drafter.forward_hidden over segments: every block [anchor, mask ...] -> the final-normed
    hidden [M, H] of its drafting rows (the rows after each anchor), blocks concatenated."""
    c = drafter.config
    x, delta = drafter.target.embed(inputs["block_ids"][None]), None
    if c.input_embedding_scale != 1.0:
        x = x * c.input_embedding_scale
    cos, sin = drafter.rope_cos[layout.positions], drafter.rope_sin[layout.positions]
    groups = c.num_heads // c.num_kv_heads
    masks = {kind: interval_mask(layout, low, high, groups, x.dtype) for kind, (low, high) in inputs["bounds"].items()}
    for i, layer in enumerate(drafter.layers):
        block_input, normed = add_rms_norm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
        normed, dynamic = conv_prepare(layer.attn_conv, normed, inputs)
        attn = layer.attn
        q = attn.project_to_cache(normed, cos, sin, layout.slots, cache.k[i], cache.v[i],
                                  q=linear.linear(attn.q, normed))
        attended = layout.attend(q, cache.k[i], cache.v[i], masks[layer_visibility(c, i)], attn.scale)
        attn_out = conv_finish(layer.attn_conv, linear.linear(attn.o, attended), dynamic, inputs)
        h, normed = add_rms_norm(block_input, attn_out, layer.mlp_norm.weight, layer.mlp_norm.eps)
        normed, dynamic = conv_prepare(layer.mlp_conv, normed, inputs)
        x, delta = h, conv_finish(layer.mlp_conv, layer.mlp(normed), dynamic, inputs)
    _, x = add_rms_norm(x, delta, drafter.norm.weight, drafter.norm.eps)
    return x[:, inputs["keep"]]


def select(drafter, group: list, plan: _BlockPlan, inputs, hidden) -> tuple:
    """CandidateSelector.select over every request's drafting rows (hidden [1, M, H]) at once: top-k of
    all rows in one call, then the walk, position p scoring every request's row p (its anchor, then its
    previous pick, as predecessor). Returns (drafts [M] in group order, per request its dense draft
    probabilities [drafts, V] at temperature > 0 or None)."""
    selector, vocab = drafter.candidate_selector, drafter.config.vocab_size
    unary, candidates = torch.topk(drafter.compute_logits(hidden)[0], selector.top_k, dim=-1, sorted=False)   # [M, k]
    projected = linear.linear(selector.hidden_projection, hidden)[0]                                        # [M, r]
    predecessor = inputs["anchors"]
    q_rows = {r: [] for r in plan.sampled}
    path = []
    for position in range(plan.walk):
        rows = inputs["walk_rows"][position]
        scores = unary[rows] + torch.einsum("br,bkr->bk", selector.predecessor_codebook(predecessor) * projected[rows],
                                            selector.successor_codebook(candidates[rows]))
        index = torch.argmax(scores, dim=-1)
        drawn = [r for r in plan.sampled if position < plan.drafts[r]]
        if drawn:                                 # each request's own draw, as its single-request selector's
            picks = [index[r:r + 1] for r in range(len(group))]
            for r in drawn:
                state = group[r]
                q = sampling_probs(scores[r:r + 1], state.req.temperature)
                picks[r] = sample_probs(q, state.generator)
                q_rows[r].append(q)
            index = torch.cat(picks)
        predecessor = candidates[rows].gather(-1, index[:, None])[:, 0]
        path.append(predecessor)
    drafts = torch.stack(path).view(-1)[inputs["path_index"]]
    probs = [None] * len(group)
    for r in plan.sampled:
        start, k = int(plan.draft_start[r]), plan.drafts[r]
        probs[r] = dense_draft_probs(candidates[None, start:start + k], torch.stack(q_rows[r], dim=1), vocab)[0]
    return drafts, probs
