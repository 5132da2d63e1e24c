"""The batched engine against the single-request engine (fp32, CPU): every request's tokens equal what
Engine.generate_spec / generate_ar makes for it alone, token for token, at concurrency 1 and N, with
staggered arrivals, different lengths and stop ids, each batching mechanism on and off; acceptance
lengths equal too wherever full blocks are verified."""
import pytest
import torch

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, check_equal, accepting_pair, random_prompts, run_staggered, single
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.models import load_drafter, load_target
from specpilot.models.random_ckpt import write_pair


VOCAB = 10


@pytest.fixture(scope="module")
def small_vocab():
    """vocab 10, block 4, a seed whose pair accepts several drafts in some steps of mixed_requests."""
    return accepting_pair(VOCAB, 4, fresh_seed(), lambda s: mixed_requests(VOCAB, s))


@pytest.fixture(scope="module")
def written_pair(tmp_path_factory):
    """The random checkpoint pair on disk (vocab 320), loaded as the CLI loads it."""
    seed = fresh_seed()
    td, dd = write_pair(tmp_path_factory.mktemp("pair"), "tiny-llama", drafter_layers=2, block_size=4, seed=seed,
                        layer_ids=[1, 3])
    target = load_target(td, dtype=torch.float32)
    return target, load_drafter(dd, target), seed


def mixed_requests(vocab, seed, stop_from=None):
    """Different prompt lengths and max_new_tokens (a tail block shorter than the drafter's)."""
    prompts = random_prompts(vocab, (3, 21, 9, 14, 6), seed)
    lengths = (17, 5, 30, 1, 11)
    return [Request(tuple(p), m, stop_ids=stop_from(p) if stop_from else ()) for p, m in zip(prompts, lengths)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("concurrency", [1, 4])
def test_greedy_equals_single_request(small_vocab, name, concurrency):
    target, drafter, seed = small_vocab
    requests = mixed_requests(VOCAB, seed)
    engine = BatchEngine(target, drafter, CONFIGS[name], max_batch=concurrency, kv_pages=64)
    results = run_staggered(engine, requests)
    check_equal(target, drafter, requests, results, acceptance=engine.verify_rows == engine.block_rows, seed=seed)
    assert engine.pool.free_pages == 64


def test_adaptive_trims_and_stays_exact(small_vocab):
    """A budget that really trims: fewer rows verified than drafted, tokens unchanged."""
    target, drafter, seed = small_vocab
    requests = mixed_requests(VOCAB, seed)
    engine = BatchEngine(target, drafter, EAGER_ADAPTIVE, max_batch=5, kv_pages=64)
    check_equal(target, drafter, requests, run_staggered(engine, requests, every=1), acceptance=False, seed=seed)
    assert engine.verify_rows < engine.block_rows, "the eager budget never trimmed: this test would miss a trim bug"


def test_stop_ids_per_request(small_vocab):
    """Each request stops at its own stop token (one it really produces), the others run on."""
    target, drafter, seed = small_vocab
    prompts = random_prompts(VOCAB, (4, 8, 12), seed + 7)
    free = [single(target, drafter, Request(tuple(p), 24)).tokens for p in prompts]
    requests = [Request(tuple(p), 24, stop_ids=(f[6],)) for p, f in zip(prompts, free)]
    for config in (CONFIGS["all-on"], CONFIGS["all-off"]):
        results = run_staggered(BatchEngine(target, drafter, config, max_batch=3, kv_pages=32), requests, every=1)
        for req, f, i in zip(requests, free, range(3)):
            stop = req.stop_ids[0]
            assert results[i].tokens == f[:f.index(stop) + 1]


def test_written_pair_and_chunked_prefill(written_pair):
    """The on-disk pair (vocab 320), prompts longer than the prefill chunk (chunked over steps)."""
    target, drafter, seed = written_pair
    prompts = random_prompts(320, (40, 7, 33), seed)
    requests = [Request(tuple(p), m) for p, m in zip(prompts, (12, 20, 9))]
    for chunk in (8, 256):
        engine = BatchEngine(target, drafter, BatchConfig(prefill_chunk=chunk), max_batch=3, kv_pages=16)
        check_equal(target, drafter, requests, run_staggered(engine, requests, every=1), acceptance=True, seed=seed)


def test_prefill_steps_are_counted_apart(written_pair):
    """The steps that carry prompt rows are counted and timed apart from the decode-only ones (bench
    --concurrency reports their share of a run): a 40-token prompt at chunk 8 takes five."""
    target, drafter, seed = written_pair
    engine = BatchEngine(target, drafter, BatchConfig(prefill_chunk=8), max_batch=1, kv_pages=16)
    engine.submit(Request(tuple(random_prompts(320, (40,), seed)[0]), 12))
    engine.run_until_done()
    assert engine.prefill_steps == 5 and engine.steps > 5
    assert engine.prefill_step_s > 0 and engine.decode_step_s > 0


def test_batched_ar_equals_generate_ar(small_vocab):
    target, _, seed = small_vocab
    requests = mixed_requests(VOCAB, seed)
    engine = BatchEngine(target, None, BatchConfig(), max_batch=3, kv_pages=64)
    results = run_staggered(engine, requests)
    check_equal(target, None, requests, results, acceptance=True, seed=seed)


@pytest.mark.parametrize("drafted", [True, False])
def test_sampled_equals_single_request_draws(small_vocab, drafted):
    """Temperature > 0, full verify: each request draws from its own generator in the single engine's
    order, so its tokens equal the single engine's for the same seed, whatever else runs beside it."""
    target, drafter, seed = small_vocab
    drafter = drafter if drafted else None
    prompts = random_prompts(VOCAB, (5, 11, 8, 3), seed + 1)
    requests = [Request(tuple(p), m, temperature=t, seed=seed + i)
                for i, (p, m, t) in enumerate(zip(prompts, (14, 9, 20, 6), (1.0, 0.7, 1.5, 1.0)))]
    engine = BatchEngine(target, drafter, BatchConfig(adaptive_verify=False), max_batch=4, kv_pages=64)
    check_equal(target, drafter, requests, run_staggered(engine, requests), acceptance=True, seed=seed)


def test_waits_for_pages_then_runs(small_vocab):
    """A pool that holds one request at a time: the rest queue, then run; outputs unchanged."""
    target, drafter, seed = small_vocab
    requests = [Request(tuple(p), 20) for p in random_prompts(VOCAB, (10, 12, 8), seed)]
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=3, kv_pages=2)     # 32 slots
    for r in requests:
        engine.submit(r)
    engine.step()
    assert len(engine.running) == 1 and len(engine.queue) == 2
    results = {r.request_id: r for r in engine.run_until_done()}
    check_equal(target, drafter, requests, results, acceptance=True, seed=seed)
    assert engine.pool.free_pages == 2


