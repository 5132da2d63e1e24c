"""The drafter's context: the target features of committed rows, written into the drafter's paged K/V
cache (forward.draft_context: the block drafters' fc / hidden_norm and each layer's K/V projection),
for every request with pending rows (RequestState.ctx) in one eager forward."""
from __future__ import annotations

import torch

from . import forward


def take_context(state) -> tuple:
    """The request's committed rows not yet in the draft cache: (features [C, F], first position)."""
    feats, first = [f for f, _ in state.ctx], state.ctx[0][1]
    expect = first
    for f, pos in state.ctx:
        if pos != expect:
            raise RuntimeError(f"request {state.id}: draft context rows not contiguous ({pos} after {expect})")
        expect += f.shape[0]
    state.ctx = []
    return torch.cat(feats) if len(feats) > 1 else feats[0], first


def append_context(engine, group: list) -> None:
    """Every pending committed row's target features (state.ctx) -> the drafter's context K/V, in one
    eager forward over the group (forward.draft_context: the block drafters' fc / hidden_norm)."""
    pending = [(s, *take_context(s)) for s in group if s.ctx]
    if pending:
        layout = forward.Layout([forward.Segment(s.pages, first, f.shape[0]) for s, f, first in pending],
                                engine.page_size, engine.staging)
        with engine.kernels(layout.positions.shape[0]):
            forward.draft_context(engine.drafter, engine.draft_cache, layout, torch.cat([f for _, f, _ in pending]))
