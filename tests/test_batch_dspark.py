"""Batched drafting with the DSpark drafter (engine/batch/draft_dspark.py) against the single-request
engine (fp32, CPU, a tiny random pair that accepts several drafts): every request's tokens and
acceptance lengths equal Engine.generate_spec's for it alone, greedy and sampled with seeds, with
requests joining and leaving mid-run, tails shorter than the block, every BatchConfig, a smaller
block, the graphed verify, adaptive verify and prefix-first; the group drafts in one forward."""
import pytest
import torch

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, random_prompts, run_staggered
from drafter_helpers import KindPair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, draft_dspark
from specpilot.engine.graphs import StaticShapeStep
from specpilot.engine.replay import AcceptanceReplay
from specpilot.models import load_drafter

VOCAB = 320          # the pair's (tiny-llama with the byte tokenizer); prompts stay below its specials


MARKOV_SCALE = 30.0  # flips about a fifth of the two-token head's drafts, most steps still accept


@torch.no_grad()
def strong_markov(drafter, seed: int) -> None:
    """The random Markov head barely moves the two-token head's argmax, so a batched Markov head that
    fed the wrong previous token would pass unseen: W2's rows of tokens 0 and 1 become +-MARKOV_SCALE
    times one random vector, so whether row k drafts 0 or 1 often depends on the token row k - 1 drew."""
    w = torch.randn(drafter.markov_w2.weight.shape[1], generator=torch.Generator().manual_seed(seed))
    drafter.markov_w2.weight[0], drafter.markov_w2.weight[1] = MARKOV_SCALE * w, -MARKOV_SCALE * w


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Block 5 (4 drafts from a 4-row draft block), two-token heads: the first of a few consecutive
    seeds whose single-request runs of requests_for(seed) accept >= 2 drafts in at least 3 steps, and
    whose Markov head matters (without it the same pair drafts otherwise: else a batched Markov head
    that fed the wrong previous token would pass the comparisons below unseen)."""
    base = fresh_seed()
    for seed in range(base, base + 12):
        p = KindPair(tmp_path_factory.mktemp("batch_dspark"), "dspark", seed, block_size=5, preset="tiny-llama",
                     two_token_head=True)
        plain = load_drafter(p.drafter_dir, p.target)
        strong_markov(p.drafter, seed)
        strong = [single(p, r).acceptance_lengths for r in requests_for(seed)]
        without = [Engine(p.target, plain, max_seq_len=64).generate_spec(r.prompt_ids, r.max_new_tokens).acceptance_lengths
                   for r in requests_for(seed)]
        if sum(a > 2 for lengths in strong for a in lengths) >= 3 and strong != without:
            assert p.drafter.kind == "dspark" and p.drafter.block_size == 5
            return p
    raise AssertionError(f"no dspark pair of seeds {base}..{base + 11} accepted two drafts in 3 steps "
                         "with a Markov head that changes its drafts")


@pytest.fixture(scope="module")
def flat_pair(tmp_path_factory):
    """A plain random pair (no two-token head): flat distributions, so at temperature > 0 the accept
    and the residual draw depend on every draft probability (a peaked pair's hardly do); no
    confidence head."""
    p = KindPair(tmp_path_factory.mktemp("batch_dspark_flat"), "dspark", seed=fresh_seed(), block_size=5,
                 preset="tiny-llama", confidence_head=False)
    strong_markov(p.drafter, p.seed)
    return p


def requests_for(seed, temperature=0.0, lengths=(3, 21, 9, 14, 6), new=(17, 5, 30, 2, 11)):
    """Different prompt lengths and max_new_tokens (tails shorter than the block; one of 2 rows)."""
    prompts = random_prompts(VOCAB, lengths, seed)
    return [Request(tuple(p), m, temperature=temperature, seed=seed + i if temperature else None)
            for i, (p, m) in enumerate(zip(prompts, new))]


def single(pair, req, block_size=None):
    engine = Engine(pair.target, pair.drafter, max_seq_len=len(req.prompt_ids) + req.max_new_tokens + 8)
    return engine.generate_spec(req.prompt_ids, req.max_new_tokens, req.stop_ids, req.temperature, seed=req.seed,
                                block_size=block_size)


def check(pair, requests, results, acceptance=True, block_size=None) -> list:
    """Asserts every request equals the single-request run; returns the reference results."""
    refs = []
    for i, req in enumerate(requests):
        ref, got = single(pair, req, block_size), results[i]
        assert got.error is None, got.error
        assert got.tokens == ref.tokens, f"seed {pair.seed}, request {i}"
        if acceptance:
            assert got.acceptance_lengths == ref.acceptance_lengths, f"seed {pair.seed}, request {i}"
        refs.append(ref)
    return refs


def engine_for(pair, config=BatchConfig(adaptive_verify=False), max_batch=3, **kwargs):
    return BatchEngine(pair.target, pair.drafter, config, max_batch=max_batch, kv_pages=64, **kwargs)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_equals_single_request(pair, name):
    """max_batch 3 of 5 requests: they join and leave mid-run; every mechanism on and off."""
    requests = requests_for(pair.seed)
    engine = engine_for(pair, CONFIGS[name])
    check(pair, requests, run_staggered(engine, requests), acceptance=engine.verify_rows == engine.block_rows)
    assert engine.pool.free_pages == 64
    assert engine.kind_drafting.confidence == {}, "a finished request's confidence was kept"


def test_smaller_block(pair):
    requests = requests_for(pair.seed + 1)
    engine = engine_for(pair, block_size=3)
    check(pair, requests, run_staggered(engine, requests, every=1), block_size=3)


def test_sampled_equals_single_request_draws(pair):
    """Temperature > 0 (a greedy request in the same group): the drafts, the draft probabilities and
    the accept draw from each request's own generator in the single engine's order."""
    for offset in range(2, 10):         # request seeds until a sampled draft is accepted (so q is read)
        prompts = random_prompts(VOCAB, (5, 11, 8, 3), pair.seed + offset)
        requests = [Request(tuple(p), m, temperature=t, seed=pair.seed + offset + i)
                    for i, (p, m, t) in enumerate(zip(prompts, (14, 9, 20, 6), (1.0, 0.7, 0.0, 1.5)))]
        refs = check(pair, requests, run_staggered(engine_for(pair, max_batch=4), requests, every=1))
        if any(a > 1 for r in refs[:2] + refs[3:] for a in r.acceptance_lengths):
            return
    raise AssertionError(f"pair seed {pair.seed}: no sampled draft accepted over 8 request seeds")


def test_sampled_flat_pair(flat_pair):
    """Flat draft distributions at several temperatures: each accept and residual draw reads q."""
    assert flat_pair.drafter.confidence is None
    for offset in range(8):             # request seeds until a draft is accepted (so q is read)
        requests = [Request(r.prompt_ids, r.max_new_tokens, temperature=t, seed=r.seed)
                    for r, t in zip(requests_for(flat_pair.seed + offset, 1.0), (1.0, 0.6, 1.3, 2.0, 0.9))]
        refs = check(flat_pair, requests, run_staggered(engine_for(flat_pair, max_batch=4), requests, every=1))
        if any(a > 1 for r in refs for a in r.acceptance_lengths):
            return
    raise AssertionError(f"pair seed {flat_pair.seed}: no draft accepted over 8 request seeds: q never tested")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_verify(pair, temperature):
    """The verify through the graphed path (StaticShapeStep on the CPU), the drafting eager: the blocks
    go through the gather branch of step._launch_graphed. After warmup the run captures nothing new."""
    requests = requests_for(pair.seed + 3, temperature)
    engine = engine_for(pair, BatchConfig(), graph_step_factory=StaticShapeStep)
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    captured, calls = set(engine.graphs.steps), []
    original = engine.graphs.target
    engine.graphs.target = lambda *a: calls.append(1) or original(*a)
    check(pair, requests, run_staggered(engine, requests))
    assert calls, "the graphed verify never ran"
    assert set(engine.graphs.steps) == captured, f"captured during the run: {set(engine.graphs.steps) - captured}"
    assert {key[0] for key in captured} == {"target", "prefill", "mixed"}, "DFlash's draft graphs were captured for a DSpark drafter"


def test_adaptive_verify_tokens_equal(pair):
    """A budget that trims: the tokens stay the single engine's (acceptance lengths differ by design)."""
    requests = requests_for(pair.seed + 4)
    engine = engine_for(pair, EAGER_ADAPTIVE, max_batch=5)
    check(pair, requests, run_staggered(engine, requests, every=1), acceptance=False)
    assert engine.verify_rows < engine.block_rows, "the budget never trimmed"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_first(pair, temperature):
    requests = requests_for(pair.seed, temperature)      # the fixture's: greedy, they accept drafts
    engine = engine_for(pair, BatchConfig(verify_prefix=1))
    check(pair, requests, run_staggered(engine, requests))
    assert engine.second_passes > 0, "prefix-first never ran a second pass"


def test_replay_still_works(pair):
    """Replay: the drafter runs, the planned drafts replace its tokens; acceptance as planned."""
    prompts = random_prompts(VOCAB, (6, 13, 9), pair.seed + 6)
    single_engine = Engine(pair.target, pair.drafter, max_seq_len=128)
    transcripts = [single_engine.generate_ar(p, 24).tokens for p in prompts]
    refs = [single_engine.generate_spec(p, 24, replay=AcceptanceReplay(t, 2.5)) for p, t in zip(prompts, transcripts)]
    engine = engine_for(pair)
    ids = [engine.submit(Request(tuple(p), 24, replay=AcceptanceReplay(t, 2.5))) for p, t in zip(prompts, transcripts)]
    results = {r.request_id: r for r in engine.run_until_done()}
    for i, ref in zip(ids, refs):
        assert results[i].tokens == ref.tokens and results[i].acceptance_lengths == ref.acceptance_lengths
        assert results[i].replay_shortfalls == 0 and max(ref.acceptance_lengths) >= 2


def test_one_draft_forward_per_group(pair, monkeypatch):
    """The whole decoding group drafts in one block forward over all its requests' rows."""
    calls = []
    original = draft_dspark.block_hidden

    def spy(drafter, cache, layout, block_ids):
        calls.append(len(layout.segments))
        return original(drafter, cache, layout, block_ids)
    monkeypatch.setattr(draft_dspark, "block_hidden", spy)
    requests = requests_for(pair.seed + 7)
    engine = engine_for(pair)
    decoding_per_step, results, pending = [], {}, list(requests)
    ids = []
    while pending or not engine.idle:
        if pending:
            ids.append(engine.submit(pending.pop(0)))
        before = len(calls)
        decoding = sum(s.decoding and not s.done for s in engine.running)
        for r in engine.step():
            results[r.request_id] = r
        if len(calls) > before:
            decoding_per_step.append((len(calls) - before, calls[-1], decoding))
    check(pair, requests, {ids.index(k): v for k, v in results.items()})
    assert all(n == 1 for n, _, _ in decoding_per_step), "more than one draft forward in a step"
    assert all(segments == decoding for _, segments, decoding in decoding_per_step)
    assert max(segments for _, segments, _ in decoding_per_step) >= 3


def test_confidence_kept_per_request(pair, monkeypatch):
    """One confidence in (0, 1) per draft of each request's last step (scheduling only)."""
    seen = []
    engine = engine_for(pair)
    drafting = engine.kind_drafting
    propose = drafting.propose

    def spy(group, segments):
        out = propose(group, segments)
        seen.append({s.id: (drafting.confidence[s.id], seg.rows - 1) for s, seg in zip(group, segments)})
        return out
    monkeypatch.setattr(drafting, "propose", spy)
    run_staggered(engine, requests_for(pair.seed + 8))
    assert seen and pair.drafter.confidence is not None
    for step in seen:
        for conf, drafts in step.values():
            assert conf.shape == (drafts,) and bool(((conf > 0) & (conf < 1)).all())
    assert drafting.confidence == {}
