"""How the batched engine drafts with each drafter kind.

DFlash drafts through step.py's own path (one context append and one block forward over all
requests, CUDA-graphed on a GPU). Every other kind plugs in here: a module of this package with a
class `Drafting(engine)` that has

    propose(group, segments) -> (drafted, probs)
        group: the RequestStates drafting together (all decoding requests when
        BatchConfig.batched_draft, else one); segments[r]: request r's verify block as a
        forward.Segment (its pages, start = the anchor's position, rows = anchor + drafts).
        It first brings the request's draft cache up to date (its pending context: state.ctx's
        target features, or for a token-fed drafter the committed tokens it has not seen), then
        drafts rows - 1 tokens per request, all requests in one forward.
        drafted: int64 device tensor of every request's drafts, concatenated in group order;
        probs: per request, its draft distribution [rows - 1, V] at temperature > 0 (the q of
        rejection sampling; the drafts are draws from it with the request's own generator, in
        the single-request engine's order) or None when greedy.
    release(state)
        the request left (finished, failed, cancelled): drop what the drafter keeps for it.

Contract (tests/test_batch_<kind>.py, one per kind): each request's tokens and acceptance lengths equal
Engine.generate_spec's for it alone, greedy and sampled with a seed. The drafter's own K/V go to the
engine's paged draft cache (engine.draft_cache, sized from the drafter's config) at the request's
slots (forward.Layout over state.pages).
"""
from __future__ import annotations

import importlib

# kind -> module of this package holding its Drafting (None: step.py's built-in DFlash path)
MODULES = {"dflash": None, "dflash2": ".draft_dflash2", "dspark": ".draft_dspark", "pard": ".draft_pard"}


def supported() -> tuple:
    return tuple(MODULES)


def for_engine(engine, kind: str):
    """The Drafting of `kind` for `engine` (None for DFlash and for no drafter)."""
    if kind is None or MODULES[kind] is None:
        return None
    return importlib.import_module(MODULES[kind], __package__).Drafting(engine)
