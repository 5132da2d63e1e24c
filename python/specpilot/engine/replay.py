"""AcceptanceReplay: the scale tier's fixed acceptance (random-weight models accept ~nothing).

The drafter still runs (its compute is real), then its tokens are overwritten with the target's own
transcript so that step i produces exactly trace[i] tokens (trace[i] - 1 accepted drafts + bonus),
capped by the block and the tail. The target verifies as usual; if its posterior disagrees with the
transcript earlier than planned (bf16 near-ties make a transcript from another run fork), the step is
counted in `shortfalls` and the planned count is kept anyway, so timings follow the trace.
Replay is a timing tool: its output equals the target's greedy output only while shortfalls == 0.
"""
from __future__ import annotations

import math


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

    def drafts(self, new_index: int, accept: int, count: int, vocab_size: int) -> list:
        """`count` draft tokens for the block whose anchor is new token `new_index`: the transcript's
        next `accept` tokens, then tokens that differ from the transcript (so they are rejected)."""
        out = []
        for j in range(count):
            pos = new_index + 1 + j
            want = self.transcript[pos] if pos < len(self.transcript) else None
            if j < accept and want is not None:
                out.append(want)
            else:
                out.append(((want if want is not None else 0) + 1) % vocab_size)
        return out
