"""Prefix-first verification (BatchConfig.verify_prefix = P; docs/two_level.md, issue 36 C2): a
step's verify in two target passes, so that requests whose drafts fail early verify fewer rows.

  pass 1  every decoding request's first min(P, rows) block rows (anchor + P-1 drafts), beside the
          newcomers' prefill chunks. Its rows judge drafts 1..P (row j judges draft j+1; greedy reads
          draft P back with the pass's argmax). A request that rejects one of them, or whose block
          ends inside the prefix, commits from pass 1 alone.
  pass 2  only the requests that accepted all P drafts: block rows P..rows-1, appended after the
          prefix's K/V that pass 1 wrote (a causal row sees the same keys as in one pass over the
          block). Their decision is made over both passes' rows.
Both passes run graphed (padded R x T layouts with T = P and T = block - P) where the one-pass verify
would, else eager and varlen. On a hybrid target the P rows of pass 1 (anchor and P-1 accepted drafts)
are committed to a pass-2 request's recurrent state before pass 2 (RecurrentSlots.advance), so pass 2
continues the state the one-pass forward reaches after them.

Lossless: each row's logits are the one-pass forward's (same rows, same keys), and the decision is the
single-request rule on them. Sampled: the uniforms of the whole block are drawn in pass 1, in the one
torch.rand call rejection_sample makes, and the final draw (residual or bonus) comes after, from the
same row's probabilities: the request's generator makes the same draws in the same order as
verify.sampling.rejection_sample over the whole block (tests/test_batch_prefix_first.py)."""
from __future__ import annotations

import numpy as np
import torch

from specpilot.engine.accept import matched_drafts, new_tokens
from specpilot.verify.sampling import residual_probs, sample_probs, sampling_probs

from . import step


def verify_and_accept(engine, decoding: list, drafts: dict, chunks: list) -> None:
    p = engine.config.verify_prefix
    first = {s.id: (0, min(p, drafts[s.id].rows)) for s in decoding}
    peek = [s for s in decoding if s.req.temperature == 0 and drafts[s.id].rows > p]
    results, peeked = step.verify(engine, decoding, drafts, first, chunks, p, _draft_at(engine, peek, drafts, p))
    peeked = dict(zip((s.id for s in peek), peeked or ()))
    pending = {}                        # id -> what pass 2 continues from
    for s, logits, features, ids, posterior in results:
        d = drafts[s.id]
        if d.rows <= p:                 # the whole block was in pass 1
            step._accept(engine, s, d, d.rows, logits, features, ids, posterior)
            continue
        features = features.clone() if features is not None else None   # a graph's outputs are reused by pass 2
        state = _judge_sampled(s, d, logits, p) if s.req.temperature > 0 else _judge_greedy(s, d, ids + [peeked[s.id]], posterior, p)
        if state[0] == "commit":
            _, accepted, new = state
            step.commit_step(engine, s, d, d.rows, accepted, new, features)
            engine.verify_rows -= d.rows - p                 # _iterate counted the whole block
        else:
            pending[s.id] = (s, state[1], ids, posterior, features)   # pass 2 decides
            if engine.recurrent is not None:    # a hybrid's state: pass 2 continues after pass 1's P rows
                engine.recurrent.advance(s.id, p)
    if not pending:
        return
    states = [entry[0] for entry in pending.values()]
    engine.second_passes += 1
    engine.second_pass_requests += len(states)
    rest = {s.id: (p, drafts[s.id].rows - p) for s in states}
    results, _ = step.verify(engine, states, drafts, rest, [], engine.block_size - p)
    for s, logits, features, ids, posterior in results:
        _, uniforms, ids1, posterior1, features1 = pending[s.id]
        d = drafts[s.id]
        both = torch.cat([features1, features]) if features is not None else None
        if s.req.temperature > 0:
            accepted, new = _finish_sampled(s, d, logits, uniforms, p)
            step.commit_step(engine, s, d, d.rows, accepted, new, both)
        else:
            step._accept(engine, s, d, d.rows, None, both, ids1 + ids, posterior1 + posterior)


