"""The graphed greedy draft steps of DFlash2 and DSpark (engine/block_draft.py: context padded into
the trash slot) and PARD (its padded fixed-size input, models/drafters/pard.py) on the CPU, with the
static-shape stand-in for CUDA graphs: power-of-two kv spans, outputs overwritten by every call;
same tokens and acceptance lengths as the eager engine, also near the end of the cache (positions
clamped to the trash slot), and warm_block_drafts captures every graph a generation then uses."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from drafter_helpers import PROBE, accepting_pair
from specpilot.engine import Engine
from specpilot.engine.block_draft import warm_block_drafts
from specpilot.engine.graphs import StaticShapeStep
from specpilot.engine.steps import StepRunner

OPTIONS = {"dflash2": {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 6}, "dspark": {},
           "pard": {}}


@pytest.mark.parametrize("kind", sorted(OPTIONS))
def test_graphed_drafts_equal_eager(tmp_path_factory, kind):
    pair = accepting_pair(lambda: tmp_path_factory.mktemp(kind), kind, **OPTIONS[kind])
    e = Engine(pair.target, pair.drafter, max_seq_len=575)            # 576 slots: the last is the trash slot
    prompts = [PROBE, pair.prompt(3), pair.prompt(40), pair.prompt(500)]   # the last one runs to the cache's end
    eager = [e.generate_spec(p, 45 if len(p) < 400 else 575 - len(p)) for p in prompts]
    saved = e.runner
    e.runner = StepRunner(e.target, e.drafter, e.cache, e.draft_cache, True, StaticShapeStep)
    try:
        warm_block_drafts(e, e.drafter.block_size)
        captured = {k for k in e.runner.graphs if k[0] == kind}
        assert len(captured) == len({k[2] for k in captured}) > 1   # one per kv span
        for prompt, ref in zip(prompts, eager):
            ours = e.generate_spec(prompt, len(ref.tokens))
            assert ours.tokens == ref.tokens and ours.acceptance_lengths == ref.acceptance_lengths
        assert {k for k in e.runner.graphs if k[0] == kind} == captured
        assert max(a for r in eager for a in r.acceptance_lengths) > 2
    finally:
        e.runner = saved
    assert e.cache.trash_slot == 575


WARMUP_CASES = {"dflash": {}, "dflash2": {}, "dspark": {}, "pard": {}, "pard2": {"pard2_layers": [1, 3]}}


@pytest.mark.parametrize("kv_step", [0, 192])
@pytest.mark.parametrize("case", sorted(WARMUP_CASES))
def test_warmup_captures_exactly_the_step_graphs_generation_uses(tmp_path, case, kv_step):
    """Engine.warmup on the CPU path (static-shape steps): every stepwise graph a greedy generation
    runs is captured ahead, and none it never runs (plain PARD's verify reads no target features);
    under either kv span rule (EngineConfig.graph_kv_step)."""
    from specpilot.config import EngineConfig
    from specpilot.models import load_drafter, load_target
    from specpilot.models.drafters.random_kinds import write_kind_pair

    kind = "pard" if case == "pard2" else case
    t, d = write_kind_pair(tmp_path, kind, "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed(),
                           **WARMUP_CASES[case])
    target = load_target(t, dtype=torch.float32)
    e = Engine(target, load_drafter(d, target), max_seq_len=600, config=EngineConfig(fused_steps=False, graph_kv_step=kv_step))
    e.runner = StepRunner(e.target, e.drafter, e.cache, e.draft_cache, True, StaticShapeStep, config=e.config)
    assert e.warmup() > 0
    captured, ran = set(e.runner.graphs), set()
    for key, step in list(e.runner.graphs.items()):
        e.runner.graphs[key] = lambda *inputs, key=key, step=step: (ran.add(key), step(*inputs))[1]
    g = torch.Generator().manual_seed(fresh_seed())
    for length, max_new in ((5, 40), (300, 70)):          # kv spans 256 and 512 (192 and 384)
        e.generate_spec(torch.randint(0, 318, (length,), generator=g).tolist(), max_new)
    assert set(e.runner.graphs) == captured, set(e.runner.graphs) - captured
    verify_flags = {k[2] for k in captured if k[0] == "target" and k[1] == 8}
    assert verify_flags == {k[2] for k in ran if k[0] == "target" and k[1] == 8} == {case != "pard"}
