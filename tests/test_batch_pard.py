"""The batched engine drafting with PARD (engine/batch/draft_pard.py) against the single-request engine
(fp32, CPU): every request's tokens and acceptance lengths equal Engine.generate_spec's for it alone,
greedy and sampled (each request its own seed), with requests joining and leaving mid-run, tails shorter
than the block, every batching mechanism on and off, a smaller block, the graphed verify, prefix-first
and adaptive verify; plain PARD and PARD-2 (target features in the drafter's input embeddings). The
group's draft is one forward of the PARD model."""
from dataclasses import replace

import pytest

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, random_prompts, run_staggered
from drafter_helpers import PROBE, accepting_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, draft_pard
from specpilot.engine.graphs import StaticShapeStep

BLOCK = 5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return accepting_pair(lambda: tmp_path_factory.mktemp("pard"), "pard", block_size=BLOCK)


@pytest.fixture(scope="module")
def pard2_pair(tmp_path_factory):
    p = accepting_pair(lambda: tmp_path_factory.mktemp("pard2"), "pard", block_size=BLOCK, pard2_layers=[1, 3],
                       pard2_scale=1.0)
    assert p.drafter.config.pard2
    return p


def requests_for(pair, seed, temperature=0.0):
    """The probe (where the pair accepts several drafts) and four random prompts of different lengths;
    max_new_tokens of different lengths, tails shorter than the block."""
    prompts = [PROBE] + random_prompts(pair.target.config.vocab_size, (3, 21, 9, 14), seed)
    return [Request(tuple(p), m, temperature=temperature, seed=seed + i if temperature else None)
            for i, (p, m) in enumerate(zip(prompts, (23, 17, 5, 30, 2)))]


_refs = {}


def reference(pair, req, block_size=None):
    """Engine.generate_spec for `req` alone (cached per pair, request and block)."""
    key = (id(pair), req, block_size)
    if key not in _refs:
        engine = Engine(pair.target, pair.drafter, max_seq_len=len(req.prompt_ids) + req.max_new_tokens + 8)
        _refs[key] = engine.generate_spec(req.prompt_ids, req.max_new_tokens, req.stop_ids, req.temperature,
                                          block_size=block_size, seed=req.seed)
    return _refs[key]


def check(pair, engine, requests, block_size=None, acceptance=True):
    results = run_staggered(engine, requests)
    for i, req in enumerate(requests):
        ref, got = reference(pair, req, block_size), results[i]
        assert got.error is None, got.error
        assert got.tokens == ref.tokens, f"pair seed {pair.seed}, request {i}"
        if acceptance:
            assert got.acceptance_lengths == ref.acceptance_lengths, f"pair seed {pair.seed}, request {i}"
    assert engine.pool.free_pages == 64
    assert engine.kind_drafting.seen == {}, "a finished request's drafter state was kept"
    return results


def multi_token_steps(results) -> int:
    return sum(a > 1 for r in results.values() for a in r.acceptance_lengths)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("max_batch", [2, 5])
def test_greedy_equals_single_request(pair, name, max_batch):
    engine = BatchEngine(pair.target, pair.drafter, CONFIGS[name], max_batch=max_batch, kv_pages=64)
    assert isinstance(engine.kind_drafting, draft_pard.Drafting)
    full = engine.config.adaptive_verify is False
    results = check(pair, engine, requests_for(pair, fresh_seed()),
                    acceptance=engine.verify_rows == engine.block_rows)
    if full:
        assert engine.verify_rows == engine.block_rows
    assert multi_token_steps(results) > 0, f"pair seed {pair.seed}: no step accepted a draft"


@pytest.mark.parametrize("name", ["all-off", "full-verify", "per-request-draft"])
@pytest.mark.parametrize("max_batch", [2, 5])
def test_sampled_equals_single_request(pair, name, max_batch):
    config = replace(CONFIGS[name], adaptive_verify=False)
    engine = BatchEngine(pair.target, pair.drafter, config, max_batch=max_batch, kv_pages=64)
    check(pair, engine, requests_for(pair, fresh_seed(), temperature=1.0))


def test_greedy_and_sampled_requests_draft_together(pair):
    seed = fresh_seed()
    requests = [replace(r, temperature=0.9, seed=seed + i) if i % 2 else r
                for i, r in enumerate(requests_for(pair, seed))]
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=5, kv_pages=64)
    check(pair, engine, requests)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_smaller_block(pair, temperature):
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=3, kv_pages=64, block_size=3)
    check(pair, engine, requests_for(pair, fresh_seed(), temperature), block_size=3)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_verify(pair, temperature):
    """The verify graphed (StaticShapeStep on the CPU), the PARD draft eager: its blocks go through the
    gather of step._launch_graphed."""
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=3, kv_pages=64,
                         graph_step_factory=StaticShapeStep)
    check(pair, engine, requests_for(pair, fresh_seed(), temperature))
    assert {key[0] for key in engine.graphs.steps} == {"target", "prefill", "mixed"}, "the graphed verify or prefill never ran"


def test_adaptive_verify_keeps_the_ar_tokens(pair):
    """Adaptive verify trims blocks (acceptance lengths differ by design): the tokens stay the target's."""
    engine = BatchEngine(pair.target, pair.drafter, EAGER_ADAPTIVE, max_batch=5, kv_pages=64)
    requests = requests_for(pair, fresh_seed())
    results = run_staggered(engine, requests)
    assert engine.verify_rows < engine.block_rows, "the adaptive budget never trimmed a block"
    ar = Engine(pair.target, None, max_seq_len=64)
    for i, req in enumerate(requests):
        assert results[i].error is None
        assert results[i].tokens == ar.generate_ar(req.prompt_ids, req.max_new_tokens).tokens, f"request {i}"


