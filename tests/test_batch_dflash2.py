"""Batched drafting with the DFlash2 drafter (engine/batch/draft_dflash2.py) against the single-request
engine (fp32, CPU, tiny random pairs): every request's tokens and acceptance lengths equal
Engine.generate_spec's for it alone, greedy and sampled, with requests joining and leaving, tails
shorter than the block and than the conv kernel, every batching mechanism on / off, a smaller block,
the graphed verify, adaptive verify and prefix-first; the group's block forward is one call, and its
hidden rows and drafts equal the single-request session's (full and sliding-window layers)."""
import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, five_requests, run_staggered
from drafter_helpers import accepting_pair
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, draft_dflash2
from specpilot.engine.batch.forward import Segment
from specpilot.engine.batch.request import RequestState
from specpilot.engine.graphs import StaticShapeStep
from specpilot.models.drafters.dflash2 import layer_mask

PROMPT_VOCAB = 318            # random prompt ids below the byte tokenizer's specials
# full: every layer non-causal over its block; sliding: a causal window of 3 inside the block of 8 and
# a conv kernel of 4 (tails of 2 or 3 rows are shorter than it).
LAYOUTS = {"full": {},
           "sliding": {"layer_types": ("full_attention", "sliding_attention"), "sliding_window": 3,
                       "conv_kernel_size": 4}}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def pair(request, tmp_path_factory):
    count = itertools.count()
    return accepting_pair(lambda: tmp_path_factory.mktemp(f"dflash2_{request.param}{next(count)}"), "dflash2",
                          accepts=accepts_on_the_requests, **LAYOUTS[request.param])


def accepts_on_the_requests(pair) -> bool:
    """>= 2 drafts accepted in some step of the tests' own requests (so that the comparisons see
    multi-token steps: test_accepts_several_drafts)."""
    return max(a for req in requests_for(pair) for a in single(pair, req).acceptance_lengths) > 2


def single(pair, req: Request, block_size=None):
    engine = Engine(pair.target, pair.drafter, max_seq_len=len(req.prompt_ids) + req.max_new_tokens + 8)
    return engine.generate_spec(req.prompt_ids, req.max_new_tokens, req.stop_ids, req.temperature,
                                block_size=block_size, seed=req.seed)


def check(pair, requests, results, acceptance=True, block_size=None):
    for i, req in enumerate(requests):
        ref, got = single(pair, req, block_size), results[i]
        assert got.error is None, got.error
        assert got.tokens == ref.tokens, f"seed {pair.seed}, request {i}"
        if acceptance:
            assert got.acceptance_lengths == ref.acceptance_lengths, f"seed {pair.seed}, request {i}"


def requests_for(pair, temperature=0.0):
    return five_requests(PROMPT_VOCAB, pair.seed, temperature)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_equals_single_request(pair, name):
    """Five requests through max_batch 3: they join and leave mid-run; per-request-draft is one
    forward per request."""
    requests = requests_for(pair)
    engine = BatchEngine(pair.target, pair.drafter, CONFIGS[name], max_batch=3, kv_pages=64)
    results = run_staggered(engine, requests)
    check(pair, requests, results, acceptance=engine.verify_rows == engine.block_rows)
    assert engine.pool.free_pages == 64


def test_accepts_several_drafts(pair):
    """The comparisons above see multi-token steps (else an acceptance bug would pass unseen)."""
    lengths = [a for req in requests_for(pair) for a in single(pair, req).acceptance_lengths]
    assert max(lengths) > 2


@pytest.mark.parametrize("block_size", [3, 5])
def test_smaller_block(pair, block_size):
    requests = requests_for(pair)
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(adaptive_verify=False), max_batch=3, kv_pages=64,
                         block_size=block_size)
    check(pair, requests, run_staggered(engine, requests), block_size=block_size)


@pytest.mark.parametrize("name", ["full-verify", "per-request-draft"])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_equals_single_request_draws(pair, name, temperature):
    """Each request's own seeded generator: the selector's draws, then rejection sampling, as alone."""
    requests = requests_for(pair, temperature)
    engine = BatchEngine(pair.target, pair.drafter, CONFIGS[name], max_batch=3, kv_pages=64)
    check(pair, requests, run_staggered(engine, requests))


