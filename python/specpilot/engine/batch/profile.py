"""A StepCostTable for this card: the batched engine's forwards timed at the step shapes it runs.

With CUDA graphs (engine.graphs), each point is a replay of the graphed target forward the engine
would run: R requests (every request bucket up to max_batch) x T verify rows (every choice of
engine.verify_row_choices), each request at `context` positions; the table's fixed part is the
graphed draft block forward at the largest bucket (the draft does not change with the verify length).
Without graphs, each bucket of n rows is one eager forward over n / rows_per_request requests of
`rows_per_request` rows (a hybrid target's: each request verifying from a state slot of its own, up
to the engine's slots). Pages are borrowed from the pool and returned (what they hold is never read:
a request reads only positions it wrote itself).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from specpilot import config as config_module

from . import forward, forward_hybrid
from .adaptive import StepCostTable
from .graphed import REQUEST_BUCKETS, request_bucket

BUCKETS = (16, 32, 64, 128, 256, 512, 1024)


@torch.inference_mode()
def measure_step_costs(engine, buckets=BUCKETS, rows_per_request: int = 16, context: int = 512,
                       repeats: int = 3) -> StepCostTable:
    """Median-of-`repeats` seconds per point (points whose pages do not fit in the free pool are
    skipped; at least one must fit)."""
    with config_module.use(engine.engine_config):
        if engine.graphs is not None:
            return _graphed(engine, context, repeats)
        return _eager(engine, buckets, rows_per_request, context, repeats)


def _median_seconds(engine, call, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):                       # the first call warms up (and captures)
        t0 = engine.clock()
        call()
        times.append(engine.clock() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def _borrow(engine, requests: int, rows: int, context: int):
    """Page tables of `requests` requests at `context` positions with `rows` more, or None."""
    per_request = -(-(context + rows) // engine.page_size)
    pages = engine.pool.alloc(requests * per_request)
    if pages is None:
        return None, None
    return pages, [pages[i * per_request:(i + 1) * per_request] for i in range(requests)]


def _graphed(engine, context: int, repeats: int) -> StepCostTable:
    top = request_bucket(engine.max_batch)
    by_rows, fixed = {}, 0.0
    for requests in [b for b in REQUEST_BUCKETS if b <= top] or [top]:
        for t in engine.verify_row_choices:
            pages, tables = _borrow(engine, requests, t, context)
            if pages is None:
                continue
            try:
                segments = [forward.Segment(table, context, t) for table in tables]
                _, _, arrays = engine.graphs.padded(segments, t)
                positions, slots, keys, padded_last, ids = engine.staging.upload(
                    arrays + [np.zeros(requests * t, dtype=np.int64)])
                keys, padded_last = keys.view(requests, -1), padded_last.view(requests, t)
                seconds = _median_seconds(engine, lambda: engine.graphs.target(ids, positions, slots, keys, padded_last),
                                          repeats)
                by_rows.setdefault(requests * t, []).append(seconds)
                if engine.drafter is not None and requests == top and t == engine.block_size:
                    fixed = _median_seconds(engine, lambda: engine.graphs.draft(ids, positions, slots, keys, padded_last),
                                            repeats)
            finally:
                engine.pool.release(pages)
    if not by_rows:
        raise ValueError(f"no request bucket up to {top} at context {context} fits the free KV pool "
                         f"({engine.pool.free_pages} pages)")
    return StepCostTable([(n, max(s)) for n, s in by_rows.items()], fixed_s=fixed)


def _eager(engine, buckets, rows_per_request: int, context: int, repeats: int) -> StepCostTable:
    points = []
    for n in buckets:
        requests = max(1, n // rows_per_request)
        rows = min(rows_per_request, n)
        slots = engine.recurrent
        if slots is not None and requests > slots.free_slots:
            continue                                    # more requests than the hybrid engine runs at once
        pages, tables = _borrow(engine, requests, rows, context)
        if pages is None:
            continue
        verifying = [SimpleNamespace(id=-1 - r, prompt_len=context) for r in range(requests)]   # ids no request has
        try:
            layout = forward.Layout([forward.Segment(t, context, rows) for t in tables], engine.page_size, engine.staging)
            ids = torch.zeros(rows * requests, dtype=torch.long, device=engine.device)
            for s in verifying if slots is not None else ():
                slots.take(s.id)

            def call():
                with engine.kernels(ids.shape[0]):
                    if slots is None:
                        forward.target_forward(engine.target, engine.cache, layout, ids, engine.feature_layers)
                        return
                    # a verify step of a hybrid target: every row's state kept, then dropped uncommitted
                    forward_hybrid.target_forward(engine, layout, ids, [(s, True) for s in verifying])
                    for s in verifying:
                        slots.discard(s.id)
            points.append((rows * requests, _median_seconds(engine, call, repeats)))
        finally:
            engine.pool.release(pages)
            for s in verifying if slots is not None else ():
                slots.release(s.id)
    if not points:
        raise ValueError(f"no bucket of {list(buckets)} fits the free KV pool ({engine.pool.free_pages} pages)")
    return StepCostTable(points)
