"""Our engine against stock dflash_generate and HF greedy AR, on tiny random Qwen3 / LLaMA pairs
(fp32, CPU): token-for-token identical outputs and acceptance lengths."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed, loop_config
from specpilot.verify.stock import run_stock

PAIRS = {"qwen3": ("tiny-qwen3", [0, 2]), "llama": ("tiny-llama", [1, 3])}


@pytest.fixture(scope="module", params=sorted(PAIRS))
def pair(request, tmp_path_factory):
    preset, layer_ids = PAIRS[request.param]
    return Pair(tmp_path_factory.mktemp(request.param), preset, layer_ids, block_size=4, seed=fresh_seed())


def hf_greedy(pair, prompt, max_new_tokens, stop_ids):
    ids = torch.tensor([prompt])
    out = pair.stock.target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=list(stop_ids) or None, pad_token_id=pair.eos)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
def test_spec_equals_stock(pair, block_size):
    prompt = pair.random_prompt(7 + block_size)
    for max_new in (1, 9, 23):        # 23 with blocks of 16: a tail verify_size < B
        ref = run_stock(pair.stock, prompt, max_new, (), 0.0, block_size)
        ours = pair.engine.generate_spec(prompt, max_new, block_size=block_size)
        assert ours.tokens == ref.tokens, f"seed {pair.seed}, max_new {max_new}"
        assert ours.acceptance_lengths == ref.acceptance_lengths
        assert len(ours.tokens) == max_new


def test_stop_token_hit(pair):
    """Stop on a token the greedy continuation actually produces: output ends right after it."""
    prompt = pair.random_prompt(11)
    free = pair.engine.generate_ar(prompt, 20).tokens
    stop = free[5]
    for block_size in (2, 4):
        ref = run_stock(pair.stock, prompt, 20, (stop,), 0.0, block_size)
        ours = pair.engine.generate_spec(prompt, 20, stop_ids=(stop,), block_size=block_size)
        assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths
        assert ours.tokens[-1] == stop and stop not in ours.tokens[:-1]
        assert ours.tokens == free[:free.index(stop) + 1]


def test_ar_equals_hf_greedy(pair):
    prompt = pair.random_prompt(13)
    stop = (pair.eos,)
    ours = pair.engine.generate_ar(prompt, 24, stop_ids=stop)
    assert ours.tokens == hf_greedy(pair, prompt, 24, stop)
    spec = pair.engine.generate_spec(prompt, 24, stop_ids=stop)
    assert spec.tokens == ours.tokens
    assert sum(spec.acceptance_lengths) + 1 == len(spec.tokens)


def test_sampling_reproducible_and_matches_stock(pair):
    prompt = pair.random_prompt(9)
    seed = fresh_seed()
    a = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=seed)
    b = pair.engine.generate_spec(prompt, 20, temperature=0.8, seed=seed)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths
    # Same draws in the same order as stock after torch.manual_seed(seed).
    ref = run_stock(pair.stock, prompt, 20, (), 0.8, None, seed=seed)
    assert a.tokens == ref.tokens and a.acceptance_lengths == ref.acceptance_lengths
    ar1 = pair.engine.generate_ar(prompt, 12, temperature=1.0, seed=seed)
    ar2 = pair.engine.generate_ar(prompt, 12, temperature=1.0, seed=seed)
    assert ar1.tokens == ar2.tokens and len(ar1.tokens) == 12


@pytest.mark.parametrize("fused, early", [(True, True), (True, False), (False, True)])
def test_graph_path_on_cpu_matches_stock(pair, fused, early):
    """The CUDA-graph code path (fixed shapes, context and tail blocks padded into the trash slot,
    power-of-two kv spans, outputs overwritten by every call) run on the CPU with a static-shape
    stand-in: the fused whole-step graphs (fused=True; early: each step's control written by the
    step before it, else uploaded by the host) and the stepwise draft / verify graphs."""
    from specpilot.engine.graphs import StaticShapeStep
    from specpilot.engine.steps import StepRunner

    eng = pair.engine
    prompts = [pair.random_prompt(3), pair.random_prompt(40)]   # shorter / longer than the block
    eager_ar = [eng.generate_ar(p, 12).tokens for p in prompts]
    saved = eng.runner
    eng.runner = StepRunner(eng.target, eng.drafter, eng.cache, eng.draft_cache, True, StaticShapeStep)
    try:
        with loop_config(eng, fused_steps=fused, early_launch=early):
            for prompt, max_new, ar in zip(prompts, (30, 45), eager_ar):
                ref = run_stock(pair.stock, prompt, max_new, (), 0.0, 4)
                ours = eng.generate_spec(prompt, max_new, block_size=4)
                assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths
                assert eng.generate_ar(prompt, 12).tokens == ar
        if fused:
            assert {k[0] for k in eng.runner.fused.graphs} == {"ar", "spec"} and not eng.runner.graphs
        else:
            assert {k[0] for k in eng.runner.graphs} == {"target", "draft"} and not eng.runner.fused.graphs
    finally:
        eng.runner = saved


@pytest.mark.parametrize("early", [True, False])
def test_fused_replay_forces_the_planned_acceptance(pair, early):
    """Replay through the fused step: the transcript's tokens are produced with exactly the planned
    acceptance lengths (the drafts built on the device from the plan and transcript buffers), equal
    to greedy AR, with the control advanced by the step itself (early) or uploaded by the host."""
    from specpilot.engine.replay import AcceptanceReplay

    prompt = pair.random_prompt(10)
    transcript = pair.engine.generate_ar(prompt, 30).tokens
    trace = [1 + int(x) for x in torch.randint(0, 4, (7,), generator=torch.Generator().manual_seed(fresh_seed()))]
    replay = AcceptanceReplay(transcript, trace)
    with loop_config(pair.engine, early_launch=early):
        r = pair.engine.generate_spec(prompt, 30, block_size=4, replay=replay)
    assert r.replay_shortfalls == 0
    assert r.tokens == transcript
    expected = [min(trace[i % len(trace)], 4) for i in range(len(r.acceptance_lengths))]
    assert r.acceptance_lengths[:-1] == expected[:-1]          # the last step may be cut by the tail


def test_drafter_scales_and_softcap_match_stock(tmp_path):
    """input_embedding_scale, output_multiplier and final_logit_softcapping, as dflash applies them."""
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair
    from specpilot.verify.stock import load_stock

    t, d = write_pair(tmp_path, "tiny-qwen3", layer_ids=[1, 3], block_size=4, seed=fresh_seed(),
                      input_embedding_scale=2.0, output_multiplier=0.5, final_logit_softcapping=3.0)
    target = load_target(t, dtype=torch.float32)
    drafter = load_drafter(d, target)
    assert (drafter.config.input_embedding_scale, drafter.config.output_multiplier,
            drafter.config.final_logit_softcapping) == (2.0, 0.5, 3.0)
    engine = Engine(target, drafter, max_seq_len=128)
    stock = load_stock(t, d, "cpu", torch.float32)
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(fresh_seed())).tolist()
    seed = fresh_seed()
    for temperature in (0.0, 0.9):       # sampled drafts see the scaled, softcapped draft logits
        ref = run_stock(stock, prompt, 20, (), temperature, None, seed=seed)
        ours = engine.generate_spec(prompt, 20, temperature=temperature, seed=seed)
        assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths


def test_fused_replay_past_the_transcript_equals_the_stepwise_loop(pair):
    """A transcript shorter than the generation: past its end the device's replay drafts must be
    AcceptanceReplay.drafts' (rejected tokens), so the fused loop (early launch on and off) gives
    the stepwise loop's tokens, acceptance lengths and shortfall count."""
    from specpilot.engine.replay import AcceptanceReplay

    eng = pair.engine
    prompt = pair.random_prompt(9)
    transcript = eng.generate_ar(prompt, 30).tokens[:10]
    runs = {}
    for name, fused, early in (("stepwise", False, True), ("early", True, True), ("host", True, False)):
        with loop_config(eng, fused_steps=fused, early_launch=early):
            r = eng.generate_spec(prompt, 30, block_size=4, replay=AcceptanceReplay(transcript, 3.5))
        runs[name] = (r.tokens, r.acceptance_lengths, r.replay_shortfalls)
    assert runs["stepwise"][2] > 0                              # the plan outran the transcript
    assert runs["early"] == runs["stepwise"] == runs["host"]
