"""CUDA-graphed tree steps (engine/tree/graphs.py: build, pack, verify, accept in one graph) on the GPU:
each graphed tree step equals the same step run eagerly at the same kv span bit for bit (the read: path
and tree; logits; on hybrids the per-node states and conv windows), replayed with different draft
logits, tail depths and node counts over growing contexts that cross a kv bucket,
with a random path committed after each step (the graphed K/V move against the eager one), on dense
and hybrid tiny random targets in fp32 and bf16 (bf16 hybrid: the GDN tree kernels); greedy tree
generation with graphs equals AR decoding (fp32) on dense and hybrid pairs, with the real drafter
(dense: the fused tree step) and with oracle drafts (the stepwise loop), through the graphs warmup
captured. Skipped on CPU."""
import dataclasses

import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed, loop_config
from tree_helpers import oracle_drafts, tree_budget

pytestmark = requires_gpu


def tiny_target(kind: str, dtype):
    from specpilot.models.random_ckpt import HYBRID_PRESETS, TARGET_PRESETS, random_target

    if kind == "dense":
        cfg = TARGET_PRESETS["tiny-qwen3"]
    else:
        cfg = HYBRID_PRESETS["tiny-qwen3.5"]
        if kind == "hybrid-kernels":        # widths the GDN tree kernels and the decode kernel take
            cfg = dataclasses.replace(cfg, linear_key_head_dim=64, linear_value_head_dim=64, head_dim=64)
    return random_target(cfg, "cuda", dtype, seed=fresh_seed())


@pytest.mark.parametrize("kind, dtype", [("dense", torch.float32), ("dense", torch.bfloat16),
                                         ("hybrid", torch.float32), ("hybrid", torch.bfloat16),
                                         ("hybrid-kernels", torch.bfloat16)])
@torch.inference_mode()
def test_graphed_tree_step_equals_eager_bitwise(kind, dtype):
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.engine.graphs import kv_bucket
    from specpilot.engine.tree.accept import read_step
    from specpilot.engine.tree.commit import commit_path
    from specpilot.engine.tree.graphs import _step_fn, kv_mover, tree_step
    from specpilot.engine.tree.layout import PendingTree

    target = tiny_target(kind, dtype)
    graphed, eager = (Engine(target, None, max_seq_len=600, config=EngineConfig(cuda_graphs=on))
                      for on in (True, False))
    assert graphed.use_graphs and not eager.use_graphs
    hybrid = getattr(target, "is_hybrid", False)
    seed = fresh_seed()
    gen, host = torch.Generator(device="cuda").manual_seed(seed), torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    start = 230                                               # the steps cross the 256-slot kv bucket
    prompt = torch.randint(0, vocab, (1, start), device="cuda", generator=gen)
    for engine in (graphed, eager):
        engine.runner.prefill(prompt, with_features=False)
    for step in range(12):
        n, depths = (8, 16, 32)[step % 3], (15, 15, 4)[step % 3 if step < 9 else 2]    # 4: a padded tail
        draft = (torch.randn(depths, vocab, generator=gen, device="cuda") * 3).to(dtype)
        anchor = int(torch.randint(0, vocab, (1,), generator=host))
        span = kv_bucket(start + n, graphed.runner.capacity)
        record, read, ours, _ = tree_step(graphed.runner, start, draft, anchor, n, 16, False)
        records = [record, PendingTree(start, n, torch.device("cuda"))]
        read, ours = read.clone(), ours.clone()
        if hybrid:
            eager.cache.begin_tree(records[1])
        padded = torch.cat([draft, draft.new_zeros(15 - depths, vocab)])
        meta = torch.tensor([anchor, start, depths], device="cuda")
        ref_read, ref, _ = _step_fn(eager.runner, n, span, False)(padded, meta)[:3]    # eager, same span
        assert torch.equal(ours, ref), f"step {step} (N={n}, span {span}): logits differ"
        assert torch.equal(read, ref_read), f"step {step}: the tree or its accepted path differs"
        if hybrid:
            for j in range(len(graphed.cache.conv)):
                assert torch.equal(graphed.cache.snapshots[j], eager.cache.snapshots[j]), f"step {step}: states"
                assert torch.equal(graphed.cache.windows[j], eager.cache.windows[j]), f"step {step}: conv windows"
        _, _, tree = read_step(read, n)
        assert max(tree.depth) <= depths
        for record in records:
            record.tree = tree
        path = tree.path_to(int(torch.randint(0, 8, (1,), generator=host)))    # <= 8 tokens: start stays < 512 - 32
        commit_path(graphed.cache, records[0], path, kv_mover(graphed.runner, n))    # its K/V move graphed
        commit_path(eager.cache, records[1], path)
        start += len(path)
    assert {key[1] for key in graphed.runner.graphs if key[0] == "tree"} == {8, 16, 32}
    assert {key[1] for key in graphed.runner.graphs if key[0] == "tree_commit"} == {8, 16, 32}
    assert len({key[4] for key in graphed.runner.graphs if key[0] == "tree"}) == 2     # both kv spans replayed
    for a, b in zip(graphed.cache.k + graphed.cache.v, eager.cache.k + eager.cache.v):
        assert torch.equal(a[:, :, :start], b[:, :, :start])
    if hybrid:
        for a, b in zip(graphed.cache.state + graphed.cache.conv, eager.cache.state + eager.cache.conv):
            assert torch.equal(a, b)


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-qwen3.5"])
def fp32_pair(request, tmp_path_factory):
    from specpilot.engine import Engine
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import write_pair

    t, d = write_pair(tmp_path_factory.mktemp("treegraph"), request.param, drafter_layers=2, block_size=16,
                      seed=fresh_seed(), layer_ids=[0, 1])
    target = load_target(t, device="cuda", dtype=torch.float32)
    return Engine(target, load_drafter(d, target), max_seq_len=600)


@pytest.mark.parametrize("budget", [8, 16, 32])
def test_graphed_tree_generation_equals_ar(fp32_pair, budget):
    from specpilot.engine.graphs import kv_spans

    engine = fp32_pair
    assert engine.use_graphs
    vocab = engine.target.config.vocab_size
    g = torch.Generator().manual_seed(fresh_seed())

    def tree_graphs():
        return {k for k in engine.runner.graphs if k[0].startswith("tree") and k[1] == budget}

    with tree_budget(engine, budget):
        engine.warmup(16)
        captured = tree_graphs()
        assert captured == {("tree", budget, 15, True, span, engine.target.dtype)
                            for span in kv_spans(engine.runner.capacity)} | {("tree_commit", budget)}
        fused = {k for k in engine.runner.fused.graphs if k[0] == "tree" and k[2] == budget}
        dense = not getattr(engine.target, "is_hybrid", False)
        assert fused == ({("tree", 16, budget, span) for span in kv_spans(engine.runner.capacity)} if dense else set())
        for length, max_new in ((7, 60), (200, 120)):               # several kv buckets
            prompt = torch.randint(0, vocab - 2, (length,), generator=g).tolist()
            ar = engine.generate_ar(prompt, max_new).tokens
            assert engine.generate_spec(prompt, max_new).tokens == ar              # the real drafter (dense: fused)
            with oracle_drafts(engine, len(prompt), ar), loop_config(engine, fused_steps=False):
                tree = engine.generate_spec(prompt, max_new)                      # paths through siblings
            assert tree.tokens == ar and max(tree.acceptance_lengths) > 2
        assert tree_graphs() == captured                                         # warmup had them all
        assert {k for k in engine.runner.fused.graphs if k[0] == "tree" and k[2] == budget} == fused
