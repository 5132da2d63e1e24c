"""Batched drafting with the PARD drafter (models/drafters/pard.py; PardSession is the single-request
behaviour reproduced here, request by request).

Each step a request's draft segment is [its committed tokens the drafter's cache lacks (the first step:
the whole prompt and the first token, i.e. the drafter's prompt prefill), pard_token x (K - 1)] at
positions `seen`.., K = the verify block's rows - 1; its last K rows' logits draft (the anchor's row the
first draft, each pard row the next). Every request of a group runs in ONE causal varlen forward of the
PARD model over the paged draft cache (forward.target_forward: the PARD model is a TargetLM). The pard
rows' K/V land past the anchor and are overwritten by the next step's committed tokens before any real
row reads them (PardSession's rule: slot == position). A request's committed rows beyond
BatchConfig.prefill_chunk (a long prompt) first go in in chunks of that size, so one long prompt does not
pad every request's attention batch to its length.

PARD-2: each row's input embedding adds target_proj(f) * scale, f the target's features at the
position before the row's (zeros before the first prompt token); the pard rows repeat the anchor's.
The features come from state.ctx (the prefill chunks' and each verify's committed rows).
"""
from __future__ import annotations

import numpy as np
import torch

from specpilot.verify.sampling import sample_probs, sampling_probs

from . import forward
from .draft_context import take_context


def pard_forward(drafter, cache, layout: forward.Layout, ids: torch.Tensor, features, logit_rows: torch.Tensor):
    """The PARD model over the layout's rows (ids [N]; PARD-2 features [N, F] or None) -> logits of
    the rows `logit_rows` [M, V]. Causal per segment, K/V into `cache` at the rows' slots."""
    model = drafter.model
    if features is not None:     # FusedEmbedding adds it to the token embeddings (PardDrafter.forward_tokens)
        fused = drafter.target_proj(features[None].to(drafter.target_proj.weight.dtype))
        model.embed.extra = fused * drafter.config.feature_scale
    try:
        logits, _ = forward.target_forward(model, cache, layout, ids, (), logit_rows)
    finally:
        if features is not None:
            model.embed.extra = None
    return logits


class Drafting:
    def __init__(self, engine):
        self.engine, self.drafter = engine, engine.drafter
        self.pard2 = self.drafter.config.pard2
        self.seen = {}            # request id -> positions 0..seen - 1 of its committed tokens are in the draft cache

    def release(self, state) -> None:
        self.seen.pop(state.id, None)

    def propose(self, group: list, segments: list) -> tuple:
        for s, seg in zip(group, segments):
            if seg.rows < 2 or seg.start != s.start:
                raise RuntimeError(f"request {s.id}: a PARD draft needs a block of >= 2 rows at its anchor "
                                   f"(got {seg.rows} rows at {seg.start}, anchor at {s.start})")
        pending = [self._pending(s) for s in group]
        self._catch_up(group, pending)
        pard, counts = self.drafter.mask_token_id, [seg.rows - 1 for seg in segments]
        rows = [(first, tokens + [pard] * (k - 1), None if f is None else torch.cat([f, f[-1:].expand(k - 1, -1)]))
                for (first, tokens, f), k in zip(pending, counts)]
        ends = np.cumsum([len(ids) for _, ids, _ in rows])
        logits = self._forward(group, rows, np.concatenate([np.arange(e - k, e) for e, k in zip(ends, counts)]))
        for s in group:
            self.seen[s.id] = s.start + 1           # up to the anchor; the pard rows get overwritten
        return self._drafts(group, counts, logits)

    def _pending(self, s) -> tuple:
        """(first position, the committed tokens from it to the anchor, PARD-2 their feature rows)."""
        first = self.seen.get(s.id, 0)
        tokens = self._committed(s, first)
        return first, tokens, self._features(s, first, len(tokens)) if self.pard2 else None

    def _catch_up(self, group: list, pending: list) -> None:
        """Committed rows beyond prefill_chunk (a newcomer's prompt) go into the draft cache first, in
        forwards of at most prefill_chunk rows a request (the padded attention batch stays bounded)."""
        chunk = self.engine.config.prefill_chunk
        while True:
            late = [i for i, (_, tokens, _) in enumerate(pending) if len(tokens) > chunk]
            if not late:
                return
            self._forward([group[i] for i in late],
                          [(pending[i][0], pending[i][1][:chunk], None if pending[i][2] is None else pending[i][2][:chunk])
                           for i in late], np.zeros(0, dtype=np.int64))
            for i in late:
                first, tokens, f = pending[i]
                pending[i] = (first + chunk, tokens[chunk:], None if f is None else f[chunk:])
                self.seen[group[i].id] = first + chunk

    def _forward(self, group: list, rows: list, logit_rows: np.ndarray) -> torch.Tensor:
        """One forward over the requests' rows [(first position, ids, PARD-2 features or None)]."""
        engine = self.engine
        segments = [forward.Segment(s.pages, first, len(ids)) for s, (first, ids, _) in zip(group, rows)]
        layout = forward.Layout(segments, engine.page_size, engine.staging,
                                extra=[np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids, _ in rows]),
                                       logit_rows])
        ids_dev, rows_dev = layout.extra
        features = torch.cat([f for _, _, f in rows]) if self.pard2 else None
        with engine.kernels(ids_dev.shape[0]):
            return pard_forward(self.drafter, engine.draft_cache, layout, ids_dev, features, rows_dev)

    @staticmethod
    def _committed(s, first: int) -> list:
        """The request's committed tokens at positions first..start (prompt, then generated)."""
        n = s.prompt_len
        prompt = [int(t) for t in s.req.prompt_ids[first:]] if first < n else []
        return prompt + list(s.tokens[max(first - n, 0):])

    def _features(self, s, first: int, real: int) -> torch.Tensor:
        """PARD-2: the feature rows of the `real` committed rows from `first`: row p gets the target's
        feature at p - 1 (zeros for p = 0), taken from state.ctx."""
        need = max(first - 1, 0)
        feats, at = take_context(s) if s.ctx else (None, need)
        have = 0 if feats is None else feats.shape[0]
        want = real - (1 if first == 0 else 0)
        if at != need or have != want:
            raise RuntimeError(f"request {s.id}: PARD-2 needs target features of positions {need}..{need + want - 1}, "
                               f"the context holds {have} from {at}")
        if first == 0:
            feats = torch.cat([torch.zeros_like(feats[:1]), feats])
        return feats

    @staticmethod
    def _drafts(group: list, counts: list, logits: torch.Tensor) -> tuple:
        """Greedy: the argmax rows; sampled: each request's K draws from its own generator, as
        PardSession.propose (top_p as the batched DFlash draft applies it)."""
        drafted = torch.argmax(logits, dim=-1)
        probs, at = [], 0
        for s, k in zip(group, counts):
            p = None
            if s.req.temperature > 0:
                p = sampling_probs(logits[None, at:at + k], s.req.temperature, s.req.top_p)[0]
                drafted[at:at + k] = sample_probs(p[None], s.generator)[0]
            probs.append(p)
            at += k
        return drafted, probs
