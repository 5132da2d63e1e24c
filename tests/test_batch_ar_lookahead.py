"""Batched AR with a step in flight ahead of the host (engine/batch/ar_lookahead.py), on the CPU through
graphs.StaticShapeStep: tokens equal the single-request engine's with requests joining, stopping on a
stop id mid-run (a wasted row in flight), reaching their length, cancelled, and beside a sampled
request (which turns the lookahead off)."""
import pytest

from batch_helpers import random_prompts, run_staggered, single, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, ar_lookahead
from specpilot.engine.graphs import StaticShapeStep

VOCAB = 12


@pytest.fixture(scope="module")
def target():
    seed = fresh_seed()
    return tiny_pair(VOCAB, 4, seed)[0], seed


def engine_for(model, max_batch=4):
    return BatchEngine(model, None, BatchConfig(), max_batch=max_batch, kv_pages=64, graph_step_factory=StaticShapeStep)


def counted_launches(monkeypatch) -> list:
    """Records, per launch, whether it ran ahead (anchors from the previous step's device argmax)."""
    ahead, original = [], ar_lookahead._launch
    monkeypatch.setattr(ar_lookahead, "_launch", lambda e, s, prev: ahead.append(prev is not None) or original(e, s, prev))
    return ahead


def with_stops(model, seed) -> list:
    """Requests of several lengths; two stop on a token their own AR output makes mid-way."""
    prompts = random_prompts(VOCAB, (5, 9, 3, 12, 7, 4), seed)
    requests = [Request(tuple(p), n) for p, n in zip(prompts, (20, 1, 13, 2, 25, 9))]
    for i in (0, 4):
        tokens = single(model, None, requests[i]).tokens
        requests[i] = Request(requests[i].prompt_ids, requests[i].max_new_tokens, stop_ids=(tokens[6],))
    return requests


def test_lookahead_tokens_equal_single_request(target, monkeypatch):
    model, seed = target
    requests = with_stops(model, seed)
    ahead = counted_launches(monkeypatch)
    engine = engine_for(model)
    results = run_staggered(engine, requests, every=3)
    for i, req in enumerate(requests):
        ref = single(model, None, req)
        assert results[i].error is None and results[i].tokens == ref.tokens, f"seed {seed}, request {i}"
    assert sum(ahead) > len(ahead) // 2, f"seed {seed}: the lookahead rarely ran ({sum(ahead)} of {len(ahead)})"
    assert engine.ar_in_flight is None and engine.pool.free_pages == 64


def test_cancel_with_a_step_in_flight(target, monkeypatch):
    model, seed = target
    requests = [Request(tuple(p), 30) for p in random_prompts(VOCAB, (6, 8, 5), seed + 1)]
    ahead = counted_launches(monkeypatch)
    engine = engine_for(model)
    ids = [engine.submit(r) for r in requests]
    while len(engine.progress().get(ids[1], [])) < 5:
        engine.step()
    assert engine.ar_in_flight is not None and ahead[-1], "no step was in flight when cancelling"
    assert engine.cancel(ids[1])
    results = {r.request_id: r for r in engine.run_until_done()}
    assert results[ids[1]].error == "cancelled"
    for i in (0, 2):
        assert results[ids[i]].tokens == single(model, None, requests[i]).tokens, f"seed {seed}, request {i}"
    assert engine.pool.free_pages == 64


def test_a_sampled_request_turns_the_lookahead_off(target):
    model, seed = target
    prompts = random_prompts(VOCAB, (6, 8), seed + 2)
    requests = [Request(tuple(prompts[0]), 15), Request(tuple(prompts[1]), 15, temperature=1.0, seed=seed)]
    engine = engine_for(model)
    ids = [engine.submit(r) for r in requests]
    engine.step()
    decoding = [s for s in engine.running if s.decoding]
    assert len(decoding) == 2 and not ar_lookahead.applies(engine, decoding)
    results = {r.request_id: r for r in engine.run_until_done()}
    for i, req in zip(ids, requests):
        assert results[i].tokens == single(model, None, req).tokens, f"seed {seed}, request {i}"
