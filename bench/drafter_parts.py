"""A drafter's greedy draft step as the engine runs it, in steady state, and the same step without its
extra part, for bench/drafter_steps.py.

`steady_draft(engine, block_size, context, produced)` prefills `context` random tokens, runs one
draft + verify and commits `produced` tokens through the drafter's session (engine/spec_session.py),
so the next draft sees what a decode step sees: a few new context rows, a full block, its graphed
path. Its `step()` is the session's greedy propose at that point (idempotent: it rewrites the same
draft-cache slots, so it can be timed back to back).

`without_extra(s)`: the step minus the part each kind adds over a plain argmax drafter (None for
DFlash), graphed the same way:
  dflash2  the candidate selector (top-k and the sequential walk) -> argmax of the same logits
  dspark   the sequential Markov head and the confidence head -> argmax of lm_head(hidden)
  pard     the fixed 2K-row input (pending tokens, pard rows, padding, drafts picked at a device
           offset) -> K rows [anchor, pard x (K - 1)], unpadded
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.block_draft import block_draft
from specpilot.engine.spec_session import new_session
from specpilot.ops import linear

EXTRA_PART = {"dflash2": "candidate selector", "dspark": "Markov + confidence heads", "pard": "pard rows padded to 2K"}


@dataclass
class SteadyDraft:
    engine: object
    session: object
    anchor: int
    start: int            # the anchor's position
    drafts: int           # K: tokens each step drafts (block_size - 1)

    def step(self):
        return self.session.propose(self.anchor, self.start, self.drafts, 0.0, None)[0]


@torch.inference_mode()
def steady_draft(engine, block_size: int, context: int, produced: int) -> SteadyDraft:
    if not 1 <= produced <= block_size - 1:
        raise ValueError(f"produced={produced} must be in 1..{block_size - 1} (the drafts of a block of {block_size})")
    runner, vocab = engine.runner, engine.target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, min(256, vocab - 2), (1, context), generator=gen).to(engine.device)
    session = new_session(engine, block_size)
    logits, features = runner.prefill(prompt, with_features=session.uses_features)
    first = int(torch.argmax(logits[0, -1]).item())
    session.begin(prompt, first, features)
    k = block_size - 1
    drafts, _ = session.propose(first, context, k, 0.0, None)                # the whole prompt as context
    block = torch.cat([torch.tensor([[first]], device=engine.device), drafts.reshape(1, k)], dim=1)
    _, verify_features = runner.target_step(block, context, with_features=session.uses_features)
    new = block[0, 1:1 + produced].tolist()                                  # as if `produced` were committed
    session.accept(new, context, verify_features)
    return SteadyDraft(engine, session, new[-1], context + produced, k)


def _block(session, anchor: int, rows: int, device):
    block = torch.full((1, rows), session.drafter.mask_token_id, dtype=torch.long, device=device)
    block[0, 0] = anchor
    return block


def without_extra(s: SteadyDraft):
    """A function of no arguments: the steady step without its kind's extra part (None for DFlash)."""
    kind = getattr(s.engine.drafter, "kind", "dflash")
    if kind == "dflash2":
        return _dflash2_argmax(s)
    if kind == "dspark":
        return _dspark_plain_head(s)
    if kind == "pard":
        return _pard_unpadded(s)
    return None


def _dflash2_argmax(s: SteadyDraft):
    session, engine = s.session, s.engine

    def fn(ctx, ctx_positions, block, block_positions, kv_len):
        hidden = session._hidden(ctx, ctx_positions, block, block_positions, kv_len)
        with engine.runner.kernel_ctx(block.shape[1]):
            return torch.argmax(session.drafter.compute_logits(hidden), dim=-1)

    def step():
        block = _block(session, s.anchor, s.drafts + 1, engine.device)
        return block_draft(engine, "dflash2-argmax", fn, session.ctx, session.ctx_start, block, s.start,
                           session.block_size)
    return step


def _dspark_plain_head(s: SteadyDraft):
    session, engine = s.session, s.engine
    d = session.drafter

    def fn(ctx, ctx_positions, block, block_positions, kv_len):
        with engine.runner.kernel_ctx(block.shape[1]):
            d.write_context(ctx, ctx_positions, engine.draft_cache)
            hidden = d.forward_hidden(block, block_positions, engine.draft_cache, kv_len)
            return torch.argmax(linear.linear(d.lm_head, hidden), dim=-1)

    def step():
        block = _block(session, s.anchor, s.drafts, engine.device)        # every DSpark row drafts
        return block_draft(engine, "dspark-plain-head", fn, session.ctx, session.ctx_start, block, s.start,
                           session.block_size - 1)
    return step


def _pard_unpadded(s: SteadyDraft):
    engine, runner, d, k = s.engine, s.engine.runner, s.session.drafter, s.drafts
    span = runner.kv_span(s.start + k) if runner.use_graphs else s.start + k

    def fn(ids, positions):
        with runner.kernel_ctx(k):
            logits, _ = d.model(ids, positions, engine.draft_cache, span)
        return torch.argmax(logits, dim=-1)

    def step():
        ids = _block(s.session, s.anchor, k, engine.device)
        positions = torch.arange(s.start, s.start + k, device=engine.device)
        if not runner.use_graphs:
            return fn(ids, positions)
        key = ("pard-unpadded", k, span)
        if key not in runner.graphs:
            runner.graphs[key] = runner.step_factory(fn, (ids, positions), runner.pool)
        return runner.graphs[key](ids, positions)
    return step
