"""The batched engine's graphed decode path (engine/batch/graphed.py) run on the CPU through
graphs.StaticShapeStep (static input buffers, outputs reused by every call, as a CUDA graph): padded
request buckets, tail blocks shorter than the block, the trash slot, key buckets. Every request's tokens
equal the single-request engine's (fp32), greedy and sampled, speculative and AR."""
import gc
import weakref

import pytest

from batch_helpers import five_requests, accepting_pair, random_prompts, run_staggered, single
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, step
from specpilot.engine.batch.draft_context import append_context
from specpilot.engine.batch.graphed import request_bucket
from specpilot.engine.graphs import StaticShapeStep

VOCAB = 10


@pytest.fixture(scope="module")
def pair():
    return accepting_pair(VOCAB, 4, fresh_seed(), lambda s: requests_for(s))


def requests_for(seed, temperature=0.0):
    return five_requests(VOCAB, seed, temperature)


def graphed_engine(target, drafter, max_batch, paged=False, config=BatchConfig()):
    """paged: the attention through kernels/paged_attention (its torch reference here, the CUDA kernel
    on a GPU) over page tables, instead of SDPA over gathered K/V."""
    engine = BatchEngine(target, drafter, config, max_batch=max_batch, kv_pages=64,
                         graph_step_factory=StaticShapeStep)
    assert engine.graphs is not None and not engine.graphs.paged      # the kernel runs on CUDA bf16 only
    engine.graphs.paged = paged
    return engine


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("drafted", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_decode_equals_single_request(pair, drafted, temperature, paged):
    target, drafter, seed = pair
    drafter = drafter if drafted else None
    requests = requests_for(seed, temperature)
    engine = graphed_engine(target, drafter, max_batch=3, paged=paged)
    results = run_staggered(engine, requests)
    for i, req in enumerate(requests):
        ref = single(target, drafter, req)
        assert results[i].error is None and results[i].tokens == ref.tokens, f"seed {seed}, request {i}"
        assert results[i].acceptance_lengths == ref.acceptance_lengths
    kinds = {key[0] for key in engine.graphs.steps}
    assert kinds == ({"context", "draft", "target", "prefill", "mixed"} if drafted else {"target", "prefill", "mixed"}), \
        "the graphed path never ran"
    assert engine.pool.free_pages == 64


@pytest.mark.parametrize("drafted", [True, False])
def test_padded_requests_bucket(pair, drafted):
    """Three requests decoding together run in the bucket of 4: one padding request on the trash page."""
    target, drafter, seed = pair
    drafter = drafter if drafted else None
    requests = [Request(tuple(p), 12) for p in random_prompts(VOCAB, (4, 7, 5), seed + 3)]
    engine = graphed_engine(target, drafter, max_batch=3)
    ids = [engine.submit(r) for r in requests]
    results = {r.request_id: r for r in engine.run_until_done()}
    assert ("target", request_bucket(3)) in {key[:2] for key in engine.graphs.steps}, "bucket 4 never ran"
    for i, req in zip(ids, requests):
        assert results[i].tokens == single(target, drafter, req).tokens, f"seed {seed}"


def test_request_bucket():
    assert [request_bucket(n) for n in (1, 2, 3, 5, 17, 33, 256, 257)] == [1, 2, 4, 8, 24, 48, 256, 320]


def test_warmup_captures_every_graph_a_run_needs(pair):
    """After warmup(max_context), a staggered run at every batch size up to max_batch captures nothing new."""
    target, drafter, seed = pair
    requests = requests_for(seed)
    for model in (drafter, None):
        engine = graphed_engine(target, model, max_batch=3)
        count = engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
        captured = set(engine.graphs.steps)
        assert count == len(captured) > 0
        results = run_staggered(engine, requests)
        assert set(engine.graphs.steps) == captured, f"captured during the run: {set(engine.graphs.steps) - captured}"
        for i, req in enumerate(requests):
            assert results[i].tokens == single(target, model, req).tokens, f"seed {seed}, request {i}"
    with pytest.raises(ValueError, match="max_context"):
        engine.warmup(0)


@pytest.mark.parametrize("tile", [1, 3, 16])
@pytest.mark.parametrize("drafted", [True, False])
def test_prefill_chunks_ride_in_the_decode_forward(pair, drafted, tile, monkeypatch):
    """Prompts prefilled 4 rows a step while others decode: the chunks, cut into tiles of `tile` rows
    (one padded request each), go through the decode rows' own forward (the mixed graph), padded to
    one of its tile buckets, and their features into the draft cache at once, so no draft's context
    append falls back to the eager forward; tokens and acceptance unchanged."""
    target, drafter, seed = pair
    drafter = drafter if drafted else None
    requests = requests_for(seed)
    engine = graphed_engine(target, drafter, max_batch=3, config=BatchConfig(prefill_chunk=4))
    engine.graphs.prefill_tile = tile
    tiles, eager_context = [], []
    original = engine.graphs.mixed
    engine.graphs.mixed = lambda *a: tiles.append(a[5][4].shape) or original(*a)
    monkeypatch.setattr(step, "append_context", lambda engine, group: eager_context.append(
        [s.id for s in group if s.ctx]) or append_context(engine, group))
    results = run_staggered(engine, requests, every=1)
    assert tiles, "no step had a prefill chunk beside a graphed decode forward"
    # the chunks' features went to the draft cache in their own step: every draft's context append graphed
    assert not any(eager_context), f"a draft appended context eagerly: {eager_context}"
    assert {t for _, t in tiles} == {tile} and {r for r, _ in tiles} <= set(engine.graphs.tile_buckets()), tiles
    assert engine.graphs.prefill_requests == request_bucket(-(-4 // tile))
    for i, req in enumerate(requests):
        ref = single(target, drafter, req)
        assert results[i].tokens == ref.tokens and results[i].acceptance_lengths == ref.acceptance_lengths, i


@pytest.mark.parametrize("decoding", [False, True])
@pytest.mark.parametrize("drafted", [True, False])
def test_a_steps_chunks_fit_one_forward(pair, drafted, decoding):
    """Three newcomers' chunks (1 + 1 + 2 rows) in tiles of 3 rows would need 3 tiles, one forward takes
    2 (a whole 4-row chunk's): the third newcomer's chunk waits for the next step, so no step runs a
    second forward (it would read every weight again), the first the decode rows' own (mixed) when a
    request is decoding; tokens unchanged."""
    target, drafter, seed = pair
    drafter = drafter if drafted else None
    requests = [Request(tuple(p), 10) for p in random_prompts(VOCAB, (1, 1, 2), seed + 5)]
    running = Request(tuple(random_prompts(VOCAB, (3,), seed + 6)[0]), 16)
    engine = graphed_engine(target, drafter, max_batch=4, config=BatchConfig(prefill_chunk=4))
    engine.graphs.prefill_tile = 3
    calls = []
    for kind in ("prefill", "mixed"):
        original = getattr(engine.graphs, kind)
        setattr(engine.graphs, kind, lambda *a, kind=kind, original=original:
                calls.append((kind, engine.steps, a[-1][4].shape[0] if kind == "mixed" else a[4].shape[0])) or original(*a))
    first, results = None, {}
    if decoding:                            # its 3-row prompt in one step, then it decodes
        first = engine.submit(running)
        results.update({r.request_id: r for r in engine.step()})
        assert engine.running[0].decoding
    calls.clear()
    step = engine.steps
    ids = [engine.submit(r) for r in requests]
    results.update({r.request_id: r for r in engine.run_until_done()})
    assert engine.graphs.prefill_requests == 2
    kind = "mixed" if decoding else "prefill"
    assert calls[:2] == [(kind, step, 2), ("mixed", step + 1, 1)], calls
    assert len({s for _, s, _ in calls}) == len(calls), f"a step ran two forwards: {calls}"
    for i, req in zip(ids + ([first] if decoding else []), requests + ([running] if decoding else [])):
        assert results[i].tokens == single(target, drafter, req).tokens, f"seed {seed}"


def test_adaptive_verify_runs_graphed_at_shorter_rows(pair):
    """Adaptive verify's steps run the graphed target forward at the chosen T below the block (each a
    graph warmup captured); greedy tokens equal the single-request engine's. (Sampled, a trimmed verify
    draws other uniforms than a full one: its law is tested in test_batch_sampling.py.)"""
    from batch_helpers import EAGER_ADAPTIVE

    target, drafter, seed = pair
    requests = requests_for(seed)
    engine = graphed_engine(target, drafter, max_batch=3, config=EAGER_ADAPTIVE)
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    captured = set(engine.graphs.steps)
    assert {key[2] for key in captured if key[0] == "target"} == set(engine.verify_row_choices) == {1, 2, 3, 4}
    rows_run = []
    original = engine.graphs.target
    engine.graphs.target = lambda *a: rows_run.append(a[-1].shape[1]) or original(*a)
    results = run_staggered(engine, requests)
    assert set(engine.graphs.steps) == captured
    assert min(rows_run) < engine.block_size, f"seed {seed}: adaptive verify never trimmed ({rows_run})"
    for i, req in enumerate(requests):
        assert results[i].tokens == single(target, drafter, req).tokens, f"seed {seed}, request {i}"


def test_warmup_captures_every_graph_an_adaptive_run_needs(pair):
    """With adaptive verify (its shorter verify rows and probe steps) too, after warmup a run at batch
    sizes up to max_batch captures nothing new: on CUDA a capture inside a run fails (the run's pinned
    uploads are in flight)."""
    target, drafter, seed = pair
    requests = requests_for(seed) + requests_for(seed + 1)
    engine = graphed_engine(target, drafter, max_batch=8, config=BatchConfig(adaptive_verify=True,
                                                                              adaptive_probe_every=2))
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    captured = set(engine.graphs.steps)
    results = run_staggered(engine, requests, every=1)
    assert set(engine.graphs.steps) == captured, f"captured during the run: {set(engine.graphs.steps) - captured}"
    assert all(r.error is None for r in results.values())


def test_a_failed_capture_names_its_graph(pair):
    """CUDA's capture errors say nothing of which graph: warmup's error names it and keeps the cause."""
    target, drafter, _ = pair

    class FailingCapture(StaticShapeStep):
        def __init__(self, fn, example_inputs, pool=None):
            if example_inputs[0].shape[0] == 2 * 4:          # the second request bucket's block forwards
                raise RuntimeError("operation not permitted when stream is capturing")
            super().__init__(fn, example_inputs, pool)

    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=2, kv_pages=64, graph_step_factory=FailingCapture)
    with pytest.raises(RuntimeError, match=r"batched engine.s \w+ graph \(2, 4[,)].*not permitted") as failure:
        engine.warmup(20)
    assert "not permitted" in str(failure.value.__cause__)


def test_close_frees_the_caches_without_a_collection(pair):
    """An engine and its graphs hold each other, so a dropped engine keeps its caches until the garbage
    collector runs; close() lets them go at once (a process building engine after engine runs out of
    device memory otherwise: the bench's C=32 runs on an H100)."""
    target, drafter, seed = pair
    kept, freed = (graphed_engine(target, drafter, max_batch=3) for _ in range(2))
    for engine in (kept, freed):
        run_staggered(engine, requests_for(seed))
    refs = [weakref.ref(e.cache) for e in (kept, freed)]
    gc.disable()
    try:
        freed.close()
        del kept, freed, engine
        assert refs[0]() is not None, "the reference cycle this test relies on is gone: close() may be moot"
        assert refs[1]() is None
    finally:
        gc.enable()
