"""The batched engine on hybrid recurrent targets (Gated DeltaNet + gated attention; fp32, CPU): every
request's tokens and acceptance lengths equal what Engine.generate_spec makes for it alone (its tokens
Engine.generate_ar's), with requests joining and leaving mid-run, recurrent state slots reused,
prompts prefilled over several chunks, each batching mechanism on and off. Planted bugs (the state
committed one row late, a reused slot not cleared) must make these comparisons fail."""
from dataclasses import replace

import pytest

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, check_equal, random_prompts, run_staggered, single, tiny_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.engine.batch.hybrid_state import RecurrentSlots
from specpilot.engine.replay import AcceptanceReplay

VOCAB = 10
PRESET = "tiny-qwen3.5"


def mixed_requests(seed, temperature=0.0, lengths=(3, 21, 9, 14, 6), max_new=(17, 5, 30, 2, 11)):
    """Different prompt lengths and max_new_tokens (tails shorter than the block of 4); sampled ones
    each with its own seed (top_p 1: the single-request engine has no top_p)."""
    prompts = random_prompts(VOCAB, lengths, seed)
    return [Request(tuple(p), m, temperature=temperature, seed=seed + i if temperature else None)
            for i, (p, m) in enumerate(zip(prompts, max_new))]


@pytest.fixture(scope="module")
def pair():
    """A tiny hybrid target and DFlash drafter (vocab 10, block 4) whose single-request outputs on
    mixed_requests accept several drafts in at least 3 steps (the accept bookkeeping and the state
    commit must see multi-token steps)."""
    start = fresh_seed()
    for seed in range(start, start + 30):
        target, drafter = tiny_pair(VOCAB, 4, seed, PRESET)
        multi = sum(a > 1 for r in mixed_requests(seed) for a in single(target, drafter, r).acceptance_lengths)
        if multi >= 3:
            return target, drafter, seed
    raise RuntimeError(f"no hybrid pair seed in [{start}, {start + 30}) accepts drafts")


def check_released(engine, pages):
    assert engine.pool.free_pages == pages
    assert engine.recurrent.free_slots == engine.max_batch and not engine.recurrent.pending


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("concurrency", [1, 2, 5])
def test_greedy_equals_single_request(pair, name, concurrency):
    target, drafter, seed = pair
    requests = mixed_requests(seed)
    engine = BatchEngine(target, drafter, CONFIGS[name], max_batch=concurrency, kv_pages=64)
    results = run_staggered(engine, requests)
    check_equal(target, drafter, requests, results, seed, acceptance=engine.verify_rows == engine.block_rows)
    check_released(engine, 64)


@pytest.mark.parametrize("name", ["all-on", "all-off"])
def test_sampled_equals_single_request(pair, name):
    target, drafter, seed = pair
    requests = mixed_requests(seed, temperature=0.8)
    results = run_staggered(BatchEngine(target, drafter, CONFIGS[name], max_batch=3, kv_pages=64), requests)
    check_equal(target, drafter, requests, results, seed)


@pytest.mark.parametrize("ragged", [True, False])
def test_ar_equals_single_request(pair, ragged):
    target, _, seed = pair
    for temperature in (0.0, 0.8):
        requests = mixed_requests(seed, temperature)
        engine = BatchEngine(target, None, BatchConfig(ragged_verify=ragged), max_batch=2, kv_pages=64)
        check_equal(target, None, requests, run_staggered(engine, requests), seed)
        check_released(engine, 64)


def test_spec_tokens_equal_ar(pair):
    """The speculative output is the target's own: equal to single-request AR (and adaptive verify,
    with a budget that really trims, leaves it unchanged)."""
    target, drafter, seed = pair
    requests = mixed_requests(seed)
    for config in (CONFIGS["all-on"], EAGER_ADAPTIVE):
        engine = BatchEngine(target, drafter, config, max_batch=5, kv_pages=64)
        check_equal(target, None, requests, run_staggered(engine, requests, every=1), seed, acceptance=False)
    assert engine.verify_rows < engine.block_rows, "the eager budget never trimmed: this test would miss a trim bug"


@pytest.mark.parametrize("chunk", [5, 16])
def test_prompts_over_several_prefill_chunks(pair, chunk):
    """Prompts longer than the prefill chunk (the recurrent state carried from chunk to chunk; a chunk's
    budget shared by newcomers), one longer than the per-row-state limit (the chunked form)."""
    target, drafter, seed = pair
    requests = mixed_requests(seed + 3, lengths=(37, 12, 64, 23, 80), max_new=(9, 14, 6, 12, 8))
    engine = BatchEngine(target, drafter, BatchConfig(prefill_chunk=chunk), max_batch=3, kv_pages=64)
    check_equal(target, drafter, requests[:4], run_staggered(engine, requests, every=1), seed)
    long = requests[4]                        # 80 tokens: the chunked form over other chunk bounds than AR's one pass
    assert run_staggered(BatchEngine(target, drafter, BatchConfig(prefill_chunk=128), max_batch=1, kv_pages=64),
                         [long])[0].tokens == single(target, drafter, long).tokens


