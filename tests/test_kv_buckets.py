"""EngineConfig.graph_kv_step: the kv span buckets of the graphed steps (engine/graphs.py). Every span a
step can ask for is one that warmup captures, under both rules; an engine with finer buckets, on the
CPU graphed path (StaticShapeStep), gives the default's tokens and captures nothing after warmup,
single-request and batched; bad values are refused naming the field."""
import pytest
import torch

from batch_helpers import run_staggered, single, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.engine.graphs import StaticShapeStep, kv_bucket, kv_spans
from specpilot.engine.steps import StepRunner

VOCAB = 10      # small: the random drafter agrees with the target now and then (multi-token steps)


@pytest.mark.parametrize("step", [0, 64, 192, 256, 512])
@pytest.mark.parametrize("capacity", [64, 128, 320, 576, 1024, 1088, 4160])
def test_warmup_spans_are_exactly_the_spans_steps_ask_for(step, capacity):
    asked = {kv_bucket(n, capacity, step) for n in range(1, capacity + 1)}
    assert sorted(asked) == kv_spans(capacity, step)
    for n in range(1, capacity + 1):
        span = kv_bucket(n, capacity, step)
        assert n <= span <= capacity and span % 64 == 0
        if step:
            assert span == min(-(-n // step) * step, capacity)
        else:                                   # today's rule: the next power of two from 256, capped
            assert span == min(max(256, 1 << (n - 1).bit_length()), capacity)


@pytest.mark.parametrize("bad", [-64, 32, 100, 320 + 1, True, 256.0, "256"])
def test_bad_graph_kv_step_is_refused(bad):
    with pytest.raises(ValueError, match=rf"EngineConfig.graph_kv_step must be 0 .* got {bad!r}"):
        EngineConfig(graph_kv_step=bad)
    assert EngineConfig().graph_kv_step == 0 and EngineConfig(graph_kv_step=320).graph_kv_step == 320


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(VOCAB, 4, fresh_seed())


def graphed_engine(target, drafter, step: int, fused: bool) -> Engine:
    engine = Engine(target, drafter, max_seq_len=900, config=EngineConfig(graph_kv_step=step, fused_steps=fused))
    engine.runner = StepRunner(target, drafter, engine.cache, engine.draft_cache, True, StaticShapeStep,
                               config=engine.config)
    return engine


def captured(engine) -> set:
    return set(engine.runner.graphs) | {("fused", *key) for key in engine.runner.fused.graphs}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("step", [64, 256])
def test_finer_buckets_give_the_default_tokens_with_no_capture_after_warmup(pair, step, fused):
    target, drafter = pair
    default, finer = graphed_engine(target, drafter, 0, fused), graphed_engine(target, drafter, step, fused)
    default.warmup(), finer.warmup()
    warmed = captured(finer)
    spans = finer.runner.kv_spans()
    assert spans == kv_spans(finer.cache.slots, step) and 768 in spans and 768 not in default.runner.kv_spans()
    for kind in [("target", 1), ("target", 4), ("draft",)] + ([("fused", "ar"), ("fused", "spec")] if fused else []):
        assert sorted(key[-1] for key in warmed if key[:len(kind)] == kind) == spans, kind
    g = torch.Generator().manual_seed(fresh_seed())
    for length, max_new in ((40, 50), (530, 40)):       # spans 64 / 128 (step 64), then 576 / 768 vs 960
        prompt = torch.randint(0, VOCAB - 2, (length,), generator=g).tolist()
        ref, ours = default.generate_spec(prompt, max_new), finer.generate_spec(prompt, max_new)
        assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths
        assert finer.generate_ar(prompt, 12).tokens == default.generate_ar(prompt, 12).tokens
    assert captured(finer) == warmed, captured(finer) - warmed


def test_batched_graphs_follow_the_engine_config(pair):
    """The batched engine's key buckets: multiples of graph_kv_step (and of the page, which the paged
    kernel's page table counts keys in); a run after warmup captures nothing and gives the
    single-request engine's tokens."""
    target, drafter = pair
    config = EngineConfig(graph_kv_step=64)
    g = torch.Generator().manual_seed(fresh_seed())
    requests = [Request(tuple(torch.randint(0, VOCAB - 2, (n,), generator=g).tolist()), m)
                for n, m in ((3, 40), (70, 10), (40, 50), (90, 5))]      # contexts across 64 and 128
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=3, kv_pages=64, engine_config=config,
                         graph_step_factory=StaticShapeStep)
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    warmed = set(engine.graphs.steps)
    assert {key[-1] for key in warmed if key[0] == "target"} == {64, 128}
    results = run_staggered(engine, requests)
    assert set(engine.graphs.steps) == warmed, set(engine.graphs.steps) - warmed
    for i, req in enumerate(requests):
        assert results[i].tokens == single(target, drafter, req).tokens, f"request {i}"
    paged128 = BatchEngine(target, drafter, BatchConfig(page_size=128), max_batch=1, kv_pages=4,
                           engine_config=config, graph_step_factory=StaticShapeStep)
    assert [paged128.graphs.key_bucket(n) for n in (1, 129, 300)] == [128, 256, 384]
