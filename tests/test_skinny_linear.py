"""skinny_linear's dispatch on the CPU (CI): off CUDA it never takes a call and `linear` is the
module's own forward, bit for bit; the switch round-trips. The kernel itself: test_skinny_gemm_gpu.py."""

import torch
from torch import nn

from conftest import switched


def test_cpu_calls_fall_back_to_the_module_bit_for_bit():
    from specpilot.models import skinny_linear

    proj = nn.Linear(64, 48, bias=False)
    x = torch.randn(2, 5, 64)
    with switched(skinny_linear.set_skinny_gemm, True):
        assert not skinny_linear.takes(x, proj)
        assert torch.equal(skinny_linear.linear(proj, x), proj(x))
        assert not skinny_linear.takes_weight(x, proj.weight)
        assert torch.equal(skinny_linear.matmul(x, proj.weight), proj(x))


def test_the_switch_returns_the_previous_value():
    from specpilot.models import skinny_linear

    first = skinny_linear.set_skinny_gemm(True)
    assert skinny_linear.set_skinny_gemm(first) is True
    assert skinny_linear.enabled() is first
