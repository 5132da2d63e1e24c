"""The graphed tree verify path (engine/tree/graphs.py) on the CPU, fp32: the packed tree's device-side
mask and conv windows against host references, and the tree loop through the graphed path (a
stand-in for the graph that, as a replay, forgets every Python-side record of the forward) giving the
eager tree loop's tokens and acceptance on dense and hybrid pairs; warmup captures every span's tree
graph. The GPU twin (real graphs, bitwise against eager) is tests/test_tree_graphs_gpu.py."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed, loop_config
from tree_helpers import TinyPair, oracle_drafts, tree_budget
from specpilot.engine.graphs import StaticShapeStep, kv_bucket, kv_spans
from specpilot.engine.steps import StepRunner
from specpilot.engine.tree.build import DraftTree
from specpilot.engine.tree.layout import TreeInputs, pack_tree, packed_size


def random_tree(n: int, g: torch.Generator) -> DraftTree:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    return DraftTree(torch.randint(0, 100, (n,), generator=g).tolist(), parents, depth)


@pytest.mark.parametrize("n", [1, 2, 7, 33])
def test_device_side_mask_and_windows_follow_the_ancestors(n):
    g = torch.Generator().manual_seed(n)
    tree, start, span = random_tree(n, g), 9, 64
    inputs = TreeInputs(pack_tree(tree, start), n)                  # what a graph sees: no host tree
    assert inputs.tokens.tolist() == [tree.tokens] and inputs.parents.tolist() == tree.parents
    assert inputs.rope_positions.tolist() == [start + d for d in tree.depth]
    mask = inputs.attention_mask(span, groups=3, dtype=torch.float32).additive[0, 0]
    assert mask.shape == (3 * n, span) and torch.equal(mask[:n], mask[2 * n:])
    for i in range(n):
        visible = [j for j in range(span) if mask[i, j] == 0]
        assert visible == list(range(start)) + [start + a for a in tree.path_to(i)]
    for width in (2, 4):
        past = width - 1
        index = inputs.conv_window_index(width).tolist()
        for i in range(n):                  # committed inputs 0..past-1, then the path's nodes at past + j
            assert index[i] == (list(range(past)) + [past + j for j in tree.path_to(i)])[-width:]
    with pytest.raises(ValueError, match="packed as int64"):
        TreeInputs(torch.zeros(packed_size(n) + 1, dtype=torch.long), n)


def replay_like(cache):
    """A step factory: StaticShapeStep whose tree steps end as a graph replay leaves the cache: a hybrid
    forward must have written its per-node states into the reserved buffers of N (graphs of every span
    share them), and the stash is then forgotten (a replay runs no Python)."""

    class ReplayLike(StaticShapeStep):
        def __call__(self, *inputs):
            out = super().__call__(*inputs)
            tree_step = len(inputs) == 2 and inputs[1].dtype == torch.long and inputs[1].shape == (3,)
            if tree_step and hasattr(cache, "step_buffers"):    # read: 2 + (depths + 1) + 3N
                n = (out[0].numel() - 3 - inputs[0].shape[0]) // 3
                for j, (_, states) in enumerate(cache.step_buffers[n]):
                    assert cache.snapshots[j] is states
                cache.windows = [None] * len(cache.conv)
                cache.snapshots = [None] * len(cache.conv)
            return out
    return ReplayLike


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen3.5"])
def pair(request, tmp_path_factory):
    return TinyPair(tmp_path_factory.mktemp("treegraph"), request.param, seed=fresh_seed())


def graphed_runner(engine):
    return StepRunner(engine.target, engine.drafter, engine.cache, engine.draft_cache, True,
                      replay_like(engine.cache), config=engine.config)


def run(pair, prompt, ar, budget):
    with oracle_drafts(pair.engine, len(prompt), ar), tree_budget(pair.engine, budget):
        return pair.engine.generate_spec(prompt, 60)


def test_graphed_tree_loop_equals_eager(pair):
    """The stepwise loop (fused steps off): its tree step graphs give the eager loop's tokens and
    acceptance; tails replay the block's graph (padded)."""
    eng = pair.engine
    prompt = pair.random_prompt(13, pair.seed + 5)
    ar = eng.generate_ar(prompt, 60).tokens
    budgets = (4, 16, 32)
    with loop_config(eng, fused_steps=False):
        eager = {b: run(pair, prompt, ar, b) for b in budgets}
        saved = eng.runner
        eng.runner = graphed_runner(eng)
        try:
            for b in budgets:
                ours = run(pair, prompt, ar, b)
                assert ours.tokens == eager[b].tokens == ar, f"budget {b}, seed {pair.seed}"
                assert ours.acceptance_lengths == eager[b].acceptance_lengths
                assert max(ours.acceptance_lengths) > 2
            trees = {k for k in eng.runner.graphs if k[0] == "tree"}
            assert {(k[1], k[2], k[3]) for k in trees} == {(b, 15, True) for b in budgets}   # tails: padded
            assert {k for k in eng.runner.graphs if k[0] == "tree_commit"} == {("tree_commit", b) for b in budgets}
            if hasattr(eng.cache, "step_buffers"):
                assert set(budgets) <= set(eng.cache.step_buffers)
        finally:
            eng.runner = saved
            if hasattr(eng.cache, "step_buffers"):
                eng.cache.step_buffers.clear()


