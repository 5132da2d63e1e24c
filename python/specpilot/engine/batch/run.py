"""Running a list of prompts through the BatchEngine (what `specpilot generate / verify
--concurrency N` use): a pool sized for `concurrency` of the largest requests, results in input order."""
from __future__ import annotations

from .config import BatchConfig
from .engine import BatchEngine
from .request import Request


def pool_pages(prompts, max_new_tokens: int, concurrency: int, page_size: int) -> int:
    """Pages for `concurrency` requests of the longest prompt + max_new_tokens at once."""
    longest = max(len(p) for p in prompts) + max_new_tokens
    return concurrency * -(-longest // page_size)


def run_batch(target, drafter, prompts, max_new_tokens: int, concurrency: int, stop_ids=(), temperature: float = 0.0,
              seed=None, block_size=None, config: BatchConfig = BatchConfig(), engine_config=None) -> tuple:
    """prompts: token-id lists. Every request gets the same settings (and, with a seed, its own generator
    seeded `seed`, as one generate_spec call each would). Returns (results in input order, the engine)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"--concurrency {concurrency!r} must be an int >= 1")
    extra = {} if engine_config is None else {"engine_config": engine_config}
    engine = BatchEngine(target, drafter, config, max_batch=concurrency, block_size=block_size,
                         kv_pages=pool_pages(prompts, max_new_tokens, concurrency, config.page_size), **extra)
    engine.warmup(max(len(p) for p in prompts) + max_new_tokens)    # CUDA: graphs and the step costs, up front
    ids = [engine.submit(Request(tuple(map(int, p)), max_new_tokens, temperature=temperature, seed=seed,
                                 stop_ids=tuple(stop_ids))) for p in prompts]
    by_id = {r.request_id: r for r in engine.run_until_done()}
    results = [by_id[i] for i in ids]
    failed = [(i, r.error) for i, r in enumerate(results) if r.error]
    if failed:
        raise ValueError(f"batched requests failed: {failed[:3]}")
    return results, engine
