"""skinny_gemm (the M <= 16 tensor-core GEMM) on the H200: against an fp64 reference on odd shapes
and several grid sizes (row blocks whole or cut in K anywhere), outputs poisoned with NaN first, a
token's output the same at every M and on every run, a PDL chain inside a CUDA graph equal to eager
launches with the counters left zero, bad inputs refused; then a tiny engine's spec tokens with the
skinny GEMM on vs off. split12_skinny_gemm: bit-identical to skinny_gemm on the unpacked weights
(escapes included) at several shapes, M and grids, in a child process with a time limit; bad
inputs refused. Skipped on CPU.

Tolerance: fp32 accumulation (tensor-core products are exact, sums in fp32) then one bf16 rounding:
|y - ref| <= 2^-8 |ref| + K * 2^-23 * (|W| |x|).
"""

import pytest
import torch

from conftest import refused_in_subprocess, requires_gpu, configured
from test_engine_helpers import fresh_seed
from test_fused_ops_gpu import assert_forks_only_within_rounding, fp32_twin_on_cpu, kernel_sized_pair

pytestmark = requires_gpu


@pytest.fixture(scope="module")
def ops():
    from specpilot.ops import linear as ops_linear

    assert ops_linear.skinny_available(), "the extension was built without skinny_gemm"
    return torch.ops.specpilot


def randn(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def workspace(ops, ctas, n, k):
    used = ctas or ops.skinny_plan_ctas(n, k)
    partials = torch.full((ops.skinny_partials_count(used, n),), float("nan"), device="cuda")
    counters = torch.zeros(ops.skinny_counter_count(n), dtype=torch.int32, device="cuda")
    return partials, counters


def run(ops, w, x, ctas=0, pdl=True):
    m, n, k = x.shape[0], w.shape[0], w.shape[1]
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    partials, counters = workspace(ops, ctas, n, k)
    ops.skinny_gemm(w, x, ctas, pdl, y, partials, counters)
    torch.cuda.synchronize()
    assert (counters == 0).all(), "skinny_gemm left a row-block counter non-zero"
    return y


def assert_close_to_fp64(y, w, x):
    assert not y.isnan().any(), "skinny_gemm left poisoned (NaN) outputs"
    ref = x.double() @ w.double().T
    bound = 2.0 ** -8 * ref.abs() + w.shape[1] * 2.0 ** -23 * (x.double().abs() @ w.double().abs().T) + 1e-30
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"max err / bound {(err / bound).max().item():.3f}"


SHAPES = [(37, 8), (100, 1000), (1000, 4096), (6144, 4096), (4096, 12288), (30011, 512)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 7, 9, 16])
def test_matches_fp64(ops, cuda_gen, n, k, m):
    w, x = randn(n, k, g=cuda_gen, scale=k ** -0.5), randn(m, k, g=cuda_gen)
    assert_close_to_fp64(run(ops, w, x), w, x)


@pytest.mark.parametrize("ctas", [1, 2, 3, 5, 7, 10, 64, 132])
def test_every_grid_matches_fp64(ops, cuda_gen, ctas):
    """300 rows = 5 row blocks (the last one partial) x 16 K steps: grids that give each CTA several
    whole blocks, cut every block in equal pieces, or cut anywhere (a block in up to 3 pieces)."""
    n, k = 300, 4096
    w, x = randn(n, k, g=cuda_gen, scale=k ** -0.5), randn(16, k, g=cuda_gen)
    assert_close_to_fp64(run(ops, w, x, ctas=ctas), w, x)


@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (100, 1000)])
def test_a_tokens_output_is_the_same_at_every_m_and_every_run(ops, cuda_gen, n, k):
    w, x = randn(n, k, g=cuda_gen, scale=k ** -0.5), randn(16, k, g=cuda_gen)
    full = run(ops, w, x)
    assert torch.equal(full, run(ops, w, x)), "two runs differ"
    for m in (1, 3, 8, 9):
        assert torch.equal(run(ops, w, x[:m].contiguous()), full[:m]), f"M={m} differs from the M=16 rows"


