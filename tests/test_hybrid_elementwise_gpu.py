"""The hybrid target's elementwise forms on the GPU (ops/zero_centred.py): the zero_centred_add_rms_norm
CUDA kernel (csrc/cuda/fused_norm.cu) and the compact torch forms against their op-for-op references,
outputs poisoned with NaN first; bad inputs refused; a bf16 hybrid engine with the forms on vs off; the
graphed AR step's kernel count. Skipped on CPU (the CPU twin: test_hybrid_elementwise.py; graphed vs
eager bitwise with these forms in: test_hybrid_graphs_gpu.py).

Tolerances as tests/test_fused_ops_gpu.py: residual sums, RoPE and the gate bit-exact; a zero-centred
norm rounds once at the end, so the fp32 sum-of-squares order (and rsqrt) can flip that rounding by
1 bf16 ulp, on < 1% of the elements; q/k through their norm and RoPE: |diff| <= 2^-3 max|row|."""
import dataclasses

import pytest
import torch

from bf16_helpers import assert_few_flips, gen, nan_like, randn
from conftest import refused_in_subprocess, requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.ops import zero_centred as zc

pytestmark = requires_gpu

EPS = 1e-6


@pytest.fixture(scope="module")
def ops():
    from specpilot import _ext

    assert zc.kernel_available(), "the extension was built without zero_centred_add_rms_norm"
    return _ext.ops()


@pytest.mark.parametrize("hidden", [320, 4096, 5120])
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("with_delta", [True, False])
@pytest.mark.parametrize("weight_scale", [0.1, 1.0])
def test_zero_centred_add_rms_norm_kernel(ops, hidden, rows, with_delta, weight_scale):
    g = gen()
    x, delta = randn(rows, hidden, g=g, scale=3.0), randn(rows, hidden, g=g) if with_delta else None
    weight = randn(hidden, g=g, scale=weight_scale)
    total = x + delta if with_delta else x
    want = zc.zero_centred_rms_norm(total, weight, EPS)
    got_sum, got = (nan_like(x) if with_delta else None), nan_like(x)
    ops.zero_centred_add_rms_norm(x, delta, weight, EPS, got_sum, got)
    assert not got.isnan().any(), "the kernel left poisoned (NaN) outputs"
    if with_delta:
        assert torch.equal(got_sum, total)
    assert_few_flips(got, want, 1)
    assert zc.kernel_takes(x, delta, weight)                     # the model's dispatch picks the kernel here
    t2, n2 = zc.add_zero_centred_rms_norm(x, delta, weight, zc.PlusOne(), EPS)
    assert torch.equal(n2, got) and torch.equal(t2, total)


def test_zero_centred_add_rms_norm_rejects_bad_inputs(ops):
    setup = """
    x, w = bf(2, 64), torch.zeros(64, device="cuda", dtype=torch.bfloat16)
    """
    refused_in_subprocess(setup, [
        ("ops.zero_centred_add_rms_norm(x, None, w.float(), 1e-6, None, x.clone())", "weight must be bfloat16"),
        ("ops.zero_centred_add_rms_norm(x, None, w[:32], 1e-6, None, x.clone())", "weight must have shape"),
        ("ops.zero_centred_add_rms_norm(x, bf(2, 32), w, 1e-6, x.clone(), x.clone())", "delta must have shape"),
        ("ops.zero_centred_add_rms_norm(x[:, :60].contiguous(), None, w[:60], 1e-6, None, "
         "x[:, :60].contiguous())", "multiple of 8"),
    ])


@pytest.mark.parametrize("rows, hidden", [(1, 4096), (16, 4096), (5, 320)])
def test_compact_norm_on_cuda(rows, hidden):
    """The torch form the dispatch falls back to (a build without the kernel): torch's rms_norm in fp32."""
    g = gen()
    x, w = randn(rows, hidden, g=g, scale=3.0), randn(hidden, g=g, scale=0.1)
    assert_few_flips(zc.compact_zero_centred_rms_norm(x, zc.PlusOne().get((w,)), EPS),
                     zc.zero_centred_rms_norm(x, w, EPS), 1)


