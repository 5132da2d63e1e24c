"""ops/linear.py's skinny GEMM dispatch on the CPU (CI): off CUDA it never takes a call and `linear` is the
module's own forward, bit for bit; the switch follows the running EngineConfig. The kernel itself: test_skinny_gemm_gpu.py."""

import torch
from torch import nn

from conftest import configured


def test_cpu_calls_fall_back_to_the_module_bit_for_bit():
    from specpilot.ops import linear as ops_linear

    proj = nn.Linear(64, 48, bias=False)
    x = torch.randn(2, 5, 64)
    with configured(skinny_gemm=True):
        assert not ops_linear.skinny_takes(x, proj)
        assert torch.equal(ops_linear.linear(proj, x), proj(x))
        assert not ops_linear.skinny_takes_weight(x, proj.weight)
        assert torch.equal(ops_linear.matmul(x, proj.weight), proj(x))


def test_the_switch_follows_the_running_config():
    from specpilot.ops import linear as ops_linear

    assert ops_linear.skinny_enabled()                                 # the default config
    with configured(skinny_gemm=False):
        assert not ops_linear.skinny_enabled()


def test_the_launch_loop_chunks_rows_and_aligns_x(monkeypatch):
    """kernels/skinny_workspace.run (the launch loop of every skinny GEMM call), with a stand-in
    launch on the CPU: 20 rows go as 16 + 4, a contiguous x at an odd offset is copied to an aligned
    one with the same values, the workspace (sized for the grid asked) is passed through, and an out
    it cannot write is refused."""
    import pytest

    from specpilot.kernels import skinny_workspace

    ws = (torch.empty(3), torch.zeros(2, dtype=torch.int32))
    grids = []
    monkeypatch.setattr(skinny_workspace, "buffers", lambda device, n, k, ctas=0: grids.append(ctas) or ws)
    buf = torch.randn(20 * 8 + 1, dtype=torch.bfloat16)
    x = buf[1:].view(20, 8)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    out = torch.full((20, 4), float("nan"), dtype=torch.bfloat16)
    calls = []

    def launch(xs, ys, partials, counters):
        calls.append((xs.shape[0], xs.data_ptr() % 16, partials is ws[0] and counters is ws[1]))
        ys.copy_(xs[:, :4])

    assert skinny_workspace.run(x, out, 4, 8, launch) is out
    assert calls == [(16, 0, True), (4, 0, True)]
    assert torch.equal(out, x[:, :4])
    skinny_workspace.run(x, out, 4, 8, launch, ctas=7)
    assert grids == [0, 7]
    with pytest.raises(ValueError, match="out must be contiguous"):
        skinny_workspace.run(x, out.t(), 4, 8, launch)