def test_mixed_greedy_and_sampled(pair):
    greedy, sampled = requests_for(pair), requests_for(pair, 1.0)
    requests = [greedy[0], sampled[1], greedy[2], sampled[3], sampled[4]]
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(adaptive_verify=False), max_batch=4, kv_pages=64)
    check(pair, requests, run_staggered(engine, requests, every=1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_verify(pair, temperature):
    """The verify graphed (StaticShapeStep on the CPU), the drafting eager: the blocks reach the
    graphed verify through its gather."""
    requests = requests_for(pair, temperature)
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=3, kv_pages=64,
                         graph_step_factory=StaticShapeStep)
    check(pair, requests, run_staggered(engine, requests))
    assert {key[0] for key in engine.graphs.steps} == {"target", "prefill", "mixed"}, "the graphed verify or prefill never ran"


@pytest.mark.parametrize("graphed", [False, True])
def test_adaptive_verify_tokens_equal_ar(pair, graphed):
    requests = requests_for(pair)
    engine = BatchEngine(pair.target, pair.drafter, EAGER_ADAPTIVE, max_batch=5, kv_pages=64,
                         graph_step_factory=StaticShapeStep if graphed else None)
    results = run_staggered(engine, requests, every=1)
    ar = Engine(pair.target, None, max_seq_len=64)
    for i, req in enumerate(requests):
        assert results[i].error is None and results[i].tokens == ar.generate_ar(req.prompt_ids, req.max_new_tokens).tokens
    assert engine.verify_rows < engine.block_rows, "the budget never trimmed"


@pytest.mark.parametrize("graphed", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("prefix", [1, 3])
def test_prefix_first(pair, prefix, temperature, graphed):
    requests = requests_for(pair, temperature)
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(verify_prefix=prefix), max_batch=3, kv_pages=64,
                         graph_step_factory=StaticShapeStep if graphed else None)
    check(pair, requests, run_staggered(engine, requests))


def test_replay_equals_single_request_replay(pair):
    """Acceptance replay: the drafter runs, the planned drafts overwrite its tokens (step.py)."""
    from specpilot.engine.replay import AcceptanceReplay

    prompts = [r.prompt_ids for r in requests_for(pair)[:3]]
    engine = Engine(pair.target, pair.drafter, max_seq_len=128)
    transcripts = [engine.generate_ar(p, 30).tokens for p in prompts]
    refs = [engine.generate_spec(p, 30, replay=AcceptanceReplay(t, 2.5)) for p, t in zip(prompts, transcripts)]
    batch = BatchEngine(pair.target, pair.drafter, BatchConfig(adaptive_verify=False), max_batch=3, kv_pages=64)
    ids = [batch.submit(Request(tuple(p), 30, replay=AcceptanceReplay(t, 2.5))) for p, t in zip(prompts, transcripts)]
    results = {r.request_id: r for r in batch.run_until_done()}
    for i, ref, transcript in zip(ids, refs, transcripts):
        assert results[i].tokens == ref.tokens == transcript
        assert results[i].acceptance_lengths == ref.acceptance_lengths and max(ref.acceptance_lengths) >= 2


def test_group_drafts_in_one_forward(pair, monkeypatch):
    """One block forward per step for all decoding requests (not a loop per request)."""
    calls = []
    original = draft_dflash2.block_hidden

    def spy(drafter, cache, layout, inputs):
        calls.append(len(layout.segments))
        return original(drafter, cache, layout, inputs)
    monkeypatch.setattr(draft_dflash2, "block_hidden", spy)
    requests = [Request(tuple(r.prompt_ids), 12) for r in requests_for(pair)[:3]]
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(adaptive_verify=False), max_batch=3, kv_pages=64)
    for req in requests:
        engine.submit(req)
    results = engine.run_until_done()
    check(pair, requests, results)
    assert max(calls) == 3 and len(calls) <= engine.steps


