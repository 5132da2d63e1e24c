"""A StepCostTable for this card: the batched engine's target forward timed at token buckets.

Each bucket of n rows is laid out as n / rows_per_request requests of `rows_per_request` verify rows
at `context` positions each (a decode step of that many requests), on pages borrowed from the pool
and returned (what they hold is never read: a request reads only positions it wrote itself).
"""
from __future__ import annotations

import torch

from specpilot import config as config_module

from . import forward
from .adaptive import StepCostTable

BUCKETS = (16, 32, 64, 128, 256, 512, 1024)


@torch.inference_mode()
def measure_step_costs(engine, buckets=BUCKETS, rows_per_request: int = 16, context: int = 512,
                       repeats: int = 3) -> StepCostTable:
    """Median-of-`repeats` seconds of one target forward per bucket (buckets whose pages do not fit in
    the free pool are skipped; at least one must fit)."""
    points = []
    per_request = -(-(context + rows_per_request) // engine.page_size)
    for n in buckets:
        requests = max(1, n // rows_per_request)
        pages = engine.pool.alloc(requests * per_request)
        if pages is None:
            continue
        try:
            tables = [pages[i * per_request:(i + 1) * per_request] for i in range(requests)]
            rows = min(rows_per_request, n)
            layout = forward.Layout([forward.Segment(t, context, rows) for t in tables], engine.page_size, engine.staging)
            ids = torch.zeros(rows * requests, dtype=torch.long, device=engine.device)
            times = []
            for _ in range(repeats + 1):                       # the first call warms up
                t0 = engine.clock()
                with config_module.use(engine.engine_config), engine.kernels(ids.shape[0]):
                    forward.target_forward(engine.target, engine.cache, layout, ids, engine.feature_layers)
                times.append(engine.clock() - t0)
            points.append((rows * requests, sorted(times[1:])[len(times[1:]) // 2]))
        finally:
            engine.pool.release(pages)
    if not points:
        raise ValueError(f"no bucket of {list(buckets)} fits the free KV pool ({engine.pool.free_pages} pages)")
    return StepCostTable(points)
