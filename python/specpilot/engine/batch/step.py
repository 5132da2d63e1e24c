"""The draft and verify halves of a BatchEngine step, over groups of requests: the whole batch in
one forward (the batching mechanisms on) or one request per forward (off)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.accept import accepted_prefix, commit, new_tokens
from specpilot.verify.sampling import rejection_sample, sample_probs, sampling_probs

from . import forward
from .adaptive import top2_margin


@dataclass
class Draft:
    block: torch.Tensor               # int64 [rows]: the anchor, then the drafts
    rows: int
    probs: torch.Tensor | None        # [rows - 1, V] draft sampling probabilities (temperature > 0)
    margins: torch.Tensor | None      # [rows - 1] top-2 logit gaps (adaptive verify)


def _groups(states: list, together: bool) -> list:
    if not states:
        return []
    return [states] if together else [[s] for s in states]


def _take_context(state) -> tuple:
    """The request's committed rows not yet in the draft cache: (features [C, F], first position)."""
    feats, first = [f for f, _ in state.ctx], state.ctx[0][1]
    expect = first
    for f, pos in state.ctx:
        if pos != expect:
            raise RuntimeError(f"request {state.id}: draft context rows not contiguous ({pos} after {expect})")
        expect += f.shape[0]
    state.ctx = []
    return torch.cat(feats) if len(feats) > 1 else feats[0], first


def draft_all(engine, decoding: list) -> dict:
    """Request id -> Draft for every decoding request: its pending context appended to the draft cache,
    then its block [anchor, mask x (rows - 1)], rows = min(block, max_length - start), drafted."""
    drafter, mask = engine.drafter, engine.drafter.mask_token_id
    drafts = {}
    for group in _groups(decoding, engine.config.batched_draft):
        pending = [(s, *_take_context(s)) for s in group if s.ctx]
        if pending:
            layout = forward.Layout([forward.Segment(s.table, first, f.shape[0]) for s, f, first in pending],
                                    engine.page_size, engine.device)
            with engine.kernels(layout.positions.shape[0]):
                forward.draft_context(drafter, engine.draft_cache, layout, torch.cat([f for _, f, _ in pending]))
        blocks, segments = [], []
        for s in group:
            rows = min(engine.block_size, s.max_length - s.start)
            block = torch.full((rows,), mask, dtype=torch.long, device=engine.device)
            block[0] = s.tokens[-1]
            blocks.append(block)
            segments.append(forward.Segment(s.table, s.start, rows))
        layout = forward.Layout(segments, engine.page_size, engine.device)
        with engine.kernels(layout.positions.shape[0]):
            logits = forward.draft_block(drafter, engine.draft_cache, layout, torch.cat(blocks))
        greedy = torch.argmax(logits, dim=-1)                        # every row at once, on the device
        margins = top2_margin(logits) if engine.config.adaptive_verify else None   # one host transfer
        row = 0
        for s, block in zip(group, blocks):
            k = block.shape[0] - 1
            own, rows_, row = logits[row:row + k], slice(row, row + k), row + k
            r = s.req
            probs = None
            if r.temperature > 0:
                probs = sampling_probs(own[None], r.temperature, r.top_p)[0]
                block[1:] = sample_probs(probs[None], s.generator)[0]
            else:
                block[1:] = greedy[rows_]
                if r.replay is not None:              # the planned drafts (the drafter still ran)
                    block[1:] = r.replay.step_drafts(len(s.acceptance), s.start - s.prompt_len, block[None, 1:],
                                                     own.shape[-1])[0]
            drafts[s.id] = Draft(block=block, rows=k + 1, probs=probs,
                                 margins=margins[rows_] if margins is not None else None)
    return drafts