def test_pdl_chain_in_a_cuda_graph_equals_eager(ops, cuda_gen):
    """Three dependent GEMMs (row blocks whole, and cut anywhere) captured with PDL replay to the eager
    results."""
    k = 4096
    w1, w2, w3 = (randn(n, kk, g=cuda_gen, scale=kk ** -0.5) for n, kk in ((6144, k), (k, 6144), (2 * k, k)))
    x = randn(16, k, g=cuda_gen)
    grids = (0, 100, 0)
    ws = [workspace(ops, ctas, w.shape[0], w.shape[1]) for ctas, w in zip(grids, (w1, w2, w3))]
    ys = [torch.empty(16, w.shape[0], device="cuda", dtype=torch.bfloat16) for w in (w1, w2, w3)]

    def chain(pdl):
        ops.skinny_gemm(w1, x, grids[0], pdl, ys[0], *ws[0])
        ops.skinny_gemm(w2, ys[0], grids[1], pdl, ys[1], *ws[1])
        ops.skinny_gemm(w3, ys[1], grids[2], pdl, ys[2], *ws[2])

    chain(False)
    want = [y.clone() for y in ys]
    for y in ys:
        y.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(True)  # warm-up outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            chain(True)
    for _ in range(3):
        for y in ys:
            y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, exp in zip(ys, want):
            assert torch.equal(got, exp)
    for _, counters in ws:
        assert (counters == 0).all()


def test_bad_inputs_are_refused_with_the_reason(ops):
    refused_in_subprocess("""
w = bf(64, 256); x = bf(4, 256); y = bf(4, 64)
p = torch.zeros(64 * 16 * 64, device="cuda"); c = torch.zeros(8, dtype=torch.int32, device="cuda")
""", [
        ("ops.skinny_gemm(w, bf(17, 256), 0, True, bf(17, 64), p, c)", "M must be in 1..16"),
        ("ops.skinny_gemm(bf(64, 250), bf(4, 250), 0, True, y, p, c)", "K must be a positive multiple of 8"),
        ("ops.skinny_gemm(w, bf(4, 200), 0, True, y, p, c)", "x must have 256 columns"),
        ("ops.skinny_gemm(w, x, 0, True, bf(4, 63), p, c)", "y must be"),
        ("ops.skinny_gemm(w.float(), x, 0, True, y, p, c)", "weight must be BFloat16"),
        ("ops.skinny_gemm(w, x, -1, True, y, p, c)", "ctas must be 0"),
        ("ops.skinny_gemm(w, x, 2, True, y, torch.zeros(10, device='cuda'), c)", "partials must hold"),
        ("ops.skinny_gemm(w, x, 2, True, y, p, c[:0])", "counters must hold"),
        ("ops.skinny_gemm(w, x.cpu(), 0, True, y, p, c)", "x must be a CUDA tensor"),
    ])


def skinny(on: bool):
    from specpilot.ops import linear as ops_linear

    return configured(skinny_gemm=on)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_engine_spec_with_skinny_gemm_on_vs_off(ops, family, monkeypatch):
    """The skinny path really runs in the graphed verify and draft steps, and is as exact as the
    skinny-off engine: with the skinny-off transcript forced through both verify paths, the logits' RMS
    error against an fp32 twin is within 10% of each other; the spec outputs are equal up to a first
    fork that bf16 rounding explains (assert_forks_only_within_rounding)."""
    from specpilot import config
    from specpilot.engine import Engine
    from specpilot.ops import linear as ops_linear
    from specpilot.verify.arbiter_error import ArbiterErrorTally
    from specpilot.verify.forcing import forced_logits, forced_verify_logits

    seed = fresh_seed()
    target, drafter = kernel_sized_pair(family, seed)
    prompt = torch.randint(0, target.config.vocab_size, (29,), generator=torch.Generator().manual_seed(seed)).tolist()
    calls = []
    real_run = ops_linear._skinny
    monkeypatch.setattr(ops_linear, "_skinny", lambda *a: calls.append(1) or real_run(*a))
    out, forced = {}, {}
    for on in (False, True):
        with skinny(on), torch.inference_mode():
            eng = Engine(target, drafter, max_seq_len=256, config=config.current())
            out[on] = eng.generate_spec(prompt, 48).tokens
            assert bool(calls) == on, f"the skinny path {'did not run' if on else 'ran'} with the switch {on}"
            forced[on] = forced_verify_logits(eng, prompt, out[False], drafter.block_size)
        calls.clear()
    sequence = prompt + out[False]
    exact = forced_logits(fp32_twin_on_cpu(target), sequence)[len(prompt) - 1:len(sequence) - 1].float()
    tally = ArbiterErrorTally()
    for on in (False, True):
        tally.add(f"skinny {on}", forced[on], exact)
    error = {on: tally.summary()[f"skinny {on}"]["rms_error"] for on in (False, True)}
    print(f"logit RMS error vs fp32, skinny off / on: {error[False]:.5f} / {error[True]:.5f}")
    assert error[True] <= 1.1 * error[False], f"skinny on is less exact: RMS error vs fp32 {error}"
    assert_forks_only_within_rounding(target, prompt, out[True], out[False])