@pytest.mark.parametrize("early", [True, False])
def test_fused_tree_step_equals_the_stepwise_loop(pair, early):
    """Dense greedy trees take the fused step (tree/fused.py), graphed (the stand-in): AR's tokens and
    the stepwise loop's acceptance at every budget (the same trees: a tail's padded rows stay out),
    with its control advanced by the step itself (early launch) or sent by the host."""
    eng = pair.engine
    if getattr(eng.target, "is_hybrid", False):
        pytest.skip("hybrid targets run the stepwise loop (the engine turns fused steps off)")
    prompt = pair.random_prompt(13, pair.seed + 5)
    ar = eng.generate_ar(prompt, 60).tokens
    budgets = (4, 16, 32)
    with loop_config(eng, fused_steps=False):
        stepwise = {b: run(pair, prompt, ar, b) for b in budgets}
    saved = eng.runner
    eng.runner = graphed_runner(eng)
    try:
        with loop_config(eng, fused_steps=True, early_launch=early):
            for b in budgets:
                ours = run(pair, prompt, ar, b)
                assert ours.tokens == ar, f"budget {b}, seed {pair.seed}"
                assert ours.acceptance_lengths == stepwise[b].acceptance_lengths
        assert {k[:3] for k in eng.runner.fused.graphs if k[0] == "tree"} == {("tree", 16, b) for b in budgets}
        assert not any(k[0] == "tree" for k in eng.runner.graphs)           # the stepwise graphs unused
    finally:
        eng.runner = saved


def test_graphed_sampled_tree_loop_equals_eager(pair):
    """Temperature > 0 (recursive rejection sampling over the graphed step's logits): the same seed
    gives the eager loop's tokens. At temperature 1 a random tiny model can sit at a near-certain fixed
    point, so a flat temperature (100) shows that the seed matters: sampled, not greedy."""
    eng = pair.engine
    prompt = pair.random_prompt(12, pair.seed + 7)
    runs = [(t, s) for t in (1.0, 100.0) for s in (1, 2)]
    with tree_budget(eng, 16):
        eager = [eng.generate_spec(prompt, 40, temperature=t, seed=s).tokens for t, s in runs]
        saved = eng.runner
        eng.runner = graphed_runner(eng)
        try:
            assert [eng.generate_spec(prompt, 40, temperature=t, seed=s).tokens for t, s in runs] == eager
            assert any(k[0] == "tree" for k in eng.runner.graphs)
        finally:
            eng.runner = saved
            if hasattr(eng.cache, "step_buffers"):
                eng.cache.step_buffers.clear()
    assert eager[2] != eager[3]