def test_replay_equals_single_request_replay(written_pair):
    """Acceptance replay (the scale tier's benchmark device) per request: the planned acceptance lengths
    and the target's tokens, as Engine.generate_spec(replay=...) makes them."""
    from specpilot.engine import Engine
    from specpilot.engine.replay import AcceptanceReplay

    target, drafter, seed = written_pair
    prompts = random_prompts(320, (6, 13, 9), seed + 5)
    engine = Engine(target, drafter, max_seq_len=128)
    transcripts = [engine.generate_ar(p, 30).tokens for p in prompts]
    refs = [engine.generate_spec(p, 30, replay=AcceptanceReplay(t, 2.5)) for p, t in zip(prompts, transcripts)]
    batch = BatchEngine(target, drafter, BatchConfig(adaptive_verify=False), max_batch=3, kv_pages=16)
    ids = [batch.submit(Request(tuple(p), 30, replay=AcceptanceReplay(t, 2.5))) for p, t in zip(prompts, transcripts)]
    results = {r.request_id: r for r in batch.run_until_done()}
    for i, ref in zip(ids, refs):
        assert results[i].tokens == ref.tokens == transcripts[ids.index(i)]
        assert results[i].acceptance_lengths == ref.acceptance_lengths and max(ref.acceptance_lengths) >= 2
        assert results[i].replay_shortfalls == ref.replay_shortfalls == 0
    bad = batch.submit(Request((1, 2), 5, temperature=1.0, replay=AcceptanceReplay([1], 2.0)))
    assert "replay needs greedy decoding" in {r.request_id: r for r in batch.run_until_done()}[bad].error


def test_request_times_take_no_device_sync(small_vocab, monkeypatch):
    """Submit, first token and finish are host events: neither submit nor step calls BatchEngine.clock
    (a device sync on CUDA, which would wait for the step AR's lookahead launched ahead); the times
    still come out in order."""
    target, drafter, seed = small_vocab
    for pair_drafter in (drafter, None):
        engine = BatchEngine(target, pair_drafter, BatchConfig(), max_batch=2, kv_pages=64)
        monkeypatch.setattr(engine, "clock", lambda: pytest.fail("a request's time synced the device"))
        for r in mixed_requests(VOCAB, seed)[:3]:
            engine.submit(r)
        results = engine.run_until_done()
        assert len(results) == 3 and all(r.error is None and r.prefill_s > 0 and r.decode_s >= 0 for r in results)