@pytest.mark.parametrize("t", [1, 16])
def test_compact_qk_norm_rope_and_gate_on_cuda(t):
    """Qwen3.5-9B attention heads (16 q, 4 kv, D 256, rotary 64), q and gate as the model's views."""
    from specpilot.models.config import RopeConfig
    from specpilot.models.layers import rope_table

    g = gen()
    hq, hkv, d, r = 16, 4, 256, 64
    qg, k = randn(1, t, hq, 2 * d, g=g, scale=2.0), randn(1, t, hkv, d, g=g, scale=2.0)
    q, gate = qg[..., :d], qg[..., d:]
    qw, kw = randn(d, g=g, scale=0.1), randn(d, g=g, scale=0.1)
    cos, sin = rope_table(RopeConfig(10000.0), r, 4096, "cuda", torch.bfloat16)
    positions = torch.randint(0, 4096, (t,), generator=g, device="cuda")
    cos, sin = cos[positions], sin[positions]
    got_q, got_k = zc.compact_qk_norm_rope(q, k, zc.PlusOne().get((qw, kw), (hq, hkv)), cos, zc.rope_rows(sin), EPS)
    for got, x, w in ((got_q, q, qw), (got_k, k, kw)):
        normed = zc.zero_centred_rms_norm(x, w, EPS)
        want = zc.partial_rope(normed.transpose(1, 2), cos, sin).transpose(1, 2)
        bound = 2.0 ** -3 * want.float().abs().amax(dim=-1, keepdim=True)
        assert ((got.float() - want.float()).abs() <= bound).all()
        assert (got != want).float().mean().item() < 0.01
        rotated = normed.clone()
        zc.rope_in_place(rotated, cos, zc.rope_rows(sin))
        assert torch.equal(rotated, want), "the RoPE alone must be bit-identical"
    out = randn(1, t, hq * d, g=g)
    assert torch.equal(zc.output_gate(out, gate), out * torch.sigmoid(gate.reshape(1, t, hq * d)))


def kernel_hybrid():
    """tiny-qwen3.5 with head dims the GDN kernels take and a hidden size the norm kernel takes."""
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = dataclasses.replace(HYBRID_PRESETS["tiny-qwen3.5"], linear_key_head_dim=64, linear_value_head_dim=64)
    return random_target(cfg, "cuda", torch.bfloat16, seed=fresh_seed())


@torch.inference_mode()
def test_engine_with_the_forms_equals_the_references(monkeypatch):
    """A bf16 hybrid, graphed steps: with fused_kernels on (the norm kernel, the compact forms, the GDN
    kernels) vs off (every reference): verify logits agree to bf16 rounding (the GDN ops' test's bound),
    and the norm kernel did run."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine

    target = kernel_hybrid()
    took = []
    real = zc.kernel_takes
    monkeypatch.setattr(zc, "kernel_takes", lambda *a: took.append(real(*a)) or took[-1])
    prompt = torch.arange(5, 45, device="cuda")[None]
    logits = []
    for on in (True, False):
        engine = Engine(target, None, max_seq_len=256, config=EngineConfig(fused_kernels=on))
        engine.runner.prefill(prompt, with_features=False)
        out, _ = engine.runner.target_step(prompt[:, :16], prompt.shape[1], with_features=False)
        logits.append(out.float().clone())
        if on:
            assert took and all(took), "the norm kernel did not take the model's norms"
    on, off = logits
    torch.testing.assert_close(on, off, atol=0.05 * float(off.abs().amax()), rtol=0.02)


@torch.inference_mode()
def test_graphed_ar_step_launches_fewer_kernels():
    """The profiler's count of one graphed AR step: with the forms on, one norm kernel per norm (two per
    layer and the final one), none in the step as it was before them, and fewer kernels in all."""
    from specpilot.bench.hybrid_kernel_counts import cuda_counts

    layers = 8
    counts = cuda_counts("qwen3.5-9b", layers=layers, block=16, context=128)
    on, before = counts["on"]["ar"], counts["before"]["ar"]

    def norms(names):
        return sum(n for name, n in names.items() if "add_rms_norm_kernel<true>" in name)
    assert norms(on) == 2 * layers + 1 and norms(before) == 0, (on, before)
    assert sum(on.values()) < sum(before.values()) < sum(counts["off"]["ar"].values())
