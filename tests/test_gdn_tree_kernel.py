"""The GDN tree kernels' predicate and the tree order they rely on, on the CPU (the kernels
themselves: tests/test_gdn_tree_gpu.py): `takes` accepts exactly the calls the CUDA ops serve
(batch 1, bf16 CUDA, 1..64 nodes, conv width 2..8, dk 64 / 128, dv a multiple of 32, fused_kernels
on, ops built), and TreeLayout refuses a tree whose parents do not come before their children."""
import types

import pytest
import torch

from specpilot import config
from specpilot.config import EngineConfig
from specpilot.engine.tree.build import DraftTree
from specpilot.engine.tree.layout import TreeLayout
from specpilot.kernels import gdn_tree as kernels


def fake_qkv(shape=(1, 16, 96), dtype=torch.bfloat16, cuda=True):
    """What takes reads of a CUDA tensor, on a machine without one."""
    return types.SimpleNamespace(is_cuda=cuda, dtype=dtype, shape=shape, dim=lambda: len(shape))


WEIGHT = torch.zeros(96, 4, dtype=torch.bfloat16)


@pytest.fixture
def built(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: True)


def test_takes_the_calls_the_ops_serve(built):
    assert kernels.takes(fake_qkv(), WEIGHT, 128, 128)
    assert kernels.takes(fake_qkv((1, 1, 96)), WEIGHT, 64, 96)
    assert kernels.takes(fake_qkv((1, 64, 96)), torch.zeros(96, 2, dtype=torch.bfloat16), 64, 32)


@pytest.mark.parametrize("qkv, weight, dk, dv", [
    (fake_qkv(cuda=False), WEIGHT, 128, 128),
    (fake_qkv(dtype=torch.float32), WEIGHT, 128, 128),
    (fake_qkv((2, 16, 96)), WEIGHT, 128, 128),
    (fake_qkv((1, 65, 96)), WEIGHT, 128, 128),
    (fake_qkv((16, 96)), WEIGHT, 128, 128),
    (fake_qkv(), WEIGHT.float(), 128, 128),
    (fake_qkv(), torch.zeros(96, 9, dtype=torch.bfloat16), 128, 128),
    (fake_qkv(), torch.zeros(96, 1, dtype=torch.bfloat16), 128, 128),
    (fake_qkv(), WEIGHT, 96, 128),
    (fake_qkv(), WEIGHT, 128, 48),
])
def test_takes_declines_what_the_ops_do_not_serve(built, qkv, weight, dk, dv):
    assert not kernels.takes(qkv, weight, dk, dv)


def test_takes_declines_with_fused_kernels_off(built):
    with config.use(EngineConfig(fused_kernels=False)):
        assert not kernels.takes(fake_qkv(), WEIGHT, 128, 128)


def test_takes_declines_without_the_ops(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert not kernels.takes(fake_qkv(), WEIGHT, 128, 128)


def test_a_cpu_build_has_no_tree_ops():
    from specpilot import _ext

    if _ext.has_cuda_kernels():
        pytest.skip("a CUDA build")
    assert not kernels.available()


@pytest.mark.parametrize("parents, node", [([-1, 0, 3, 1], 2), ([-1, 0, 2], 2), ([0, 0], 0), ([-1, -1], 1),
                                           ([-1, -2], 1)])
def test_tree_layout_refuses_parents_out_of_order(parents, node):
    tree = DraftTree(list(range(len(parents))), parents, list(range(len(parents))))
    with pytest.raises(ValueError, match=f"tree node {node} has parent {parents[node]}"):
        TreeLayout(tree, 4, "cpu")
