"""Bad input and cancellation in the batched engine: the request gets its own clear error, its pages
go back, and every other request in flight finishes exactly as it would alone."""
import re

import pytest

from batch_helpers import random_prompts, single, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.batch import BatchConfig, BatchEngine, Request

VOCAB = 10
PAGES = 8                                              # 8 pages of 16 slots: 128 positions


@pytest.fixture(scope="module")
def pair():
    seed = fresh_seed()
    return (*tiny_pair(VOCAB, 4, seed), seed)


def good_requests(seed):
    return [Request(tuple(p), m) for p, m in zip(random_prompts(VOCAB, (6, 11), seed), (14, 9))]


@pytest.mark.parametrize("bad, message", [
    (Request((1, 2, 3), 200), r"needs 13 KV pages of 16 slots, but the whole cache holds 8"),
    (Request((1, 2, 3), 5, temperature=-0.5), r"temperature=-0.5"),
    (Request((1, 2, 3), 5, temperature=1.0, top_p=0.0), r"top_p=0.0 in \(0, 1\]"),
    (Request((1, 2, 3), 5, temperature=1.0, top_p=1.5), r"top_p=1.5 in \(0, 1\]"),
    (Request((), 5), r"empty prompt"),
    (Request((1, 99), 5), r"token ids \[99\].*outside the vocab \(size 10\)"),
    (Request((1, 2), 5, stop_ids=(-1,)), r"token ids \[-1\]"),
    (Request((1, 2), 0), r"max_new_tokens=0 must be an int >= 1"),
    (Request((1, "2"), 4), r"prompt and stop ids must be ints"),
    ("not a request", r"submit\(\) takes a Request, got str"),
])
def test_bad_request_gets_its_own_error(pair, bad, message):
    target, drafter, seed = pair
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=4, kv_pages=PAGES)
    good = good_requests(seed)
    ids = [engine.submit(good[0]), engine.submit(bad), engine.submit(good[1])]
    results = {r.request_id: r for r in engine.run_until_done()}
    assert results[ids[1]].error is not None and re.search(message, results[ids[1]].error), \
        results[ids[1]].error
    assert results[ids[1]].tokens == []
    for rid, req in ((ids[0], good[0]), (ids[2], good[1])):
        assert results[rid].error is None and results[rid].tokens == single(target, drafter, req).tokens
    assert engine.pool.free_pages == PAGES


def test_cancel_mid_flight_and_queued(pair):
    target, drafter, seed = pair
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=2, kv_pages=PAGES)
    good = good_requests(seed)
    victim = Request(tuple(random_prompts(VOCAB, (9,), seed + 3)[0]), 40)
    ids = [engine.submit(good[0]), engine.submit(victim), engine.submit(good[1]), engine.submit(victim)]
    for _ in range(3):
        assert engine.step() == []
    assert [s.id for s in engine.running] == ids[:2] and [s.id for s in engine.queue] == ids[2:]
    made = len(next(s for s in engine.running if s.id == ids[1]).tokens)
    assert made > 0
    assert engine.cancel(ids[1]) and engine.cancel(ids[3])         # running, then still queued
    assert not engine.cancel(ids[1]) and not engine.cancel(12345)
    results = {r.request_id: r for r in engine.run_until_done()}
    assert results[ids[1]].error == "cancelled" and len(results[ids[1]].tokens) == made
    assert results[ids[3]].error == "cancelled" and results[ids[3]].tokens == []
    full = single(target, drafter, victim).tokens
    assert results[ids[1]].tokens == full[:made]                   # what it made before, unchanged
    for rid, req in ((ids[0], good[0]), (ids[2], good[1])):
        assert results[rid].error is None and results[rid].tokens == single(target, drafter, req).tokens
    assert engine.pool.free_pages == PAGES and engine.idle


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give exactly one of kv_pages"),
    ({"kv_pages": 4, "memory_fraction": 0.5}, "give exactly one of kv_pages"),
    ({"memory_fraction": 0.5}, "on cpu give kv_pages"),
    ({"kv_pages": 0}, "kv_pages=0 must be a positive int"),
    ({"kv_pages": 4, "max_batch": 0}, "max_batch=0 must be an int >= 1"),
])
def test_bad_engine_arguments(pair, kwargs, message):
    target, drafter, _ = pair
    with pytest.raises(ValueError, match=message):
        BatchEngine(target, drafter, BatchConfig(), **kwargs)


@pytest.mark.parametrize("changes, message", [
    ({"ragged_verify": 1}, "ragged_verify must be True or False"),
    ({"page_size": 0}, "page_size=0"),
    ({"prefill_chunk": 2.5}, "prefill_chunk must be an int"),
    ({"adaptive_probe_every": -1}, "adaptive_probe_every=-1 must be >= 0"),
])
def test_bad_batch_config(changes, message):
    with pytest.raises(ValueError, match=message):
        BatchConfig(**changes)


def test_wrong_drafter_refused(pair):
    target, _, seed = pair
    _, other_drafter = tiny_pair(VOCAB, 4, seed + 1)
    with pytest.raises(ValueError, match="different target"):
        BatchEngine(target, other_drafter, kv_pages=4)


def test_page_pool_release_checks_its_own_pages_only():
    """A double release is refused by name; a release's check costs the request's pages, not the pool's
    (it rebuilt the whole pool's taken set before: milliseconds a finished request with a pool sized
    from a GPU's free memory)."""
    from specpilot.engine.batch.paged import PagePool

    pool = PagePool(50_000)
    held = [pool.alloc(40) for _ in range(64)]
    assert pool.free_pages == 50_000 - 64 * 40 and pool.alloc(50_000) is None
    for pages in held[1:]:
        pool.release(pages)
    with pytest.raises(RuntimeError, match=r"pages \[\d+(, \d+)*\] released twice"):
        pool.release(held[1])
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(held[0] + [49_999])                  # one page never handed out
    pool.release(held[0])
    assert pool.free_pages == 50_000 and sorted(pool.alloc(50_000)) == list(range(50_000))