@pytest.mark.parametrize("graphed", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_first(pair, graphed, temperature):
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(verify_prefix=2), max_batch=3, kv_pages=64,
                         graph_step_factory=StaticShapeStep if graphed else None)
    check(pair, engine, requests_for(pair, fresh_seed(), temperature))
    assert engine.second_passes > 0 or temperature > 0


@pytest.mark.parametrize("variant", ["pard", "pard2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_long_prompts_catch_up_in_chunks(pair, pard2_pair, monkeypatch, variant, temperature):
    """prefill_chunk 4: the prompts go into the draft cache in forwards of at most 4 rows a request
    before the group's draft forward; the output stays the single-request engine's."""
    p = pair if variant == "pard" else pard2_pair
    longest, catch_ups = [], []
    original = draft_pard.pard_forward

    def recording(drafter, cache, layout, ids, features, logit_rows):
        longest.append(max(s.rows for s in layout.segments))
        catch_ups.append(logit_rows.numel() == 0)
        return original(drafter, cache, layout, ids, features, logit_rows)

    monkeypatch.setattr(draft_pard, "pard_forward", recording)
    engine = BatchEngine(p.target, p.drafter, BatchConfig(prefill_chunk=4), max_batch=3, kv_pages=64)
    check(p, engine, requests_for(p, fresh_seed(), temperature))
    assert max(longest) <= 4 + BLOCK - 2 and any(catch_ups), "no prompt was caught up in chunks"


@pytest.mark.parametrize("batched", [True, False])
def test_one_draft_forward_per_group(pair, monkeypatch, batched):
    """batched_draft: one PARD forward per step for all decoding requests; off: one per request."""
    calls = []
    original = draft_pard.pard_forward

    def counting(drafter, cache, layout, *args):
        calls.append(len(layout.segments))
        return original(drafter, cache, layout, *args)

    monkeypatch.setattr(draft_pard, "pard_forward", counting)
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(batched_draft=batched), max_batch=5, kv_pages=64)
    requests = requests_for(pair, fresh_seed())
    ids = [engine.submit(r) for r in requests]
    results = {r.request_id: r for r in engine.run_until_done()}
    for i, req in zip(ids, requests):
        assert results[i].tokens == reference(pair, req).tokens
    if batched:
        assert max(calls) == 5 and len(calls) <= engine.steps
    else:
        assert set(calls) == {1} and len(calls) > engine.steps


def test_cancel_releases_the_drafter_state(pair):
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=3, kv_pages=64)
    ids = [engine.submit(r) for r in requests_for(pair, fresh_seed())]
    for _ in range(4):
        engine.step()
    assert ids[0] in engine.kind_drafting.seen
    assert engine.cancel(ids[0])
    assert ids[0] not in engine.kind_drafting.seen
    engine.run_until_done()
    assert engine.kind_drafting.seen == {} and engine.pool.free_pages == 64


@pytest.mark.parametrize("name", ["all-off", "full-verify"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_pard2_equals_single_request(pard2_pair, name, temperature):
    config = replace(CONFIGS[name], adaptive_verify=False)
    engine = BatchEngine(pard2_pair.target, pard2_pair.drafter, config, max_batch=3, kv_pages=64)
    assert engine.feature_layers == (0, 2)
    results = check(pard2_pair, engine, requests_for(pard2_pair, fresh_seed(), temperature))
    assert temperature > 0 or multi_token_steps(results) > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_pard2_graphed_verify(pard2_pair, temperature):
    """The features come from the graphed verify's output buffer: consumed before the next replay."""
    engine = BatchEngine(pard2_pair.target, pard2_pair.drafter, BatchConfig(), max_batch=3, kv_pages=64,
                         graph_step_factory=StaticShapeStep)
    check(pard2_pair, engine, requests_for(pard2_pair, fresh_seed(), temperature))


def test_replay_equals_single_request_replay(pair):
    """Acceptance replay (the bench's device): the PARD drafter runs, the planned drafts overwrite its
    tokens; the planned acceptance lengths and the target's tokens, as generate_spec(replay=...)."""
    from specpilot.engine.replay import AcceptanceReplay

    engine = Engine(pair.target, pair.drafter, max_seq_len=64)
    prompts = random_prompts(pair.target.config.vocab_size, (4, 11, 7), fresh_seed())
    transcripts = [engine.generate_ar(p, 30).tokens for p in prompts]
    refs = [engine.generate_spec(p, 30, replay=AcceptanceReplay(t, 2.5)) for p, t in zip(prompts, transcripts)]
    batch = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=3, kv_pages=64)
    ids = [batch.submit(Request(tuple(p), 30, replay=AcceptanceReplay(t, 2.5))) for p, t in zip(prompts, transcripts)]
    results = {r.request_id: r for r in batch.run_until_done()}
    for i, ref in zip(ids, refs):
        assert results[i].tokens == ref.tokens
        assert results[i].acceptance_lengths == ref.acceptance_lengths
        assert results[i].replay_shortfalls == ref.replay_shortfalls == 0
