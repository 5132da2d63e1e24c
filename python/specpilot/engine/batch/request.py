"""A batched request, its result, and the engine's per-request state."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from specpilot.engine.result import GenerationResult
from specpilot.verify.sampling import validate_sampling


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None          # the request's own torch.Generator; None: the device's default one
    stop_ids: tuple = ()
    replay: object = None            # an AcceptanceReplay (engine/replay.py) forcing each step's accepted count:
                                     # a benchmark device for random-weight pairs; greedy only


@dataclass
class BatchResult(GenerationResult):
    """GenerationResult of one request (tokens, acceptance lengths; prefill_s: submit to first token,
    i.e. TTFT including queueing; decode_s: first token to finish), with its id and error (None: it
    finished normally; else why it was refused, failed or cancelled; the tokens made so far stay)."""
    request_id: int = -1
    error: str | None = None


def request_problem(req, vocab_size: int) -> str | None:
    """What is wrong with `req` as a request (None: nothing)."""
    if not isinstance(req, Request):
        return f"submit() takes a Request, got {type(req).__name__}"
    if len(req.prompt_ids) == 0:
        return "empty prompt: at least one prompt token is needed"
    if isinstance(req.max_new_tokens, bool) or not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 1:
        return f"max_new_tokens={req.max_new_tokens!r} must be an int >= 1"
    try:
        validate_sampling(float(req.temperature), float(req.top_p))
    except (TypeError, ValueError) as e:
        return str(e)
    if req.replay is not None and (req.temperature != 0 or not hasattr(req.replay, "step_drafts")):
        return "replay needs greedy decoding (temperature=0) and an AcceptanceReplay"
    ids = list(req.prompt_ids) + list(req.stop_ids)
    if all(type(t) is int for t in ids):       # the usual case, checked in C-speed passes (a long prompt's
        if 0 <= min(ids) and max(ids) < vocab_size:    # submit runs between the engine's steps)
            return None
    elif not all((isinstance(t, numbers.Integral) and not isinstance(t, bool)) or (isinstance(t, torch.Tensor) and t.numel() == 1) for t in ids):
        return f"prompt and stop ids must be ints, got {[type(t).__name__ for t in ids][:5]}"
    bad = [int(t) for t in ids if not 0 <= int(t) < vocab_size]
    if bad:
        return f"token ids {bad[:5]} (prompt or stop ids) are outside the vocab (size {vocab_size})"
    return None


@dataclass
class RequestState:
    id: int
    req: Request
    submitted_s: float
    generator: torch.Generator | None
    pages: list = field(default_factory=list)  # the page table (host ints)
    prefilled: int = 0                         # prompt rows in the target cache
    tokens: list = field(default_factory=list)
    acceptance: list = field(default_factory=list)
    start: int = 0                             # position of the anchor (last committed token)
    ctx: list = field(default_factory=list)    # (features [C, F], first position): not yet in the draft cache
    first_token_s: float | None = None
    stopped: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt_ids)

    @property
    def max_length(self) -> int:
        return self.prompt_len + self.req.max_new_tokens

    @property
    def decoding(self) -> bool:
        return self.prefilled == self.prompt_len

    @property
    def done(self) -> bool:
        return self.decoding and (self.stopped or self.start + 1 >= self.max_length)

    def result(self, now: float, error: str | None = None) -> BatchResult:
        first = self.first_token_s
        return BatchResult(prompt_len=self.prompt_len, tokens=list(self.tokens), acceptance_lengths=list(self.acceptance),
                           prefill_s=(first - self.submitted_s) if first is not None else 0.0,
                           decode_s=(now - first) if first is not None else 0.0, steps=len(self.acceptance),
                           request_id=self.id, error=error)
