"""Batched drafting with the DSpark drafter (models/drafters/dspark.py; kind_drafting.py's contract).

Per group, eager: the pending target features of every request go to the paged draft cache in one
context append (forward.draft_context: fc / hidden_norm, as DFlash), then one block forward over all
requests. A verify block of `rows` rows (anchor + rows - 1 drafts) is drafted by a draft block of
rows - 1 rows [anchor, mask x (rows - 2)] at positions start .. start + rows - 2, non-causal within
the block, in which EVERY row drafts (DSparkSession.propose): so the draft block's rows, concatenated
in group order, are exactly the group's drafts, and the drafted tensor is indexed like them.

The forward is DSparkDrafter.forward_hidden over segments (the drafter's own embedding, its layers,
its final norm); the LM head runs once over all rows. The sequential Markov head then goes row by
row k, over every request whose block has a row k at once (one [R_k, rank] -> [R_k, V] product per
row; shorter blocks drop out), as DSparkDrafter.draft: logits_k = base_k + W2(W1[x_{k-1}]), x_0 the
anchor, x_k the argmax (T = 0) or a draw of softmax(logits_k / T) from the request's own generator.

Sampling: DSparkDrafter.draft draws from softmax(logits / T) and has no top_p; so do the batched
drafts (a request's top_p shapes only the target's distribution in the accept, step.py, which stays
lossless: the drafts are draws from the q handed to rejection sampling).

Confidence head: scheduling only. The last step's per-request confidence [rows - 1] (None without
the head) is kept in `self.confidence` (request id -> tensor); it never changes a draft.
"""
from __future__ import annotations

import numpy as np
import torch

from specpilot.ops import linear
from specpilot.verify.sampling import sample_probs, sampling_probs

from . import forward
from .draft_context import append_context


class Drafting:
    def __init__(self, engine):
        self.engine, self.drafter = engine, engine.drafter
        self.confidence = {}                 # request id -> the last step's confidence [drafts] (or None)

    def propose(self, group: list, segments: list) -> tuple:
        """kind_drafting.py's propose: request r's verify segment of `rows` rows -> its draft block
        segment of rows - 1 rows at the same start, all of them drafting."""
        engine, d = self.engine, self.drafter
        append_context(self.engine, group)
        blocks = [forward.Segment(seg.pages, seg.start, seg.rows - 1) for seg in segments]
        counts = [b.rows for b in blocks]
        offsets = np.cumsum([0] + counts)[:-1]
        block_ids = np.full(sum(counts), d.mask_token_id, dtype=np.int64)
        block_ids[offsets] = [s.tokens[-1] for s in group]
        rows_at = [offsets[[r for r, n in enumerate(counts) if n > k]] + k for k in range(max(counts))]
        layout = forward.Layout(blocks, engine.page_size, engine.staging, last=forward.block_last(blocks),
                                extra=[block_ids, *rows_at])
        ids, rows_at = layout.extra[0], layout.extra[1:]
        with engine.kernels(ids.shape[0]):
            hidden = block_hidden(d, engine.draft_cache, layout, ids)
            drafted, logits, confidence = self._markov(group, counts, rows_at, hidden, ids)
        probs = []
        for s, off, n in zip(group, offsets, counts):
            t = s.req.temperature
            probs.append(sampling_probs(logits[None, off:off + n], t)[0] if t > 0 else None)
            self.confidence[s.id] = confidence[off:off + n] if confidence is not None else None
        return drafted, probs

    def release(self, state) -> None:
        self.confidence.pop(state.id, None)

    def _markov(self, group, counts, rows_at, hidden, ids) -> tuple:
        """DSparkDrafter.draft over the group: row k of every block that has one in one product.
        -> (drafts int64 [N], corrected logits [N, V] (None when every request is greedy),
        confidence [N] or None)."""
        d = self.drafter
        base = linear.linear(d.lm_head, hidden[None])[0]                         # [N, V]
        drafted = torch.empty(base.shape[0], dtype=torch.long, device=base.device)
        logits = torch.empty_like(base) if any(s.req.temperature > 0 for s in group) else None
        confidence = torch.empty(base.shape[0], dtype=torch.float32, device=base.device) if d.confidence is not None else None
        for k, rows in enumerate(rows_at):
            prev = ids[rows] if k == 0 else drafted[rows - 1]                     # x_{k-1}: the anchor, then row k-1's pick
            prev_embedding = d.markov_w1(prev)                                    # [R_k, rank]
            if confidence is not None:
                features = hidden[rows]
                if d.config.confidence_with_markov:
                    features = torch.cat([features, prev_embedding.to(hidden.dtype)], dim=-1)
                confidence[rows] = torch.sigmoid(linear.linear(d.confidence, features).float())[:, 0]
            step = base[rows] + linear.linear(d.markov_w2, prev_embedding)       # [R_k, V]
            picks = torch.argmax(step, dim=-1)
            active = [s for s, n in zip(group, counts) if n > k]
            for j, s in enumerate(active):                                       # sampled: each its own generator
                if s.req.temperature > 0:
                    picks[j] = sample_probs(sampling_probs(step[j:j + 1], s.req.temperature), s.generator)[0]
            drafted[rows] = picks
            if logits is not None:
                logits[rows] = step
        return drafted, logits, confidence


def block_hidden(drafter, cache, layout, block_ids: torch.Tensor) -> torch.Tensor:
    """DSparkDrafter.forward_hidden over segments: block ids [N] -> final-normed hidden [N, H] of every
    row (the layout built with forward.block_last: each row sees its request's context and whole block)."""
    return forward.draft_layers(drafter, cache, layout, drafter.embed(block_ids[None]))[0]   # its own embedding, unscaled
