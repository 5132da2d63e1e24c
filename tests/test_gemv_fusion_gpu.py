"""gemv_m1 (the one-token GEMV with a fused add+RMSNorm or SiLU*mul prologue) on the H200: against an
fp64 reference, its prologues bit-identical to the add_rms_norm / silu_mul kernels, outputs poisoned
with NaN first, bad inputs refused, PDL on and off equal inside a CUDA graph; then a tiny engine's
greedy AR tokens with the fused GEMVs on vs off. Skipped on CPU.

GEMV tolerance: fp32 fmaf chains over K products, then one bf16 rounding of the output:
|y - ref| <= 2^-8 |ref| + K * 2^-23 * (|W| |in|)  (output rounding + a loose fp32 accumulation bound).
"""

import pytest
import torch

from conftest import refused_in_subprocess, requires_gpu, configured
from test_engine_helpers import fresh_seed
from test_fused_ops_gpu import assert_forks_only_within_rounding, kernel_sized_pair

pytestmark = requires_gpu

EPS = 1e-6


@pytest.fixture(scope="module")
def ops():
    from specpilot.ops import linear as ops_linear

    assert ops_linear.gemv_available(), "the extension was built without gemv_m1"
    return torch.ops.specpilot


def randn(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def nan_vector(n):
    return torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)


def assert_close_to_fp64(y, w, inp):
    assert not y.isnan().any(), "gemv_m1 left poisoned (NaN) outputs"
    ref = w.double() @ inp.double()
    bound = 2.0 ** -8 * ref.abs() + w.shape[1] * 2.0 ** -23 * (w.double().abs() @ inp.double().abs()) + 1e-30
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"max err / bound {(err / bound).max().item():.3f}"