# The split12 kernel runs in a child process with a time limit: until it has run on an H200, a
# hang (a TMA box that never completes its barrier) must fail this test, not stall the suite.
SPLIT12_CHECKS = """
import sys, torch
from specpilot import _ext
from specpilot.kernels.variants.split12_args import contract_args, pack
ops = _ext.ops()
g = torch.Generator(device="cuda").manual_seed(int(sys.argv[1]))

def launch(op, m, n, k, ctas):  # op(y, partials, counters) on a NaN-poisoned y: (y, counters left zero)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    partials = torch.full((ops.skinny_partials_count(ctas or ops.skinny_plan_ctas(n, k), n),), float("nan"),
                          device="cuda")
    counters = torch.zeros(ops.skinny_counter_count(n), dtype=torch.int32, device="cuda")
    op(y, partials, counters)
    torch.cuda.synchronize()
    return y, bool((counters == 0).all())

cases = [(n, k, m, 0) for n, k in ((37, 8), (300, 200), (1000, 4096), (6144, 4096), (4096, 12288))
         for m in (1, 7, 16)] + [(300, 4096, 16, ctas) for ctas in (1, 3, 7, 64)]
for n, k, m, ctas in cases:
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    w.view(-1)[::37] = 0          # outside a row's exponent window: split12 escapes
    w.view(-1)[5::101] = -3e4
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    planes = contract_args(pack(w))
    want, _ = launch(lambda *out: ops.skinny_gemm(w, x, ctas, True, *out), m, n, k, ctas)
    got, zero = launch(lambda *out: ops.split12_skinny_gemm(x, *planes, k, ctas, True, *out), m, n, k, ctas)
    ok = torch.equal(got, want) and not got.isnan().any() and zero
    print(f"N={n} K={k} M={m} ctas={ctas}: {'ok' if ok else 'FAIL'}", flush=True)
"""


def test_split12_skinny_equals_the_bf16_kernel_bit_for_bit(ops, fresh_seed, tmp_path):
    """split12_skinny_gemm on W packed to split12 (escapes included) == skinny_gemm on W, bit for bit,
    on odd and 8B shapes, M = 1..16 and several grids; outputs NaN-poisoned, counters left zero."""
    import subprocess
    import sys

    script = tmp_path / "split12_checks.py"
    script.write_text(SPLIT12_CHECKS)
    try:
        run = subprocess.run([sys.executable, str(script), str(fresh_seed)], capture_output=True, text=True,
                             timeout=180)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"split12_skinny_gemm did not finish in 180 s (a hang?); output so far:\n{e.stdout}")
    assert run.returncode == 0, f"seed {fresh_seed}\n{run.stdout}{run.stderr[-2000:]}"
    lines = run.stdout.strip().split("\n")
    assert len(lines) == 19 and all(line.endswith(": ok") for line in lines), f"seed {fresh_seed}\n{run.stdout}"


def test_split12_skinny_bad_inputs_are_refused_with_the_reason(ops):
    refused_in_subprocess("""
from specpilot.kernels.variants.split12_args import contract_args, pack
w = torch.randn(64, 256, device="cuda").to(torch.bfloat16); P = contract_args(pack(w))
x = bf(4, 256); y = bf(4, 64)
p = torch.zeros(64 * 16 * 64, device="cuda"); c = torch.zeros(8, dtype=torch.int32, device="cuda")
P12 = contract_args(pack(torch.randn(64, 252, device="cuda").to(torch.bfloat16)))
""", [
        ("ops.split12_skinny_gemm(bf(17, 256), *P, 256, 0, True, bf(17, 64), p, c)", "M must be in 1..16"),
        ("ops.split12_skinny_gemm(bf(4, 252), *P12, 252, 0, True, y, p, c)", "K must be a positive multiple of 8"),
        ("ops.split12_skinny_gemm(x, *P, 256, 0, True, bf(4, 63), p, c)", "out"),
        ("ops.split12_skinny_gemm(x, *P, 256, -1, True, y, p, c)", "ctas must be 0"),
        ("ops.split12_skinny_gemm(x, *P, 256, 2, True, y, torch.zeros(10, device='cuda'), c)", "partials must hold"),
        ("ops.split12_skinny_gemm(x, *P, 256, 0, True, y, p, c[:0])", "counters must hold"),
    ])
