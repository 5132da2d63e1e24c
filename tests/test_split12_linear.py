"""split12_linear / bf16_linear on the CPU: within the stated fp32 tolerance of the fp64
reference, bit-identical to each other, batch-invariant; the modules and swap_linears."""
import os

import pytest
import torch
from torch import nn

from conftest import configured

from specpilot.formats.split12 import ops, reference as ref
from specpilot.formats.split12.linear import Bf16Linear, Split12Linear, swap_linears


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")  # shown by pytest when a test fails
    return torch.Generator().manual_seed(seed)


def weights(N, K, g, escapes=True):
    w = (torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16)
    if escapes:  # zeros, tiny and huge values land outside the row windows
        idx = torch.randint(0, N * K, (max(1, N * K // 50),), generator=g)
        vals = torch.tensor([0.0, -0.0, 1e-30, -3e-39, 40.0, -1e4])[torch.randint(0, 6, idx.shape, generator=g)]
        w.view(-1)[idx] = vals.to(torch.bfloat16)
    return w


def tolerance(x, w):
    """fp32 chain of <= ceil(K/1024)*32 fmaf + 5 tree adds, then one bf16 rounding:
    |y - ref| <= 2^-8 |ref| + (chain + 5) 2^-24 sum_k |x_k w_k| (+ the smallest bf16 subnormal)."""
    chain = -(-x.shape[1] // 1024) * 32
    mag = x.double().abs() @ w.double().abs().T
    exact = x.double() @ w.double().T
    return 2.0 ** -8 * exact.abs() + (chain + 5) * 2.0 ** -24 * mag + 2.0 ** -133


def poisoned(M, N):
    return torch.full((M, N), float("nan"), dtype=torch.bfloat16)


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("N,K", [(37, 133), (5, 1), (64, 1024), (9, 2085)])
def test_linear_matches_fp64_and_bf16_twin(M, N, K, gen):
    w = weights(N, K, gen)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    p = ops.pack(w)
    assert p.escapes > 0 or N * K < 50
    y12 = ops.split12_linear(x, p, out=poisoned(M, N))
    y16 = ops.bf16_linear(x, w, out=poisoned(M, N))
    assert not torch.isnan(y12).any()
    assert same_bits(y12, y16)
    err = (y12.double() - ref.gemv_reference(x, p)).abs()
    assert (err <= tolerance(x, w)).all(), f"max error {err.max().item()}"


def test_rows_are_batch_invariant(gen):
    # Row m of an M-row call equals the same x row alone: verification at M=k matches decoding at M=1.
    N, K = 29, 300
    w = weights(N, K, gen)
    p = ops.pack(w)
    x = torch.randn(16, K, generator=gen).to(torch.bfloat16)
    full = ops.split12_linear(x, p, out=poisoned(16, N))
    for m in (0, 7, 15):
        assert same_bits(ops.split12_linear(x[m:m + 1].contiguous(), p, out=poisoned(1, N)), full[m:m + 1])


def test_order_is_the_documented_lane_tree(gen):
    # Python re-statement of split12_format.h's order: one fma chain per lane, butterfly tree.
    N, K = 3, 2100
    w = weights(N, K, gen)
    x = torch.randn(1, K, generator=gen).to(torch.bfloat16)
    y = ops.bf16_linear(x, w)
    xs, ws = x[0].float(), w.float()
    for n in range(N):
        acc = []
        for lane in range(32):
            a = torch.zeros((), dtype=torch.float32)
            for c0 in range(lane * 32, K, 1024):
                for k in range(c0, min(c0 + 32, K)):
                    a = (a.double() + xs[k].double() * ws[n, k].double()).float()  # exact product, one rounding
            acc.append(a)
        off = 16
        while off:
            acc = [acc[i] + acc[i + off] for i in range(off)]
            off //= 2
        assert same_bits(acc[0].to(torch.bfloat16).view(1), y[0, n].view(1))


def test_modules_and_swap(gen):
    model = nn.Sequential(nn.Linear(96, 64, bias=False), nn.GELU(), nn.Linear(64, 72, bias=False),
                          nn.Linear(72, 8, bias=True)).to(torch.bfloat16)
    twin = Bf16Linear(model[0].weight.data)
    s12 = Split12Linear.from_weight(model[0].weight.data)
    x = torch.randn(2, 5, 96, generator=gen).to(torch.bfloat16)  # any leading dims
    assert s12(x).shape == (2, 5, 64) and same_bits(s12(x), twin(x))

    # The swapped layers must match their bf16 twins (same kernel order), not torch's own linear:
    # torch sums in another order, and about 1 in 100 weight draws rounds one output differently.
    expect = model[3](Bf16Linear(model[2].weight.data)(model[1](twin(x))))
    report = swap_linears(model, max_bits_per_weight=13.0)  # K=64: 12 + 40/64 bits/weight
    assert report.swapped == ["0", "2"] and "3" in report.kept and "bias" in report.kept["3"]
    assert isinstance(model[0], Split12Linear) and isinstance(model[3], nn.Linear)
    assert same_bits(model(x), expect)
    assert report.summary()["tensors"] == 2

    tight = nn.Sequential(nn.Linear(64, 16, bias=False)).to(torch.bfloat16)
    kept = swap_linears(tight, max_bits_per_weight=12.0)  # 40 bits/row on K=64 > 12 bits/weight
    assert kept.swapped == [] and "budget" in kept.kept["0"]


def test_dense_kernel_is_torchs_own_linear_on_the_decoded_weight(gen):
    """kernel="dense" (the engine's choice for prefill rows) is F.linear on the bit-exact decoded
    weight, for split12 and the twin alike; out= is filled and checked."""
    w = weights(40, 72, gen)
    x = torch.randn(20, 72, generator=gen).to(torch.bfloat16)
    p = ops.pack(w)
    want = nn.functional.linear(x, w)
    assert torch.equal(ops.split12_linear(x, p, kernel="dense").view(torch.int16), want.view(torch.int16))
    out = torch.full((20, 40), float("nan"), dtype=torch.bfloat16)
    assert ops.bf16_linear(x, w, out=out, kernel="dense") is out
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match=r"out must be bfloat16 \[20, 40\]"):
        ops.split12_linear(x, p, out=torch.empty(20, 41, dtype=torch.bfloat16), kernel="dense")


def test_bad_inputs_name_the_problem(gen):
    w = weights(8, 40, gen)
    p = ops.pack(w)
    with pytest.raises(ValueError, match="K=40"):
        ops.split12_linear(torch.zeros(2, 41, dtype=torch.bfloat16), p)
    with pytest.raises(ValueError, match="bfloat16"):
        Split12Linear(p)(torch.zeros(2, 40))
    with pytest.raises(RuntimeError, match="out must have shape"):
        torch.ops.specpilot.split12_linear(torch.zeros(2, 40, dtype=torch.bfloat16), *p.planes().values(), 40,
                                           torch.empty(3, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16_linear|x must be"):
        torch.ops.specpilot.bf16_linear(torch.zeros(2, 40, dtype=torch.float32), w, torch.empty(2, 8, dtype=torch.bfloat16))
    x = torch.zeros(2, 40, dtype=torch.bfloat16)
    for kernel in ("tc", "skinny"):  # tensor-core kernels: CUDA only, said before anything runs
        with pytest.raises(ValueError, match=f"kernel='{kernel}' runs on CUDA only"):
            ops.split12_linear(x, p, kernel=kernel)
        with pytest.raises(ValueError, match=f"kernel='{kernel}' runs on CUDA only"):
            ops.bf16_linear(x, w, kernel=kernel)
    with pytest.raises(ValueError, match="kernel must be one of"):
        ops.split12_linear(x, p, kernel="wgmma")


@pytest.mark.parametrize("n,k,planned,sms,want", [
    (4096, 4096, 64, 132, 128),     # Qwen3-8B O: 64 row blocks, each cut in two
    (4096, 4096, 64, 114, 0),       # 114 SMs: the planner's 64 CTAs cover half of them
    (6144, 4096, 96, 132, 0),       # QKV: 96 of 132 SMs already decode
    (24576, 4096, 128, 132, 0),     # gate_up
    (4096, 12288, 128, 132, 0),     # down: already cut by the planner
    (2048, 4096, 32, 132, 128),     # 32 row blocks x 4 K pieces (16 steps)
    (1000, 72, 16, 132, 0),         # one K step: nothing to cut
    (640, 768, 10, 132, 30),        # 3 steps: only a 3-way cut divides them
])
def test_decode_bound_grid_cuts_row_blocks_only_where_the_planner_idles_half_the_sms(n, k, planned, sms, want):
    """Where the planner's grid covers fewer than half the SMs, each row block is cut into the most
    equal K pieces that keep one CTA per SM; elsewhere the planner's grid stays (0)."""
    assert ops.decode_bound_ctas(n, k, sms, planned) == want


def test_decode_bound_grid_off_keeps_the_planners_grid():
    with configured(split12_decode_grid=False):
        assert ops.skinny_pair_ctas(4096, 4096, torch.device("cpu")) == 0
