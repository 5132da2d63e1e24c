"""The speculative loop for drafters that propose differently from DFlash (DFlash2's selector,
DSpark's Markov head, PARD's own causal model), through one small interface: a per-generation
drafting session.

    session = drafter.session(engine, block_size)
    session.uses_features                      # whether it reads target features (prefill, verify)
    session.begin(prompt_ids [1, n], first_token, features [1, n, F] or None)
    session.propose(anchor, start, num_drafts, temperature, generator)
        -> (drafts int64 [1, K], draft probs fp32 [1, K, V] or None at T = 0)
    session.accept(new_tokens, start, features [1, vs, F] or None)
        # after commit: the tokens committed this step (positions start+1..), the verify features

The verify / accept / commit are run_spec's, stated once in engine/accept.py (greedy) and
verify/sampling.py (rejection sampling); DFlashSession puts the DFlash drafter behind the same
interface (tests check this loop with it equals run_spec). The DFlash fast paths (run_spec, the
fused graphed step) are untouched: Engine.generate_spec sends only the other kinds here.
"""
from __future__ import annotations

import torch

from specpilot.verify.sampling import sample, sample_probs, sampling_probs

from .accept import accepted_prefix, commit, new_tokens
from .result import GenerationResult
from .spec import sampled_new_tokens


def run_spec_session(engine, ids, max_new_tokens, stop_ids, temperature, block_size, policy, generator):
    runner, vocab = engine.runner, engine.target.config.vocab_size
    n = ids.shape[1]
    max_length, stop = n + max_new_tokens, set(stop_ids)
    session = new_session(engine, block_size)
    features_on = block_size > 1 and session.uses_features

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=features_on)
    tokens = [int(sample(logits, temperature, generator).item())]
    if block_size > 1:
        session.begin(ids, tokens[0], features)
    t1 = engine.clock()

    acceptance, start = [], n
    stopped = tokens[0] in stop
    while start + 1 < max_length and not stopped:
        step = len(acceptance)
        vs = min(block_size, max_length - start)
        block = torch.empty((1, vs), dtype=torch.long, device=engine.device)
        block[0, 0] = tokens[-1]
        draft_probs = None
        if vs > 1:                                                          # draft
            drafts, draft_probs = session.propose(tokens[-1], start, vs - 1, temperature, generator)
            block[:, 1:] = policy.step_drafts(step, start - n, drafts, vocab)
        logits, features = runner.target_step(block, start, with_features=vs > 1 and features_on,  # verify
                                              graphed=vs == block_size)
        if temperature > 0:                                                 # accept
            new = sampled_new_tokens(block, logits, draft_probs, temperature, generator)
        else:
            posterior = torch.argmax(logits, dim=-1)
            matched = accepted_prefix(block[:, 1:], posterior, vs - 1)
            packed = torch.cat([matched, block[0], posterior[0]]).tolist()
            new = new_tokens(packed[1:1 + vs], packed[1 + vs:], policy.accepted(step, vs, packed[0]))
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)   # commit
        if vs > 1:
            session.accept(tokens[-produced:], start, features)
        start += produced
        acceptance.append(produced)

    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=engine.clock() - t1, steps=len(acceptance), replay_shortfalls=policy.shortfalls)


def new_session(engine, block_size: int):
    """The drafter's per-generation session (DFlash's through DFlashSession)."""
    return (getattr(engine.drafter, "session", None) or DFlashSession)(engine, block_size)


class DFlashSession:
    """The DFlash drafter behind the session interface (argmax or sampled drafts of its logits)."""
    uses_features = True

    def __init__(self, engine, block_size: int):
        self.runner, self.mask_token_id, self.block_size = engine.runner, engine.drafter.mask_token_id, block_size
        self.ctx = self.ctx_start = None

    def begin(self, prompt_ids, first_token: int, features) -> None:
        self.ctx, self.ctx_start = features, 0

    def propose(self, anchor: int, start: int, num_drafts: int, temperature: float, generator):
        block = torch.full((1, num_drafts + 1), self.mask_token_id, dtype=torch.long, device=self.ctx.device)
        block[0, 0] = anchor
        logits = self.runner.draft_step(self.ctx, self.ctx_start, block, start, self.block_size)
        if temperature > 0:
            probs = sampling_probs(logits, temperature)
            return sample_probs(probs, generator), probs
        return torch.argmax(logits, dim=-1), None

    def accept(self, new_tokens: list, start: int, features) -> None:
        self.ctx, self.ctx_start = features[:, :len(new_tokens)], start