def verify_and_accept(engine, decoding: list, drafts: dict, lengths: dict, chunks: list) -> None:
    """The target over every decoding request's verify rows and every (state, rows) prefill chunk, then
    per request the accept / commit rule, or the prefill's bookkeeping (and first token)."""
    entries = []                                       # (state, segment, ids, verify?)
    for s in decoding:
        rows = lengths[s.id]
        ids = drafts[s.id].block[:rows] if s.id in drafts else torch.tensor([s.tokens[-1]], device=engine.device)
        entries.append((s, forward.Segment(s.table, s.start, rows), ids, True))
    for s, rows in chunks:
        ids = torch.tensor(list(s.req.prompt_ids[s.prefilled:s.prefilled + rows]), dtype=torch.long,
                           device=engine.device)
        entries.append((s, forward.Segment(s.table, s.prefilled, rows), ids, False))
    for group in _groups(entries, engine.config.ragged_verify):
        layout = forward.Layout([seg for _, seg, _, _ in group], engine.page_size, engine.device)
        logit_rows, at = [], 0
        for s, seg, _, verify in group:
            if verify:
                logit_rows.extend(range(at, at + seg.rows))
            elif s.prefilled + seg.rows == s.prompt_len:
                logit_rows.append(at + seg.rows - 1)      # the prompt's last row: the first token
            at += seg.rows
        with engine.kernels(at):
            logits, features = forward.target_forward(
                engine.target, engine.cache, layout, torch.cat([ids for _, _, ids, _ in group]),
                engine.feature_layers, torch.tensor(logit_rows, dtype=torch.long, device=engine.device))
        # Greedy requests' argmax and verify ids, for every request of the group in one host transfer.
        verify_ids = [ids for _, _, ids, verify in group if verify]
        host = torch.cat([torch.argmax(logits, dim=-1)] + verify_ids).tolist() if verify_ids else []
        posterior, blocks = host[:logits.shape[0]], host[logits.shape[0]:]
        at = lrow = brow = 0
        for s, seg, _, verify in group:
            feats = features[at:at + seg.rows] if features is not None else None
            at += seg.rows
            if verify:
                _accept(engine, s, drafts.get(s.id), seg.rows, logits[lrow:lrow + seg.rows], feats,
                        blocks[brow:brow + seg.rows], posterior[lrow:lrow + seg.rows])
                lrow += seg.rows
                brow += seg.rows
            else:
                if feats is not None:
                    s.ctx.append((feats, s.prefilled))
                s.prefilled += seg.rows
                if s.decoding:
                    _first_token(engine, s, logits[lrow:lrow + 1])
                    lrow += 1


def _first_token(engine, s, logits) -> None:
    s.tokens = [engine.sample_first(s, logits[None])]
    s.first_token_s = engine.clock()
    s.start = s.prompt_len
    s.stopped = s.tokens[0] in s.req.stop_ids


def _accept(engine, s, draft, rows: int, logits, features, block_list: list, posterior: list) -> None:
    """One request's verify rows (logits [rows, V]; on the host: its verify ids and the target's argmax
    per row) -> its committed tokens (engine/spec.py's rule)."""
    r = s.req
    block = draft.block[:rows] if draft is not None else torch.tensor([s.tokens[-1]], device=logits.device)
    if r.temperature > 0:
        target_probs = sampling_probs(logits[None], r.temperature, r.top_p)     # [1, rows, V]
        if rows == 1:
            accepted, new = 0, [int(sample_probs(target_probs[:, -1], s.generator)[0])]
        else:
            accepted, bonus = rejection_sample(block[None, 1:], target_probs, draft.probs[None, :rows - 1],
                                               s.generator)
            new = block[1:accepted + 1].tolist() + [int(bonus)]
    else:
        matched = int(accepted_prefix(torch.tensor([block_list[1:]]), torch.tensor([posterior]), rows - 1)[0])
        accepted = matched if r.replay is None else r.replay.accepted(len(s.acceptance), rows, matched)
        new = new_tokens(block_list, posterior, accepted)
    produced, s.stopped = commit(new, s.max_length - s.start - 1, set(r.stop_ids), s.tokens)
    if features is not None:
        s.ctx.append((features[:produced], s.start))
    s.start += produced
    s.acceptance.append(produced)
    if draft is not None and draft.margins is not None:
        engine.estimator.observe(draft.margins.tolist(), rows - 1, accepted)