def replay_requests(target, drafter, seed):
    """Requests whose drafts are the target's own AR transcript up to a planned accept length per step
    (then wrong tokens, which the target rejects): steps of every accepted count, 1 to the block."""
    requests = mixed_requests(seed + 1, max_new=(17, 25, 30, 12, 11))
    engine = Engine(target, drafter, max_seq_len=128)
    out = []
    for r in requests:
        transcript = engine.generate_ar(r.prompt_ids, r.max_new_tokens).tokens
        out.append(Request(r.prompt_ids, r.max_new_tokens, replay=AcceptanceReplay(transcript, [4, 1, 3, 2, 4, 2])))
    return out


def run_replay(target, drafter, requests, max_batch=2, config=CONFIGS["full-verify"]):
    engine = BatchEngine(target, drafter, config, max_batch=max_batch, kv_pages=64)
    return run_staggered(engine, requests), engine


def test_replay_commits_the_accepted_prefix(pair):
    """Every step accepts its planned drafts and rejects the rest: the state after the accepted prefix
    is the one AR reaches (tokens equal the AR transcript, no shortfall), requests reusing slots."""
    target, drafter, seed = pair
    requests = replay_requests(target, drafter, seed)
    results, engine = run_replay(target, drafter, requests)
    for i, r in enumerate(requests):
        assert results[i].tokens == r.replay.transcript, f"seed {seed}, request {i}"
        assert results[i].replay_shortfalls == 0 and {1, 2, 3, 4} <= set(results[i].acceptance_lengths)
    check_released(engine, 64)


def test_late_commit_is_caught(pair, monkeypatch):
    """The replay test can fail: committing the state one row past the accepted prefix (the first
    rejected draft folded in) changes the output."""
    target, drafter, seed = pair
    requests = replay_requests(target, drafter, seed)
    original = RecurrentSlots.commit

    def commit_late(self, request_id, n):
        rows, every, _ = self.pending[request_id]
        original(self, request_id, min(n + 1, rows) if every else n)

    monkeypatch.setattr(RecurrentSlots, "commit", commit_late)
    results, _ = run_replay(target, drafter, requests)
    assert any(results[i].tokens != r.replay.transcript for i, r in enumerate(requests))


def test_stale_slot_is_caught(pair, monkeypatch):
    """Slot reuse is tested: a slot handed to the next request without clearing it (its last request's
    state leaking in) changes that request's output."""
    target, drafter, seed = pair
    original = RecurrentSlots.take

    def take_uncleared(self, request_id):
        saved = [(c.clone(), s.clone()) for c, s in zip(self.conv, self.state)]
        original(self, request_id)
        for (c, s), conv, state in zip(saved, self.conv, self.state):
            conv.copy_(c)
            state.copy_(s)

    monkeypatch.setattr(RecurrentSlots, "take", take_uncleared)
    for offset in range(5):         # request sets until the leak shows (a tiny random model may absorb one)
        requests = mixed_requests(seed + offset)
        results = run_staggered(BatchEngine(target, drafter, CONFIGS["all-on"], max_batch=2, kv_pages=64), requests)
        if any(results[i].tokens != single(target, drafter, r).tokens for i, r in enumerate(requests)):
            return
    raise AssertionError(f"seed {seed}: a stale slot changed no output over 5 request sets")


def test_cancel_frees_the_slot(pair):
    """A request cancelled mid-decode gives its slot back; the request admitted into it runs exact."""
    target, drafter, seed = pair
    requests = mixed_requests(seed)
    engine = BatchEngine(target, drafter, CONFIGS["all-on"], max_batch=1, kv_pages=64)
    first = engine.submit(requests[2])
    for _ in range(4):
        engine.step()
    assert engine.recurrent.free_slots == 0 and engine.cancel(first)
    second = engine.submit(requests[0])
    results = {r.request_id: r for r in engine.run_until_done()}
    assert results[first].error == "cancelled"
    assert results[second].tokens == single(target, drafter, requests[0]).tokens
    check_released(engine, 64)


def test_moe_hybrid_equals_single_request():
    """Qwen3-Next's layout (sparse MoE MLPs in the hybrid): the MoE runs over every request's rows."""
    seed = fresh_seed()
    target, drafter = tiny_pair(VOCAB, 4, seed, "tiny-qwen3-next")
    requests = mixed_requests(seed)
    for config in (CONFIGS["all-on"], CONFIGS["all-off"]):
        engine = BatchEngine(target, drafter, config, max_batch=3, kv_pages=64)
        check_equal(target, drafter, requests, run_staggered(engine, requests), seed)


