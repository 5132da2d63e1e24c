"""bf16 comparisons and CUDA inputs shared by the fused-kernel tests (dense: test_fused_ops_gpu.py;
hybrid: test_hybrid_elementwise*.py)."""
import torch

from test_engine_helpers import fresh_seed


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in bf16 steps, elementwise (ordered bit patterns; NaN shows as a large distance)."""
    def ordered(t):
        u = t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
        return torch.where(u >= 0x8000, -(u & 0x7FFF), u)
    return (ordered(a) - ordered(b)).abs()


def assert_few_flips(got, want, max_ulps: int = 1):
    """At most max_ulps apart anywhere, and apart at all on < 1% of the elements (rounding-tie flips)."""
    assert not got.isnan().any(), "the kernel left poisoned (NaN) outputs"
    d = ulps(got, want)
    assert d.max().item() <= max_ulps, f"max {d.max().item()} ulps > {max_ulps}"
    assert (d > 0).float().mean().item() < 0.01, f"{(d > 0).float().mean().item():.3%} of elements differ"


def gen():
    return torch.Generator(device="cuda").manual_seed(fresh_seed())


def randn(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def nan_like(t):
    return torch.full_like(t, float("nan"))
