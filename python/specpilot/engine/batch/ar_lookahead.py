"""Batched AR with one step in flight ahead of the host: step n+1 is launched on the GPU, its anchors
the device argmax of step n, before the host reads step n back and commits it.

Step n+1's positions, slots and page tables do not depend on step n's tokens, only its input ids do,
and those stay on the device. So the GPU does not idle while the host reads back, commits and lays out
the next step (on an H100 at C = 32 that idle was ~1 ms of an 8.5 ms AR step). It runs when the engine
is graphed, has no drafter, and every running request is decoding greedily; any other step (a
newcomer's prefill, a sampled request) first drains the step in flight (`drain`).

A request that stops at step n (a stop id: only the token tells) has one wasted row in step n+1: it
writes K/V at position start + 1, inside the pages the request reserved (a request at its last
position is never launched ahead), and its token is never read. If the request's pages go back to the
pool, a later forward that reuses them runs after that write on the same stream, so it overwrites it.
Tokens equal the ordinary step's: each row is the same graphed forward over the same positions and ids
(tests/test_batch_ar_lookahead.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .forward import Segment
from .step import commit_step


@dataclass
class InFlight:
    states: list                  # the requests of the launched step, in row order
    argmax: torch.Tensor          # [R bucket] the target's argmax per row (device)
    host: torch.Tensor            # its copy on the host (pinned), valid once `ready` has happened
    ready: object                 # a CUDA event after the copy (None on the CPU: already copied)


def applies(engine, decoding: list) -> bool:
    return (engine.drafter is None and engine.graphs is not None and engine.config.ragged_verify
            and len(decoding) == len(engine.running) > 0 and all(s.req.temperature == 0 for s in decoding))


def step(engine, decoding: list) -> None:
    """One AR step's tokens committed for `decoding` (every running request), the next step launched
    before they are read. A step in flight for another set of requests (one stopped, was cancelled or
    joined) is drained first, and this step starts again from the host's tokens."""
    inflight = engine.ar_in_flight
    if inflight is not None and [s.id for s in inflight.states] != [s.id for s in decoding]:
        drain(engine)
        inflight, decoding = None, [s for s in decoding if not s.done]
        if not decoding:
            return
    if inflight is None:
        inflight = _launch(engine, decoding, None)
    # who runs step n+1 whatever step n's token is: everyone not at its last position after step n
    ahead = [s for s in inflight.states if s.start + 2 < s.max_length]
    engine.ar_in_flight = _launch(engine, ahead, inflight) if ahead else None
    _commit(engine, inflight)


def drain(engine) -> None:
    """Reads back and commits the step in flight, if any."""
    inflight, engine.ar_in_flight = engine.ar_in_flight, None
    if inflight is not None:
        _commit(engine, inflight)


def _launch(engine, states: list, previous: InFlight | None) -> InFlight:
    """The graphed AR forward over `states` (one row each): anchors from the host tokens, or with
    `previous`, the previous step's device argmax, one position further on."""
    ahead = 0 if previous is None else 1
    segments = [Segment(s.pages, s.start + ahead, 1) for s in states]
    requests, _, arrays = engine.graphs.padded(segments, 1)
    if previous is None:
        anchors = np.zeros(requests, dtype=np.int64)
        anchors[:len(states)] = [s.tokens[-1] for s in states]
        positions, slots, keys, last, ids = engine.staging.upload(arrays + [anchors])
    else:
        row = {s.id: r for r, s in enumerate(previous.states)}
        index = np.zeros(requests, dtype=np.int64)
        index[:len(states)] = [row[s.id] for s in states]
        positions, slots, keys, last, index = engine.staging.upload(arrays + [index])
        ids = previous.argmax[index]
    logits, _ = engine.graphs.target(ids, positions, slots, keys.view(requests, -1), last.view(requests, 1))
    argmax = torch.argmax(logits, dim=-1)       # before the next replay reuses the graph's output buffer
    if argmax.is_cuda:
        host = torch.empty(argmax.shape, dtype=argmax.dtype, pin_memory=True)
        host.copy_(argmax, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
    else:
        host, ready = argmax.clone(), None
    return InFlight(list(states), argmax, host, ready)


def _commit(engine, inflight: InFlight) -> None:
    """Reads the step's tokens (waiting for that step only) and commits each live request's one token."""
    if inflight.ready is not None:
        inflight.ready.synchronize()
    tokens = inflight.host.tolist()
    running = {s.id for s in engine.running}
    for s, token in zip(inflight.states, tokens):
        if s.id not in running or s.done:
            continue                     # stopped at the step before, finished or cancelled: a wasted row
        commit_step(engine, s, None, 1, 0, [token], None)