def test_refuses_what_it_does_not_run(pair):
    target, drafter, _ = pair
    with pytest.raises(ValueError, match="eagerly only"):
        BatchEngine(target, drafter, BatchConfig(), kv_pages=8, graph_step_factory=object())
    engine = BatchEngine(target, drafter, BatchConfig(), kv_pages=8, engine_config=EngineConfig(cuda_graphs=False))
    assert len(engine.cache.k) == len(target.config.attention_layers) and engine.recurrent.free_slots == 8


def test_step_costs_of_a_hybrid_engine(pair):
    """The eager step-cost profile runs the hybrid forward (per-request state slots borrowed and given
    back, nothing committed) at buckets up to the engine's slots."""
    from specpilot.engine.batch.profile import measure_step_costs

    target, drafter, _ = pair
    engine = BatchEngine(target, drafter, BatchConfig(adaptive_verify=True), max_batch=2, kv_pages=64)
    table = measure_step_costs(engine, buckets=(4, 8, 16), rows_per_request=4, context=8, repeats=1)
    assert list(table.tokens) == [4, 8] and all(s > 0 for s in table.seconds)
    check_released(engine, 64)


def test_step_bytes_bounds_the_pending_records(pair, monkeypatch):
    """step_bytes (what the engine keeps off a memory-sized page pool) is what a step's pending
    records really hold: summed over the requests pending at each commit, at most
    step_bytes(their rows, their count), and equal when every record keeps a state per row."""
    target, drafter, seed = pair
    seen = []
    original = RecurrentSlots.commit

    def measuring_commit(self, request_id, n):
        records = self.pending.values()
        held = sum(t.numel() * t.element_size() for _, _, layers in records for pair in layers for t in pair)
        seen.append((held, self.step_bytes(sum(r[0] for r in records), len(records)), all(r[1] for r in records)))
        original(self, request_id, n)

    monkeypatch.setattr(RecurrentSlots, "commit", measuring_commit)
    engine = BatchEngine(target, drafter, BatchConfig(prefill_chunk=16), max_batch=3, kv_pages=64)
    run_staggered(engine, mixed_requests(seed, lengths=(3, 80, 9), max_new=(17, 5, 30)))   # 80: the chunked form
    assert seen and all(held <= bound for held, bound, _ in seen)
    assert all(held == bound for held, bound, every in seen if every)
    assert any(not every for _, _, every in seen), "no chunked-form prefill record was measured"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prefix_first_equals_single_request(pair, temperature):
    """Prefix-first on a hybrid (P = 1): pass 1's rows are committed to the state before pass 2
    continues it; tokens (and, greedy, acceptance lengths) equal the single-request engine's."""
    target, drafter, seed = pair
    requests = mixed_requests(seed, temperature)
    engine = BatchEngine(target, drafter, BatchConfig(verify_prefix=1), max_batch=3, kv_pages=64)
    check_equal(target, drafter, requests, run_staggered(engine, requests), seed, acceptance=temperature == 0)
    assert temperature > 0 or engine.second_pass_requests > 0
    check_released(engine, 64)


@pytest.mark.parametrize("prefix", [1, 2, 3])
def test_prefix_first_replay_commits_across_both_passes(pair, prefix):
    """Planned accept lengths 1..4 at P = 1..3: pass 2 runs from the state after P rows and the commit
    counts pass 1's rows once (tokens equal the AR transcript, no shortfall)."""
    target, drafter, seed = pair
    requests = replay_requests(target, drafter, seed)
    results, engine = run_replay(target, drafter, requests, config=BatchConfig(verify_prefix=prefix))
    for i, r in enumerate(requests):
        assert results[i].tokens == r.replay.transcript and results[i].replay_shortfalls == 0, f"seed {seed}, request {i}"
    assert engine.second_pass_requests > 0
    check_released(engine, 64)


def test_prefix_first_with_stops_inside_pass_one(pair):
    """A stop id among pass 1's committed rows ends the request with pass 2's record dropped."""
    target, drafter, seed = pair
    requests = [replace(r, stop_ids=(t,)) for r, t in zip(mixed_requests(seed), (0, 1, 2, 3, 4))]
    engine = BatchEngine(target, drafter, BatchConfig(verify_prefix=1), max_batch=3, kv_pages=64)
    check_equal(target, drafter, requests, run_staggered(engine, requests), seed)
    check_released(engine, 64)


def test_prefix_first_wrong_advance_is_caught(pair, monkeypatch):
    """The replay test above can fail: pass 2 continuing from the state one row short of pass 1's
    changes the output."""
    target, drafter, seed = pair
    requests = replay_requests(target, drafter, seed)

    def advance_short(self, request_id, n):
        self.commit(request_id, n - 1)
        self.ahead[request_id] = n

    monkeypatch.setattr(RecurrentSlots, "advance", advance_short)
    results, _ = run_replay(target, drafter, requests, config=BatchConfig(verify_prefix=2))
    assert any(results[i].tokens != r.replay.transcript for i, r in enumerate(requests))
