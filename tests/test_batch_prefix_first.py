"""Prefix-first verification (BatchConfig.verify_prefix, engine/batch/prefix_first.py) against the
single-request engine (fp32, CPU): every request's tokens and acceptance lengths equal
Engine.generate_spec's for it alone, for several prefixes, greedy and sampled, at concurrency 1 and N
with staggered arrivals (prefill chunks beside pass 1), tails shorter than the block, stop ids, acceptance
replay, the eager and the graphed path (graphs.StaticShapeStep); and planted bugs that the same
comparison catches."""
import pytest
import torch

from batch_helpers import accepting_pair, random_prompts, run_staggered, single
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.accept import new_tokens
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, prefix_first, step
from specpilot.engine.graphs import StaticShapeStep

VOCAB, BLOCK = 10, 6


@pytest.fixture(scope="module")
def pair():
    """vocab 10, block 6, a seed whose pair accepts several drafts in some greedy steps."""
    return accepting_pair(VOCAB, BLOCK, fresh_seed(), lambda s: requests_for(s))


def requests_for(seed, temperature=0.0, stop_ids=()):
    """Five requests of different prompt lengths and max_new_tokens (tails shorter than the block)."""
    prompts = random_prompts(VOCAB, (3, 21, 9, 14, 6), seed)
    return [Request(tuple(p), m, temperature=temperature, seed=seed + i if temperature else None, stop_ids=stop_ids)
            for i, (p, m) in enumerate(zip(prompts, (17, 5, 30, 2, 11)))]


def engine_for(target, drafter, prefix, concurrency, graphed=False, **config):
    return BatchEngine(target, drafter, BatchConfig(verify_prefix=prefix, **config), max_batch=concurrency, kv_pages=64,
                       graph_step_factory=StaticShapeStep if graphed else None)


def differences(target, drafter, requests, results) -> list:
    """The requests whose tokens or acceptance lengths differ from the single-request engine's."""
    bad = []
    for i, req in enumerate(requests):
        ref, got = single(target, drafter, req), results[i]
        assert got.error is None, got.error
        if got.tokens != ref.tokens or got.acceptance_lengths != ref.acceptance_lengths:
            bad.append(i)
    return bad


@pytest.fixture
def second_passes(monkeypatch):
    """Counts the verify passes that start after a prefix (pass 2), to show the tests reach them."""
    count = {"pass2": 0}
    original = step.verify

    def spy(engine, decoding, drafts, windows, *args, **kwargs):
        if any(skip for skip, _ in windows.values()):
            count["pass2"] += 1
        return original(engine, decoding, drafts, windows, *args, **kwargs)
    monkeypatch.setattr(step, "verify", spy)
    return count


def needs_second_pass(target, drafter, requests, prefix) -> bool:
    """Whether the single-request engine produced more than `prefix` tokens in some step (so at least
    `prefix` drafts were accepted: prefix-first must have run pass 2)."""
    return any(a > prefix for req in requests for a in single(target, drafter, req).acceptance_lengths)


