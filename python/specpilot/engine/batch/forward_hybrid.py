"""The varlen target forward of a hybrid recurrent target (HybridLM: Gated DeltaNet and gated
attention layers) over many requests' rows: forward.target_forward's hybrid twin.

All requests' rows are concatenated into one [1, N, H] activation, so every norm, MLP and projection
runs once over N rows. Gated attention layers write K/V at each row's paged slot and attend through
the layout's padded per-request batch (forward.Layout), with the model's own q/k norms, partial RoPE
and output gate (GatedAttention.heads / gated_output). Each GDN layer's input projection runs over
all rows; its short conv and recurrence run per request, continuing the request's slot state
(hybrid_state.RecurrentSlots) without writing it, and leave the conv window and the per-row states
for the commit. The rest of the layer (gated norm, output projection) runs over all rows again.

The arithmetic is HybridLM.forward_begun's, step for step; the recurrence takes the form the
single-request engine takes for the same rows: per-row states (the recurrent form) for verify rows
and for the prompt of a request whose whole prompt fits MAX_SNAPSHOT_T, the chunked form for
longer prompts (as its one-forward prefill).
"""
from __future__ import annotations

import numpy as np
import torch

from specpilot.engine.recurrent_state import MAX_SNAPSHOT_T
from specpilot.models.hybrid import project
from specpilot.ops import zero_centred

from .forward import Layout


def target_forward(engine, layout: Layout, ids: torch.Tensor, entries: list, logit_rows=None):
    """ids [N] at the layout's rows; entries[r]: (state, verifying) of segment r. Returns (logits [R, V]
    at `logit_rows` (None: all rows), features [N, F] or None) as forward.target_forward. A verify
    segment's recurrent record stays pending for its accept (RecurrentSlots.commit); a prefill
    chunk's rows are committed here."""
    target, cache, slots = engine.target, engine.cache, engine.recurrent
    feature_layers = engine.feature_layers
    c = target.config
    bounds = np.cumsum([0] + [seg.rows for seg in layout.segments]).tolist()
    for (s, verifying), seg in zip(entries, layout.segments):
        slots.begin(s.id, seg.rows, verifying or s.prompt_len <= MAX_SNAPSHOT_T)
    x, delta = target.embed(ids[None]), None                     # [1, N, H]
    cos, sin = target.rope_cos[layout.positions], target.rope_sin[layout.positions]
    sin_rows = zero_centred.rope_rows(sin) if zero_centred.takes(x) else None
    mask = layout.mask(c.num_heads // c.num_kv_heads, x.dtype)
    kv_index = {layer: j for j, layer in enumerate(c.attention_layers)}
    feats, last = {}, len(target.layers) - 1
    for i, layer in enumerate(target.layers):
        x, h = layer.attn_norm.add_norm(x, delta)
        if layer.recurrent:
            h = _gdn(layer.mixer, h, slots, entries, bounds)
        else:
            attn, j = layer.mixer, kv_index[i]
            q, k, v, gate = attn.heads(h, cos, sin, sin_rows)
            cache.k[j].index_copy_(2, layout.slots, k)
            cache.v[j].index_copy_(2, layout.slots, v)
            h = attn.gated_output(layout.attend(q, cache.k[j], cache.v[j], mask, attn.scale), gate,
                                  sin_rows is not None)
        x, h = layer.mlp_norm.add_norm(x, h)
        delta = layer.mlp(h)
        if i in feature_layers and i != last:
            x, delta = x + delta, None
            feats[i] = x
    _, x = target.norm.add_norm(x, delta)
    if last in feature_layers:
        feats[last] = x
    for (s, verifying), seg in zip(entries, layout.segments):
        if not verifying:
            slots.commit(s.id, seg.rows)                          # a prompt chunk: every row is committed
    features = torch.cat([feats[i] for i in feature_layers], dim=-1)[0] if feature_layers else None
    rows = x[0] if logit_rows is None else x[0, logit_rows]
    logits = project(target.lm_head, rows[None])[0] if rows.shape[0] else rows.new_zeros(0, c.vocab_size)
    return logits, features


def _gdn(mixer, h, slots, entries: list, bounds: list):
    """A GDN layer over the concatenated rows h [1, N, H]: projections over all rows, the conv and the
    recurrence per request from its slot state (recorded for the commit)."""
    qkv, z, beta_in, a = mixer.project_in(h)
    outs = []
    for (s, _), lo, hi in zip(entries, bounds[:-1], bounds[1:]):
        conv_state, state = slots.layer_state(s.id, mixer.layer)
        out, window, states = mixer.mix(qkv[:, lo:hi], beta_in[:, lo:hi], a[:, lo:hi], conv_state, state,
                                        slots.keeps_every_row(s.id))
        slots.stash(s.id, mixer.layer, window, states)
        outs.append(out)
    out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    return mixer.output(out, z, 1, h.shape[1])
