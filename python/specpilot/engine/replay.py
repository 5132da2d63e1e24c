"""AcceptanceReplay: the scale tier's fixed acceptance (random-weight models accept ~nothing).

The drafter still runs (its compute is real), then its tokens are overwritten with the target's own
transcript so that step i produces exactly trace[i] tokens (trace[i] - 1 accepted drafts + bonus),
capped by the block and the tail. The target verifies as usual; if its posterior disagrees with the
transcript earlier than planned (bf16 near-ties make a transcript from another run fork), the step is
counted in `shortfalls` and the planned count is kept anyway, so timings follow the trace.
Replay is a timing tool: its output equals the target's greedy output only while shortfalls == 0.

Both speculative loops (engine/spec.py) take an acceptance policy: `GREEDY` (the target decides) or
an AcceptanceReplay. The stepwise loop asks it for each step's drafts (`step_drafts`) and accepted
count (`accepted`); the graphed step reads the same plan from device tables (`device_plan`) that the
host fills before the clock, and the host still asks `accepted` for the count it commits.
"""
from __future__ import annotations

import math

import torch

from .accept import produced_count


class GreedyAcceptance:
    """The default policy: the drafter's tokens, the target's accepted count."""

    replays = False
    shortfalls = 0

    def step_drafts(self, step: int, start_offset: int, drafted: torch.Tensor, vocab_size: int) -> torch.Tensor:
        return drafted

    def accepted(self, step: int, verify_size: int, matched: int) -> int:
        return matched


GREEDY = GreedyAcceptance()


def tau_pattern(tau: float, steps: int, block_size: int) -> list:
    """A repeating integer pattern with mean `tau`: step i produces floor((i+1)tau) - floor(i tau)."""
    if not 1 <= tau <= block_size:
        raise ValueError(f"replay tau={tau} must be in [1, block_size={block_size}]")
    return [math.floor((i + 1) * tau + 1e-9) - math.floor(i * tau + 1e-9) for i in range(steps)]


class AcceptanceReplay:
    def __init__(self, transcript, trace):
        self.transcript = [int(t) for t in transcript]   # the target's new tokens for this prompt
        if isinstance(trace, (int, float)) and not isinstance(trace, bool):
            self.tau, self.trace = float(trace), None
        else:
            trace = [int(a) for a in trace]
            if not trace or any(a < 1 for a in trace):
                raise ValueError(f"replay trace must be a non-empty list of ints >= 1, got {trace[:10]}")
            self.tau, self.trace = None, trace
        self.shortfalls = 0

    def produced_at(self, step: int, block_size: int) -> int:
        """Tokens step `step` should produce (before the tail cap)."""
        if self.trace is not None:
            return min(self.trace[step % len(self.trace)], block_size)
        lo, hi = math.floor(step * self.tau + 1e-9), math.floor((step + 1) * self.tau + 1e-9)
        return max(1, min(hi - lo, block_size))

    replays = True

    def step_drafts(self, step: int, start_offset: int, drafted: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """drafted [1, vs-1] (the drafter's, computed for its cost) -> the planned drafts of step `step`,
        whose anchor is new token `start_offset`."""
        planned = torch.tensor([self.planned_drafts(step, start_offset, drafted.shape[1], vocab_size)], dtype=torch.long)
        if drafted.is_cuda:   # from pinned memory: a pageable copy would wait for the draft step, a sync real drafts lack
            return planned.pin_memory().to(drafted.device, non_blocking=True)
        return planned

    def planned_drafts(self, step: int, start_offset: int, count: int, vocab_size: int) -> list:
        """The `count` planned drafts of step `step` (block count + 1) as a host list."""
        return self.drafts(start_offset, self.produced_at(step, count + 1) - 1, count, vocab_size)

    def accepted(self, step: int, verify_size: int, matched: int) -> int:
        """The planned accepted count; a step where the target accepted fewer is a shortfall."""
        planned = self.produced_at(step, verify_size) - 1
        self.shortfalls += matched < planned
        return planned

    def device_plan(self, block_size: int, prompt_len: int, max_length: int, vocab_size: int):
        """Every step's (drafts [steps, B-1], accepted [steps]) of a generation prompt_len -> max_length:
        with planned counts, each step's position is known in advance (a step makes >= 1 token)."""
        drafts, accepted, start = [], [], prompt_len
        while start + 1 < max_length:
            want = self.produced_at(len(accepted), min(block_size, max_length - start))
            drafts.append(self.drafts(start - prompt_len, want - 1, block_size - 1, vocab_size))
            accepted.append(want - 1)
            start += produced_count(want - 1, max_length - start - 1)
        return (torch.tensor(drafts, dtype=torch.long).view(-1, block_size - 1),
                torch.tensor(accepted, dtype=torch.long))

    def drafts(self, new_index: int, accept: int, count: int, vocab_size: int) -> list:
        """`count` draft tokens for the block whose anchor is new token `new_index`: the transcript's
        next `accept` tokens, then tokens that differ from the transcript (so they are rejected)."""
        window = self.transcript[new_index + 1:new_index + 1 + count]    # shorter past the transcript's end
        kept = window[:max(accept, 0)]
        # past the accepted ones: the transcript's token + 1, or token 1 where the transcript has ended
        return kept + [(want + 1) % vocab_size for want in window[len(kept):]] + [1 % vocab_size] * (count - len(window))
