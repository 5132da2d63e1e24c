"""The graphed-step path of hybrid recurrent targets (engine/hybrid_graphs.py) on the CPU, fp32: the
host bookkeeping outside the step, the reserved step buffers the step writes, the record adopted
after it. A stand-in for the graph (ReplayLike) runs the step eagerly and then, as a replay would
leave it, drops every Python-side record of the forward: only what was written into the reserved
buffers and re-adopted survives. The GPU twin (real graphs, bitwise against eager) is
tests/test_hybrid_graphs_gpu.py."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from test_hybrid_engine import OracleDrafts
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine.engine import HYBRID_EAGER, HYBRID_STEPWISE
from specpilot.engine.graphs import StaticShapeStep
from specpilot.engine.steps import StepRunner
from specpilot.models import gdn
from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

BLOCK = 8


def replay_like(cache):
    """A step factory: StaticShapeStep whose target steps end as a graph replay leaves the cache:
    the forward must have stashed exactly the reserved buffers of its T (else a replay would leave
    the commit reading stale memory), and the stash is then forgotten (a replay runs no Python)."""

    class ReplayLike(StaticShapeStep):
        def __call__(self, *inputs):
            out = super().__call__(*inputs)
            if len(inputs) == 2:                                  # (ids, positions): a target step
                t = inputs[0].shape[1]
                for j, (window, states) in enumerate(cache.step_buffers[t]):
                    assert cache.windows[j] is window and cache.snapshots[j] is states
                cache.windows = [None] * len(cache.conv)
                cache.snapshots = [None] * len(cache.conv)
            return out
    return ReplayLike


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return Pair(tmp_path_factory.mktemp("hybridgraph"), "tiny-qwen3.5", [0, 2], block_size=BLOCK, seed=fresh_seed())


def graphed_runner(engine):
    return StepRunner(engine.target, engine.drafter, engine.cache, engine.draft_cache, True,
                      replay_like(engine.cache))



def test_greedy_decode_runs_no_eager_step(pair):
    """Greedy spec on the graphed path runs every step after the prefill graphed: the first draft writes
    the prompt's context rows ahead of its graph, and the tail block runs whole (its rows past
    max_length are never committed), so no attention shape is new to an eager step (cuDNN plans one
    per new shape: ~60 ms on an H100 at the hybrid's head size 256)."""
    eng = pair.engine
    saved = eng.runner
    eng.runner = runner = graphed_runner(eng)
    eager = []
    prefill, forward_target, draft = runner.prefill, runner.forward_target, runner._draft

    def prefill_then_forget(*args, **kwargs):
        out = prefill(*args, **kwargs)
        eager.clear()                                            # the prefill is eager by design
        return out

    def counted_draft(*args, compiled=False, **kwargs):
        if not compiled:
            eager.append("draft")
        return draft(*args, compiled=compiled, **kwargs)

    runner.prefill = prefill_then_forget
    runner.forward_target = lambda *args, **kwargs: (eager.append("target"), forward_target(*args, **kwargs))[1]
    runner._draft = counted_draft
    try:
        for prompt, new in ((pair.random_prompt(70), 37), (pair.random_prompt(5), 20)):   # tails of 37 - 1, 20 - 1 mod B
            ar = eng.generate_ar(prompt, new).tokens
            eager.clear()
            spec = eng.generate_spec(prompt, new, replay=OracleDrafts(ar, pair.target.config.vocab_size))
            assert spec.tokens == ar
            assert eager == []
            assert eng.max_seq_len - len(prompt) - new >= BLOCK                        # room for a whole tail block
    finally:
        eng.runner = saved
        eng.cache.step_buffers.clear()



def test_a_tail_without_room_for_a_whole_block_runs_short(pair):
    """Where max_seq_len ends inside the last block (the cache's slots, rounded up past it, are no room:
    the recurrent state's positions stop at max_seq_len), greedy spec runs the short tail block and
    still gives the AR output."""
    prompt, new = pair.random_prompt(9), 21
    eng = Engine(pair.target, pair.drafter, max_seq_len=len(prompt) + new)
    assert eng.runner.capacity > eng.max_seq_len                       # slots are rounded up past the end
    ar = eng.generate_ar(prompt, new).tokens
    eng.runner = graphed_runner(eng)
    spec = eng.generate_spec(prompt, new, replay=OracleDrafts(ar, pair.target.config.vocab_size))
    assert spec.tokens == ar and sum(spec.acceptance_lengths) == new - 1

def test_graph_path_equals_eager(pair):
    """AR and speculative decoding (drafts forced by an oracle so every accepted length 0..B-1 and
    the tail block occur) through the graphed path give the eager engine's tokens and acceptance."""
    eng = pair.engine
    prompts = [pair.random_prompt(3), pair.random_prompt(70)]     # the short and the chunked prefill
    eager = []
    for prompt in prompts:
        ar = eng.generate_ar(prompt, 40).tokens
        oracle = OracleDrafts(ar, pair.target.config.vocab_size)
        eager.append((ar, eng.generate_spec(prompt, 40, replay=oracle)))
    saved = eng.runner
    eng.runner = graphed_runner(eng)
    try:
        for prompt, (ar, spec) in zip(prompts, eager):
            assert eng.generate_ar(prompt, 40).tokens == ar
            oracle = OracleDrafts(ar, pair.target.config.vocab_size)
            ours = eng.generate_spec(prompt, 40, replay=oracle)
            assert ours.tokens == spec.tokens == ar
            assert ours.acceptance_lengths == spec.acceptance_lengths
            assert len(set(ours.acceptance_lengths)) > 2                   # commits inside blocks
        assert {(k[0], k[1], k[2]) for k in eng.runner.graphs if k[0] == "target"} == {("target", 1, False),
                                                                               ("target", BLOCK, True)}
        assert set(eng.cache.step_buffers) == {1, BLOCK}
        # reserved inside generate's inference mode, yet plain tensors: steps outside it write them too
        assert not any(w.is_inference() or s.is_inference() for per in eng.cache.step_buffers.values()
                       for w, s in per)
    finally:
        eng.runner = saved
        eng.cache.step_buffers.clear()


def test_warm_captures_without_a_step(pair):
    """warm_target_step (Engine.warmup's capture) needs no pending forward, resets the cache, and
    the next generation equals eager."""
    eng = pair.engine
    prompt = pair.random_prompt(20)
    ar = eng.generate_ar(prompt, 12).tokens
    saved = eng.runner
    eng.runner = graphed_runner(eng)
    try:
        ids = torch.zeros(1, BLOCK, dtype=torch.long)
        eng.runner.warm_target_step(ids, 100, True)                 # no forward covers position 100
        eng.runner.warm_target_step(ids[:, :1], 100, False)
        assert {k[:3] for k in eng.runner.graphs} == {("target", BLOCK, True), ("target", 1, False)}
        assert eng.cache.committed_len == 0 and eng.cache.pending is None
        assert all(not s.any() for s in eng.cache.state) and all(not c.any() for c in eng.cache.conv)
        assert eng.generate_ar(prompt, 12).tokens == ar
    finally:
        eng.runner = saved
        eng.cache.step_buffers.clear()


def test_engine_graphs_hybrid_targets_without_moe():
    """Qwen3.5 layout: graphs as configured, no fused steps or compiled layers; Qwen3-Next (sparse
    MoE, experts picked on the host): eager, and the reason says why."""
    dense = random_target(HYBRID_PRESETS["tiny-qwen3.5"], "cpu", torch.float32, seed=1)
    engine = Engine(dense, None, max_seq_len=64, config=EngineConfig(compile_layers=True))
    assert engine.eager_reason == HYBRID_STEPWISE
    assert engine.config.cuda_graphs and not engine.config.fused_steps and not engine.config.compile_layers
    assert not Engine(dense, None, max_seq_len=64, config=EngineConfig(cuda_graphs=False)).config.cuda_graphs
    moe = random_target(HYBRID_PRESETS["tiny-qwen3-next"], "cpu", torch.float32, seed=1)
    engine = Engine(moe, None, max_seq_len=64)
    assert engine.eager_reason.startswith(HYBRID_EAGER) and "MoE" in engine.eager_reason
    assert not engine.config.cuda_graphs


def test_reserved_buffers_refuse_misuse(pair):
    cache = pair.engine.cache
    with pytest.raises(ValueError, match="1..64 tokens, got 0"):
        cache.reserve(0)
    with pytest.raises(ValueError, match="got 65"):
        cache.reserve(65)
    with pytest.raises(ValueError, match="no step buffers reserved for 3-token"):
        cache.adopt(3)
    cache.reserve(3)
    try:
        cache.reset()
        with pytest.raises(ValueError, match="needs a pending 3-token forward"):
            cache.adopt(3)
        cache.begin(0, 2)
        with pytest.raises(ValueError, match="needs a pending 3-token forward"):
            cache.adopt(3)
    finally:
        cache.step_buffers.clear()
        cache.reset()


def test_recurrent_rule_writes_states_out():
    """states_out receives exactly the states a fresh tensor would, and a wrong one is refused."""
    g = torch.Generator().manual_seed(fresh_seed())
    b, t, h, dk, dv = 1, 5, 2, 8, 4
    q, k = torch.randn(b, t, h, dk, generator=g), torch.randn(b, t, h, dk, generator=g)
    v = torch.randn(b, t, h, dv, generator=g)
    decay, beta = -torch.rand(b, t, h, generator=g), torch.rand(b, t, h, generator=g)
    out, final, states = gdn.recurrent_gated_delta_rule(q, k, v, decay, beta, keep_states=True)
    buffer = torch.full((b, t, h, dk, dv), float("nan"))
    out2, final2, states2 = gdn.recurrent_gated_delta_rule(q, k, v, decay, beta, keep_states=True,
                                                           states_out=buffer)
    assert states2 is buffer
    assert torch.equal(states, buffer) and torch.equal(out, out2) and torch.equal(final, final2)
    with pytest.raises(ValueError, match=r"states_out must be fp32 \[1, 5, 2, 8, 4\]"):
        gdn.recurrent_gated_delta_rule(q, k, v, decay, beta, keep_states=True, states_out=buffer[:, :4])
