"""The draft-tree build kernel (kernels/tree_build.py) against its torch reference (build.grow_tree +
layout.pack_tensors, the CPU path) on the GPU: the same ints, bit for bit, over budgets, depth counts,
vocabularies smaller than the budget, padded tail depths, and logits full of ties (a few distinct
values, so the stable order decides); under CUDA graph capture too; and on NaN logits a valid tree.
Skipped on CPU."""
import pytest
import torch

from conftest import requires_gpu

pytestmark = requires_gpu


def reference(draft_logits, meta, budget):
    from specpilot.engine.tree.build import grow_tree
    from specpilot.engine.tree.layout import pack_tensors

    grown = grow_tree(draft_logits, meta[:1], budget, depths=meta[2:])
    return grown, pack_tensors(grown, meta[1:2])


def kernel(draft_logits, meta, budget):
    from specpilot.config import EngineConfig, use
    from specpilot.engine.tree.layout import grown_and_packed

    with use(EngineConfig(fused_kernels=True)):
        return grown_and_packed(draft_logits, meta, budget)


def assert_same(a, b):
    (grown_a, packed_a), (grown_b, packed_b) = a, b
    assert torch.equal(packed_a, packed_b)
    for name in ("tokens", "parents", "depth", "path"):
        assert torch.equal(getattr(grown_a, name), getattr(grown_b, name)), name


@pytest.mark.parametrize("rows, vocab, budget", [(15, 151936, 16), (15, 151936, 32), (15, 4096, 64), (7, 300, 256),
                                                 (15, 40, 32), (6, 5, 64), (3, 2, 16), (1, 9, 8), (64, 50, 2)])
@pytest.mark.parametrize("ties", [False, True])
@torch.inference_mode()
def test_kernel_equals_torch_build(rows, vocab, budget, ties):
    from specpilot.kernels import tree_build

    assert tree_build.available(), "the CUDA build registers torch.ops.specpilot.grow_tree"
    g = torch.Generator(device="cuda").manual_seed(rows * 1000 + budget)
    for dtype in (torch.bfloat16, torch.float32):
        for drafted in sorted({rows, max(1, rows - 2), 1}):
            if ties:
                logits = torch.randint(0, 3, (rows, vocab), generator=g, device="cuda").to(dtype)
            else:
                logits = (torch.randn(rows, vocab, generator=g, device="cuda") * 4).to(dtype)
            meta = torch.tensor([11, 300, drafted], device="cuda")
            assert_same(kernel(logits, meta, budget), reference(logits, meta, budget))


@torch.inference_mode()
def test_kernel_under_graph_capture_takes_new_logits():
    from specpilot.config import EngineConfig, use
    from specpilot.engine.graphs import GraphedStep
    from specpilot.engine.tree.layout import grown_and_packed

    rows, vocab, budget = 15, 8192, 32
    g = torch.Generator(device="cuda").manual_seed(5)
    logits = torch.randn(rows, vocab, generator=g, device="cuda")
    meta = torch.tensor([3, 100, rows], device="cuda")
    with use(EngineConfig(fused_kernels=True)):
        step = GraphedStep(lambda x, m: grown_and_packed(x, m, budget)[1], (logits, meta))
        for drafted in (rows, 9, rows):
            new = torch.randn(rows, vocab, generator=g, device="cuda")
            new_meta = torch.tensor([7, 200 + drafted, drafted], device="cuda")
            assert torch.equal(step(new, new_meta), reference(new, new_meta, budget)[1])


@torch.inference_mode()
def test_nan_logits_give_a_valid_tree():
    rows, vocab, budget = 15, 1000, 32
    logits = torch.randn(rows, vocab, device="cuda")
    logits[3, :500] = float("nan")
    grown, _ = kernel(logits, torch.tensor([1, 50, rows], device="cuda"), budget)
    parents, depth = grown.parents.tolist(), grown.depth.tolist()
    assert len(parents) == budget and parents[0] == -1
    for i in range(1, budget):
        assert 0 <= parents[i] < i and depth[i] == depth[parents[i]] + 1