def _draft_at(engine, states: list, drafts: dict, row: int):
    """The device tensor of each state's block token at `row` (read back with pass 1), or None."""
    if not states:
        return None
    pieces = []
    for s in states:
        if all(t is not drafts[s.id].blocks for t in pieces):
            pieces.append(drafts[s.id].blocks)
    base = np.cumsum([0] + [t.shape[0] for t in pieces])
    index = [base[next(i for i, t in enumerate(pieces) if t is drafts[s.id].blocks)] + drafts[s.id].offset + row
             for s in states]
    (index,) = engine.staging.upload([np.asarray(index, dtype=np.int64)])
    return (pieces[0] if len(pieces) == 1 else torch.cat(pieces))[index]


def _judge_greedy(s, d, block: list, posterior: list, p: int):
    """Pass 1 of a greedy request (block: anchor and drafts 1..P; posterior: rows 0..P-1):
    ("commit", accepted, new) when a draft among 1..P is rejected (or a replay plans fewer), else
    ("pass 2", None). A replay's shortfall is counted once, by step._accept or here."""
    matched = matched_drafts(block, posterior)
    replay = s.req.replay
    if replay is None:
        if matched == p:
            return "pass 2", None
        accepted = matched
    else:
        if replay.produced_at(len(s.acceptance), d.rows) - 1 >= p:
            return "pass 2", None
        accepted = replay.accepted(len(s.acceptance), d.rows, matched)
    return "commit", accepted, new_tokens(block, posterior, accepted)


def _judge_sampled(s, d, logits, p: int):
    """Pass 1 of a sampled request: the block's uniforms (rejection_sample's one torch.rand call),
    then drafts 1..P against rows 0..P-1. ("commit", accepted, new) on a rejection among them (the
    residual drawn from its row), else ("pass 2", uniforms)."""
    k = d.rows - 1
    block = d.block
    uniforms = torch.rand((1, k), generator=s.generator, device=d.probs.device, dtype=d.probs.dtype)
    target_probs = sampling_probs(logits[None], s.req.temperature, s.req.top_p)        # [1, P, V]
    accepted = _accepted(block[None, 1:p + 1], target_probs, d.probs[None, :p], uniforms[:, :p])
    if accepted == p:
        return "pass 2", uniforms
    residual = residual_probs(target_probs[0, accepted], d.probs[accepted])
    return "commit", accepted, block[1:accepted + 1].tolist() + [int(sample_probs(residual[None], s.generator)[0])]


def _finish_sampled(s, d, logits, uniforms, p: int) -> tuple:
    """Pass 2 of a sampled request (logits: rows P..rows-1): drafts P+1..K, then the residual at the
    first rejection or the bonus from the last row, as rejection_sample. (accepted, new)."""
    k = d.rows - 1
    block = d.block
    target_probs = sampling_probs(logits[None], s.req.temperature, s.req.top_p)        # [1, rows - P, V]
    accepted = p + _accepted(block[None, p + 1:k + 1], target_probs[:, :k - p], d.probs[None, p:k], uniforms[:, p:])
    if accepted == k:
        last = sample_probs(target_probs[:, -1], s.generator)[0]
    else:
        last = sample_probs(residual_probs(target_probs[0, accepted - p], d.probs[accepted])[None], s.generator)[0]
    return accepted, block[1:accepted + 1].tolist() + [int(last)]


def _accepted(tokens, target_probs, draft_probs, uniforms) -> int:
    """rejection_sample's acceptance over these drafts: the leading run of `u * q < p`."""
    p = target_probs.gather(-1, tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, tokens[..., None])[..., 0]
    return int((uniforms * q < p).to(torch.int32).cumprod(-1).sum(-1)[0].item())
