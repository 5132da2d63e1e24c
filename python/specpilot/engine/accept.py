"""The greedy accept / commit rule of a speculative step, stated once.

A verify block is [anchor, d_1 .. d_{B-1}]; the target's argmax at each row is the posterior
[p_0 .. p_{B-1}] (p_i: the target's token after block row i).
  accepted = the longest prefix of drafts with d_i == p_{i-1}, among the real (non-padding) drafts
  new      = d_1 .. d_accepted, then the bonus p_accepted
  produced = min(accepted + 1, room): the tail room left before max_length, then cut after the
             first stop token (stock dflash's rule; the stop token is kept).
Used by the stepwise loop (engine/spec.py), the fused step's torch reference (step_kernels.py, which
csrc/cuda/spec_step.cu is tested against: tests/test_accept.py) and acceptance replay (replay.py).
The tensor forms run on the device inside the graphed step; the list forms run on the host.
"""
from __future__ import annotations

import torch


def accepted_prefix(drafts: torch.Tensor, posterior: torch.Tensor, real_drafts) -> torch.Tensor:
    """drafts [..., B-1], posterior [..., B], real_drafts (int or int64 tensor [1]: drafts past it are
    padding) -> int64 [...]: how many leading drafts equal the target's argmax before them."""
    rows = torch.arange(drafts.shape[-1], device=drafts.device)
    ok = (drafts == posterior[..., :-1]) & (rows < real_drafts)
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def matched_drafts(block: list, posterior: list) -> int:
    """The host form of accepted_prefix over a whole block: how many leading drafts block[1:] equal
    the target's argmax before them (posterior[:-1])."""
    n = 0
    while n + 1 < len(block) and block[n + 1] == posterior[n]:
        n += 1
    return n


def produced_count(accepted, room):
    """Tokens a step commits before any stop token: its accepted drafts and the bonus, capped by
    `room` (ints, or int64 tensors on the device)."""
    if isinstance(accepted, torch.Tensor) or isinstance(room, torch.Tensor):
        return torch.minimum(accepted + 1, room)
    return min(accepted + 1, room)


def last_committed(block: torch.Tensor, posterior: torch.Tensor, accepted: torch.Tensor,
                   produced: torch.Tensor) -> torch.Tensor:
    """The last token of new_tokens(...)[:produced] on the device (the next step's anchor): draft
    d_produced while produced <= accepted, else the bonus p_accepted. block / posterior [B]."""
    b = block.shape[0]
    return torch.where(produced <= accepted, block.gather(0, produced.clamp(max=b - 1)),
                       posterior.gather(0, accepted))


def new_tokens(block: list, posterior: list, accepted: int) -> list:
    """The accepted drafts then the bonus token: block[1:accepted + 1] + [posterior[accepted]]."""
    return list(block[1:accepted + 1]) + [posterior[accepted]]


def commit(new: list, room: int, stop: set, tokens: list) -> tuple:
    """Appends at most `room` of `new` to `tokens`, cut after the first stop token.
    Returns (produced, stopped)."""
    produced = produced_count(len(new) - 1, room)
    for i, tok in enumerate(new[:produced]):
        if tok in stop:
            tokens.extend(new[:i + 1])
            return i + 1, True
    tokens.extend(new[:produced])
    return produced, False