SHAPES = [(1, 8), (37, 512), (1000, 4096), (6144, 4096), (30011, 512), (4096, 12288)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_plain_gemv_matches_fp64(ops, cuda_gen, n, k):
    w, x = randn(n, k, g=cuda_gen, scale=k ** -0.5), randn(k, g=cuda_gen)
    y = nan_vector(n)
    ops.gemv_m1(w, x, None, None, 0.0, 0, True, y, None)
    assert_close_to_fp64(y, w, x)


@pytest.mark.parametrize("n,k", [s for s in SHAPES if s[1] <= 4096])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_norm_prologue_is_add_rms_norm_bit_for_bit(ops, cuda_gen, n, k, with_delta):
    """y(add-norm) == y(plain on add_rms_norm's normed output), and sum_out == add_rms_norm's sum."""
    w = randn(n, k, g=cuda_gen, scale=k ** -0.5)
    x, delta = randn(k, g=cuda_gen), (randn(k, g=cuda_gen) if with_delta else None)
    norm_w = (1 + 0.1 * torch.randn(k, generator=cuda_gen, device="cuda")).to(torch.bfloat16)
    want_sum, normed = torch.empty_like(x), torch.empty_like(x)
    ops.add_rms_norm(x, delta, norm_w, EPS, want_sum if with_delta else None, normed)
    y, y_plain = nan_vector(n), nan_vector(n)
    got_sum = nan_vector(k) if with_delta else None
    ops.gemv_m1(w, x, delta, norm_w, EPS, 1, True, y, got_sum)
    ops.gemv_m1(w, normed, None, None, 0.0, 0, True, y_plain, None)
    assert torch.equal(y.view(torch.int16), y_plain.view(torch.int16))
    if with_delta:
        assert torch.equal(got_sum.view(torch.int16), want_sum.view(torch.int16))
    assert_close_to_fp64(y, w, normed)


@pytest.mark.parametrize("n,k", [(37, 512), (4096, 12288), (5, 8)])
def test_silu_mul_prologue_is_silu_mul_bit_for_bit(ops, cuda_gen, n, k):
    w, gate_up = randn(n, k, g=cuda_gen, scale=k ** -0.5), randn(2 * k, g=cuda_gen, scale=3.0)
    gated = torch.empty(k, device="cuda", dtype=torch.bfloat16)
    ops.silu_mul(gate_up, gated)
    y, y_plain = nan_vector(n), nan_vector(n)
    ops.gemv_m1(w, gate_up, None, None, 0.0, 2, True, y, None)
    ops.gemv_m1(w, gated, None, None, 0.0, 0, True, y_plain, None)
    assert torch.equal(y.view(torch.int16), y_plain.view(torch.int16))
    assert_close_to_fp64(y, w, gated)


def test_bad_inputs_are_refused_with_the_reason(ops):
    setup = """
    w, x, y = bf(16, 64), bf(64), bf(16)
    gemv = ops.gemv_m1
    """
    refused_in_subprocess(setup, [
        ("gemv(bf(16, 60), bf(60), None, None, 0.0, 0, True, y, None)", "multiple of 8"),
        ("gemv(w.float(), x, None, None, 0.0, 0, True, y, None)", "bfloat16"),
        ("gemv(w, bf(2, 64), None, None, 0.0, 0, True, y, None)", "one token"),
        ("gemv(w, x, None, None, 0.0, 1, True, y, None)", "needs norm_weight"),
        ("gemv(w, x, x, None, 0.0, 0, True, y, None)", "belong to the add . RMSNorm prologue"),
        ("gemv(w, x, None, None, 0.0, 7, True, y, None)", "prologue must be"),
        ("gemv(w, x, None, None, 0.0, 2, True, y, None)", "must hold 128 values"),
        ("gemv(bf(4, 8192), bf(8192), None, bf(8192), 0.0, 1, True, bf(4), None)", "K <= 4096"),
    ])


def test_pdl_chain_in_a_cuda_graph_equals_the_plain_launches(ops, cuda_gen):
    """norm_linear -> linear -> norm_linear -> silu_mul_linear, captured with PDL, replayed twice,
    equals the same chain launched without PDL, bit for bit (no kernel reads a predecessor early)."""
    from specpilot.ops import linear as ops_linear

    h, inter = 4096, 12288
    wq, wo = randn(6144, h, g=cuda_gen, scale=h ** -0.5), randn(h, 4096, g=cuda_gen, scale=64 ** -1)
    wgu, wd = randn(2 * inter, h, g=cuda_gen, scale=h ** -0.5), randn(h, inter, g=cuda_gen, scale=inter ** -0.5)
    n1 = (1 + 0.1 * torch.randn(h, generator=cuda_gen, device="cuda")).to(torch.bfloat16)
    x, delta = randn(1, 1, h, g=cuda_gen), randn(1, 1, h, g=cuda_gen)

    def chain():
        s, q = ops_linear.norm_gemv(x, delta, n1, EPS, wq)
        o = ops_linear.gemv(q[..., :4096], wo)
        s2, gu = ops_linear.norm_gemv(s, o, n1, EPS, wgu)
        return s2, ops_linear.silu_mul_gemv(gu, wd)

    with configured(gemv_pdl=False):
        want = chain()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def fused_gemv(on: bool):
    from specpilot.ops import linear as ops_linear

    return configured(fused_gemv=on)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_engine_ar_with_fused_gemv_on_vs_off(ops, family, monkeypatch):
    """The fused path really runs in the graphed AR step, its one-token logits are close to the
    cuBLAS path's, and 48 greedy AR tokens are equal except at a first fork that bf16 rounding explains."""
    from specpilot import config
    from specpilot.engine import Engine
    from specpilot.ops import linear as ops_linear

    seed = fresh_seed()
    print(f"seed {seed}")
    target, drafter = kernel_sized_pair(family, seed)
    prompt = torch.randint(0, target.config.vocab_size, (1, 29), generator=torch.Generator().manual_seed(seed))
    calls = []
    real_gemv = ops_linear.gemv
    monkeypatch.setattr(ops_linear, "gemv", lambda *a: calls.append(1) or real_gemv(*a))
    out = {}
    for on in (True, False):
        with fused_gemv(on), torch.inference_mode():
            eng = Engine(target, drafter, max_seq_len=256, config=config.current())
            tokens = eng.generate_ar(prompt[0].tolist(), 48).tokens
            # the graphed one-token step again at the prompt's last position (its prefix is cached)
            logits, _ = eng.runner.target_step(prompt[:, -1:].cuda(), prompt.shape[1] - 1, with_features=False)
            out[on] = (tokens, logits.float().clone())
        if on:
            assert calls, "the fused GEMV path did not run with fused_gemv on"
            calls.clear()
    assert not calls, "the fused GEMV path ran with fused_gemv off"
    got, want = out[True][1], out[False][1]
    assert not got.isnan().any()
    assert (got - want).abs().max().item() <= 0.04 * want.abs().max().item()
    assert_forks_only_within_rounding(target, prompt[0].tolist(), out[True][0], out[False][0])