def _state(engine, i, context, anchor, temperature=0.0, seed=None):
    """A decoding request whose `context` committed rows' features are pending for the draft cache."""
    state = RequestState(id=i, req=Request((anchor,), 16, temperature=temperature, seed=seed), submitted_s=0.0,
                         generator=torch.Generator().manual_seed(seed) if seed is not None else None)
    state.pages = engine.pool.alloc(4)
    state.tokens, state.start = [anchor], context
    return state


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_block_forward_equals_single_session(pair, temperature):
    """Three requests (contexts of 13, 4 and 21 rows; a whole block beside tails of 2 and 3 rows) in
    one forward: each request's drafting hidden rows, drafts and draft probabilities equal the
    single-request session's for it alone (its context and block only)."""
    target, drafter = pair.target, pair.drafter
    width = len(drafter.target_layer_ids) * target.config.hidden_size
    g = torch.Generator().manual_seed(fresh_seed())
    contexts, rows = (13, 4, 21), (drafter.block_size, 2, 3)
    feats = [torch.randn(c, width, generator=g) for c in contexts]
    anchors = torch.randint(0, PROMPT_VOCAB, (3,), generator=g).tolist()
    seeds = [int(s) for s in torch.randint(0, 2**31, (3,), generator=g)]
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=3, kv_pages=64)
    drafter.ensure_rope(64)
    states = [_state(engine, i, c, a, temperature, s) for i, (c, a, s) in enumerate(zip(contexts, anchors, seeds))]
    for s, f in zip(states, feats):
        half = f.shape[0] // 2
        s.ctx = [(f[:half], 0), (f[half:], half)]        # two pending pieces, as prefill chunks leave them
    segments = [Segment(s.pages, c, t) for s, c, t in zip(states, contexts, rows)]
    with torch.inference_mode():
        plan, inputs, hidden = engine.kind_drafting.draft_hidden(states, segments)
        drafts, probs = draft_dflash2.select(drafter, states, plan, inputs, hidden)
    at = 0
    for i, (c, t) in enumerate(zip(contexts, rows)):
        alone = Engine(target, drafter, max_seq_len=64)
        session = drafter.session(alone, drafter.block_size)
        session.begin(None, 0, feats[i][None])
        block = torch.full((1, t), drafter.mask_token_id, dtype=torch.long)
        block[0, 0] = anchors[i]
        with torch.inference_mode():
            ref_hidden = session._hidden(session.ctx, torch.arange(c), block, torch.arange(c, c + t), c + t)
            generator = torch.Generator().manual_seed(seeds[i]) if temperature else None
            ref_drafts, ref_probs = session.propose(anchors[i], c, t - 1, temperature, generator)
        torch.testing.assert_close(hidden[0, at:at + t - 1], ref_hidden[0])
        assert drafts[at:at + t - 1].tolist() == ref_drafts[0].tolist(), f"request {i}"
        if temperature:
            torch.testing.assert_close(probs[i], ref_probs[0])
        else:
            assert probs[i] is None
        at += t - 1


def test_sliding_masks_matter(pair, monkeypatch):
    """The per-layer masks change the hidden rows: the same block with every layer seeing its whole
    block gives others when the drafter has a sliding layer (so the equality above can fail)."""
    cfg = pair.drafter.config
    if "sliding_attention" not in cfg.layer_types:
        pytest.skip("no sliding layer in this layout")
    engine = BatchEngine(pair.target, pair.drafter, BatchConfig(), max_batch=1, kv_pages=64)
    pair.drafter.ensure_rope(64)
    features = torch.randn(9, len(cfg.target_layer_ids) * pair.target.config.hidden_size,
                           generator=torch.Generator().manual_seed(fresh_seed()))

    def hidden_rows():
        state = _state(engine, 0, 9, 5)
        state.ctx = [(features, 0)]
        with torch.inference_mode():
            out = engine.kind_drafting.draft_hidden([state], [Segment(state.pages, 9, cfg.block_size)])[2]
        engine.pool.release(state.pages)
        return out
    sliding = hidden_rows()
    monkeypatch.setattr(draft_dflash2, "layer_visibility", lambda c, i: (False, None))
    assert not torch.allclose(sliding, hidden_rows())


@pytest.mark.parametrize("is_causal", [None, True, False])
def test_visibility_rule_is_layer_masks(pair, is_causal):
    """Each layer's (low, high) key interval per row equals layer_mask's visibility over the block,
    for full and sliding layers under every is_causal override (windows of 3 in a block of 8 and
    context before it)."""
    cfg = replace(pair.drafter.config, layer_types=("full_attention", "sliding_attention"), sliding_window=3,
                  is_causal=is_causal)
    start, rows = 11, 8
    state = SimpleNamespace(tokens=[0], req=SimpleNamespace(temperature=0.0))
    plan = draft_dflash2._BlockPlan(cfg, [state], [Segment([0], start, rows)])
    keys = torch.arange(start + rows)
    for layer in range(cfg.num_layers):
        expected = layer_mask(cfg, layer, torch.arange(start, start + rows), start + rows, torch.float32)
        expected = expected.additive[0, 0, :rows] == 0
        low, high = map(torch.from_numpy, plan.visible(draft_dflash2.layer_visibility(cfg, layer)))
        assert torch.equal((keys >= low[:, None]) & (keys <= high[:, None]), expected), f"layer {layer}"