class HostSyncs(TorchDispatchMode):
    """Records the ops that read a tensor's values back to the host (a CUDA graph cannot hold them):
    .item() and 0-dim tensor indexing (_local_scalar_dense), nonzero, boolean-mask indexing."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        masks = name.startswith("aten.index.Tensor") and any(
            t is not None and t.dtype == torch.bool for t in args[1])
        if "_local_scalar_dense" in name or "nonzero" in name or "masked_select" in name or masks:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("depths", [15, 3])
def test_the_graphed_step_reads_nothing_back(pair, depths):
    """The tree step's device part (build, pack, forward, accept) runs without a host read, so a CUDA
    graph can hold it; the CPU sees the ops a capture would reject."""
    from specpilot.engine.tree.graphs import _step_fn
    from specpilot.engine.tree.layout import PendingTree

    eng = pair.engine
    prompt = pair.random_prompt(20, pair.seed + 3)
    eng.runner.prefill(torch.tensor([prompt]), with_features=True)
    vocab = eng.target.config.vocab_size
    draft = torch.cat([torch.randn(depths, vocab), torch.zeros(15 - depths, vocab)])
    if hasattr(eng.cache, "begin_tree"):
        eng.cache.begin_tree(PendingTree(len(prompt), 16, torch.device("cpu")))
    with HostSyncs() as spy:
        read = _step_fn(eng.runner, 16, len(prompt) + 16, True)(draft, torch.tensor([5, len(prompt), depths]))[0]
    assert spy.found == []
    assert read.shape == (2 + 16 + 3 * 16,)


def test_the_fused_tree_step_reads_nothing_back(pair):
    """The fused step (tree/fused.py: draft, tree, verify, accept, commit, next control) likewise."""
    from specpilot.engine.tree.fused import tree_step_fn

    eng = pair.engine
    if getattr(eng.target, "is_hybrid", False):
        pytest.skip("hybrid targets run the stepwise loop (the engine turns fused steps off)")
    fused, prompt = eng.runner.fused, pair.random_prompt(20, pair.seed + 4)
    _, features = eng.runner.prefill(torch.tensor([prompt]), with_features=True)
    fused.write_prompt_context(features)
    fused.spec_send(16, len(prompt), 0, 0, 5, len(prompt) + 9, 0, False)     # a tail: 8 rows can commit
    with HostSyncs() as spy:
        out = tree_step_fn(fused, 16, 16, len(prompt) + 16)()
    assert spy.found == []
    assert out.shape == (3 + 16,) and out[-1] == len(prompt) and out[0] <= 7


def test_warmup_captures_every_span(pair):
    eng = pair.engine
    prompt = pair.random_prompt(11, pair.seed + 6)
    ar = eng.generate_ar(prompt, 60).tokens
    saved = eng.runner
    eng.runner = graphed_runner(eng)
    try:
        with tree_budget(eng, 16):
            eng.warmup(16)
        want = ({("tree", 16, 15, True, span, eng.target.dtype) for span in kv_spans(eng.runner.capacity) if span > 16}
                | {("tree_commit", 16)})
        dense = not getattr(eng.target, "is_hybrid", False)
        fused = {("tree", 16, 16, span) for span in kv_spans(eng.runner.capacity)} if dense else set()
        assert {k for k in eng.runner.graphs if k[0].startswith("tree")} == want
        assert {k for k in eng.runner.fused.graphs if k[0] == "tree"} == fused     # the greedy dense step
        assert run(pair, prompt, ar, 16).tokens == ar                  # the hybrid cache was reset after it
        assert {k for k in eng.runner.graphs if k[0].startswith("tree")} == want
        assert {k for k in eng.runner.fused.graphs if k[0] == "tree"} == fused     # warmup had them all
    finally:
        eng.runner = saved
        if hasattr(eng.cache, "step_buffers"):
            eng.cache.step_buffers.clear()



@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen3.5"])
def test_tree_steps_bench_reports_graphed_beside_graphed(preset):
    """bench/tree_steps.py through the graphed path (StaticShapeStep stands in for the graphs)."""
    from specpilot.bench.tree_steps import tree_step_times
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

    engine = Engine(random_target(TARGET_PRESETS[preset], "cpu", torch.float32, seed=0), None, max_seq_len=128)
    engine.runner = StepRunner(engine.target, None, engine.cache, None, True, StaticShapeStep, config=engine.config)
    engine.use_graphs = True
    row = tree_step_times(engine, context=40, nodes=8, iters=1)
    assert row["tree_graphed_ms"] > 0 and row["chain_graphed_ms"] > 0
    assert row["tree_graphed_over_chain_graphed"] == row["tree_graphed_ms"] / row["chain_graphed_ms"]
    assert "commit_graphed_ms" in row and ("tree_commit", 8) in engine.runner.graphs
    assert ("tree", 8, 15, False, kv_bucket(40 + 8, engine.runner.capacity), engine.target.dtype) in engine.runner.graphs