@pytest.mark.parametrize("graphed", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("prefix", [1, 2, 4])
def test_prefix_first_equals_single_request(pair, prefix, concurrency, temperature, graphed, second_passes):
    target, drafter, seed = pair
    requests = requests_for(seed, temperature)
    engine = engine_for(target, drafter, prefix, concurrency, graphed)
    results = run_staggered(engine, requests)
    assert differences(target, drafter, requests, results) == [], f"seed {seed}"
    assert engine.pool.free_pages == 64
    if needs_second_pass(target, drafter, requests, prefix):
        assert second_passes["pass2"] > 0, "no request reached pass 2"
    assert engine.verify_rows <= engine.block_rows
    if graphed:
        rows = {key[2] for key in engine.graphs.steps if key[0] == "target"}
        assert prefix in rows, "pass 1 never ran graphed"
        assert rows <= {prefix, BLOCK - prefix}, f"target graphs over {rows} rows"


def test_second_pass_is_reached_and_saves_rows(pair, second_passes):
    """At P = 1 the accepting pair takes pass 2 in some steps and skips it in others."""
    target, drafter, seed = pair
    requests = requests_for(seed)
    engine = engine_for(target, drafter, 1, 3)
    results = run_staggered(engine, requests)
    assert differences(target, drafter, requests, results) == []
    assert second_passes["pass2"] > 0
    assert engine.second_passes == second_passes["pass2"] and 0 < engine.second_pass_requests
    assert engine.verify_rows < engine.block_rows


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("mechanism", ["ragged_verify", "batched_draft"])
def test_with_a_batching_mechanism_off(pair, mechanism, temperature):
    """One forward per request (verify or draft): the eager path's groups, each request's own blocks."""
    target, drafter, seed = pair
    requests = requests_for(seed, temperature)
    results = run_staggered(engine_for(target, drafter, 2, 3, graphed=True, **{mechanism: False}), requests)
    assert differences(target, drafter, requests, results) == [], f"seed {seed}"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_ids(pair, temperature):
    """Stop ids taken from the outputs themselves, so requests stop mid-block."""
    target, drafter, seed = pair
    plain = requests_for(seed, temperature)
    stops = tuple({single(target, drafter, r).tokens[min(3, len(single(target, drafter, r).tokens) - 1)]
                   for r in plain[:2]})
    requests = requests_for(seed, temperature, stop_ids=stops)
    for graphed in (False, True):
        results = run_staggered(engine_for(target, drafter, 2, 3, graphed), requests)
        assert differences(target, drafter, requests, results) == [], f"seed {seed}, stop ids {stops}"


def test_replay_equals_single_request_replay(pair, second_passes):
    """Acceptance replay (the scale tier's benchmark device) plans long acceptances, so pass 2 runs
    often: planned acceptance lengths and tokens as Engine.generate_spec(replay=...)."""
    from specpilot.engine import Engine
    from specpilot.engine.replay import AcceptanceReplay

    target, drafter, seed = pair
    prompts = random_prompts(VOCAB, (5, 12, 8), seed)
    engine = Engine(target, drafter, max_seq_len=64)
    transcripts = [engine.generate_ar(p, 30).tokens for p in prompts]
    refs = [engine.generate_spec(p, 30, replay=AcceptanceReplay(t, 4.5)) for p, t in zip(prompts, transcripts)]
    for prefix, graphed in ((2, False), (4, True)):
        batch = engine_for(target, drafter, prefix, 3, graphed)
        ids = [batch.submit(Request(tuple(p), 30, replay=AcceptanceReplay(t, 4.5))) for p, t in zip(prompts, transcripts)]
        results = {r.request_id: r for r in batch.run_until_done()}
        for i, ref in zip(ids, refs):
            assert results[i].tokens == ref.tokens and results[i].acceptance_lengths == ref.acceptance_lengths
            assert results[i].replay_shortfalls == ref.replay_shortfalls == 0
        assert second_passes["pass2"] > 0, f"P={prefix}: no request reached pass 2"
        second_passes["pass2"] = 0


def test_warmup_captures_both_passes(pair):
    """warmup(max_context) captures pass 1's (T = P) and pass 2's (T = block - P) target graphs: the
    run captures nothing new."""
    target, drafter, seed = pair
    requests = requests_for(seed)
    engine = engine_for(target, drafter, 2, 3, graphed=True)
    count = engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    captured = set(engine.graphs.steps)
    assert count == len(captured) and {k[2] for k in captured if k[0] == "target"} == {2, BLOCK - 2}
    results = run_staggered(engine, requests)
    assert set(engine.graphs.steps) == captured, f"captured during the run: {set(engine.graphs.steps) - captured}"
    assert differences(target, drafter, requests, results) == []


def test_prefix_first_replaces_adaptive_verify(pair):
    target, drafter, _ = pair
    config = BatchConfig(verify_prefix=2)
    assert config.adaptive_verify and not config.adaptive
    assert BatchEngine(target, drafter, config, kv_pages=64).verify_row_choices == (BLOCK,)


def test_bad_settings_are_refused(pair):
    target, drafter, _ = pair
    with pytest.raises(ValueError, match="verify_prefix=-1 must be >= 0"):
        BatchConfig(verify_prefix=-1)
    with pytest.raises(ValueError, match="must be an int"):
        BatchConfig(verify_prefix=2.0)
    with pytest.raises(ValueError, match=f"verify_prefix={BLOCK} must be below the block size {BLOCK}"):
        engine_for(target, drafter, BLOCK, 2)
    with pytest.raises(ValueError, match="verify_prefix=4 must be below the block size 3"):
        BatchEngine(target, drafter, BatchConfig(verify_prefix=4), block_size=3, kv_pages=8)


def test_planted_skipped_second_pass_is_caught(pair, monkeypatch):
    """A planted bug: a fully accepted prefix commits from pass 1 (its last draft as the bonus) instead
    of going on to pass 2. The tokens stay the target's, but the acceptance lengths differ from the
    single-request engine's, and the comparison the tests use says so."""
    target, drafter, seed = pair
    original = prefix_first._judge_greedy

    def skip_pass_2(s, d, block, posterior, p):
        decision = original(s, d, block, posterior, p)
        if decision[0] == "pass 2":
            return "commit", p - 1, new_tokens(block, posterior, p - 1)
        return decision
    monkeypatch.setattr(prefix_first, "_judge_greedy", skip_pass_2)
    requests = requests_for(seed)
    assert needs_second_pass(target, drafter, requests, 1)
    results = run_staggered(engine_for(target, drafter, 1, 3), requests)
    assert differences(target, drafter, requests, results) != []


def test_planted_fresh_uniforms_in_pass_2_are_caught(pair, monkeypatch):
    """A planted bug: pass 2 of a sampled request draws its own uniforms (two rejection samplings
    instead of one split in two). Each pass is a valid rejection sampling, but the generator's draws
    no longer follow the single-request engine's, and the token comparison catches it."""
    target, drafter, seed = pair
    original = prefix_first._finish_sampled

    def fresh_uniforms(s, d, logits, uniforms, p):
        redrawn = torch.rand(uniforms.shape, generator=s.generator, dtype=uniforms.dtype)
        return original(s, d, logits, redrawn, p)
    monkeypatch.setattr(prefix_first, "_finish_sampled", fresh_uniforms)
    requests = requests_for(seed, 1.0)
    assert needs_second_pass(target, drafter, requests, 1)
    results = run_staggered(engine_for(target, drafter, 1, 3), requests)
    assert differences(target, drafter, requests, results) != []
