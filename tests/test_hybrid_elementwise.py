"""The hybrid target's compact elementwise forms (ops/zero_centred.py) on the CPU against their op-for-op
references (models/hybrid.py's arithmetic as before): the zero-centred norm, the residual add fused with
it, the q/k head norms with partial RoPE, the output gate; a bf16 tiny hybrid with them on vs off; fp32
untouched. Tolerances as the dense fused kernels' GPU tests (tests/test_fused_ops_gpu.py): residual sums,
RoPE and the gate bit-exact; a norm's single final rounding may flip by 1 bf16 ulp on < 1% of the
elements; q/k through their norm: |diff| <= 2^-3 max|row|. The GPU twin: test_hybrid_elementwise_gpu.py."""
import dataclasses

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from bf16_helpers import assert_few_flips
from specpilot import config
from specpilot.engine.recurrent_state import HybridCache
from specpilot.models.config import RopeConfig
from specpilot.models.layers import rope_table
from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target
from specpilot.ops import zero_centred as zc

EPS = 1e-6


def bf16(*shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


def with_kernels(on: bool):
    return config.use(dataclasses.replace(config.current(), fused_kernels=on))


@pytest.mark.parametrize("rows, hidden", [(1, 320), (7, 512), (3, 4096)])
def test_compact_norm_and_fused_add_equal_the_reference(rows, hidden):
    gen = torch.Generator().manual_seed(fresh_seed())
    x, delta, w = bf16(rows, hidden, gen=gen, scale=3.0), bf16(rows, hidden, gen=gen), bf16(hidden, gen=gen, scale=0.1)
    want = zc.zero_centred_rms_norm(x + delta, w, EPS)
    assert_few_flips(zc.compact_zero_centred_rms_norm(x + delta, zc.PlusOne().get((w,)), EPS), want)
    total, normed = zc.add_zero_centred_rms_norm(x, delta, w, zc.PlusOne(), EPS)
    assert torch.equal(total, x + delta)
    assert_few_flips(normed, want)
    alone, normed = zc.add_zero_centred_rms_norm(x, None, w, zc.PlusOne(), EPS)
    assert alone is x
    assert_few_flips(normed, zc.zero_centred_rms_norm(x, w, EPS))


def test_rope_in_place_is_bit_identical_to_partial_rope():
    """Any sin table (halves unequal too): cat(x2, x1) * cat(-s1, s2) is rotate_half(x) * sin exactly."""
    gen = torch.Generator().manual_seed(fresh_seed())
    b, t, h, d, r = 2, 5, 3, 32, 16
    x, cos, sin = bf16(b, t, h, d, gen=gen, scale=4.0), bf16(t, r, gen=gen), bf16(t, r, gen=gen)
    want = zc.partial_rope(x.transpose(1, 2), cos, sin).transpose(1, 2)
    got = x.clone()
    zc.rope_in_place(got, cos, zc.rope_rows(sin))
    assert torch.equal(got, want)


@pytest.mark.parametrize("t, hq, hkv, d, r", [(1, 4, 2, 16, 8), (16, 16, 4, 256, 64), (3, 2, 2, 64, 64)])
def test_compact_qk_norm_rope_equals_the_reference(t, hq, hkv, d, r):
    """q as the model slices it: every other D-block of the projection's [query | gate] rows."""
    gen = torch.Generator().manual_seed(fresh_seed())
    qg, k = bf16(1, t, hq, 2 * d, gen=gen, scale=2.0), bf16(1, t, hkv, d, gen=gen, scale=2.0)
    q = qg[..., :d]
    qw, kw = bf16(d, gen=gen, scale=0.1), bf16(d, gen=gen, scale=0.1)
    cos, sin = rope_table(RopeConfig(10000.0), r, 64, "cpu", torch.bfloat16)
    positions = torch.randint(0, 64, (t,), generator=gen)
    cos, sin = cos[positions], sin[positions]
    plus_one = zc.PlusOne().get((qw, kw), (hq, hkv))
    got_q, got_k = zc.compact_qk_norm_rope(q, k, plus_one, cos, zc.rope_rows(sin), EPS)
    for got, x, w in ((got_q, q, qw), (got_k, k, kw)):
        want = zc.partial_rope(zc.zero_centred_rms_norm(x, w, EPS).transpose(1, 2), cos, sin).transpose(1, 2)
        bound = 2.0 ** -3 * want.float().abs().amax(dim=-1, keepdim=True)
        assert ((got.float() - want.float()).abs() <= bound).all()
        assert (got != want).float().mean().item() < 0.01
        if r < d:                                                               # the dims RoPE passes
            assert_few_flips(got[..., r:], zc.zero_centred_rms_norm(x, w, EPS)[..., r:])


def test_output_gate_is_bit_identical():
    gen = torch.Generator().manual_seed(fresh_seed())
    b, t, h, d = 1, 4, 3, 16
    gate = bf16(b, t, h, 2 * d, gen=gen, scale=3.0)[..., d:]                  # strided, as the model's
    out = bf16(b, t, h * d, gen=gen)
    assert torch.equal(zc.output_gate(out, gate), out * torch.sigmoid(gate.reshape(b, t, h * d)))


def test_bad_arguments_name_the_problem():
    q, k = torch.zeros(1, 2, 4, 16, dtype=torch.bfloat16), torch.zeros(1, 2, 2, 16, dtype=torch.bfloat16)
    cos = sin = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"plus_one must be fp32 \[6, 16\]"):
        zc.compact_qk_norm_rope(q, k, torch.zeros(4, 16), cos, sin, EPS)
    with pytest.raises(ValueError, match=r"same B, T, D"):
        zc.compact_qk_norm_rope(q, k[..., :8], torch.zeros(6, 16), cos, sin, EPS)
    with pytest.raises(ValueError, match=r"R even"):
        zc.rope_in_place(q.clone(), cos[:, :7], sin[:, :7])


def test_plus_one_follows_the_weight_in_place():
    w = torch.zeros(8, dtype=torch.bfloat16)
    keep = zc.PlusOne()
    first = keep.get((w,))
    assert torch.equal(first, torch.ones(8))
    w.add_(0.5)
    again = keep.get((w,))
    assert again is first and torch.equal(again, torch.full((8,), 1.5))     # same memory: graphs stay valid
    stacked = zc.PlusOne().get((w, torch.zeros(8)), (2, 3))
    assert stacked.shape == (5, 8) and torch.equal(stacked[:2], torch.full((2, 8), 1.5))
    assert torch.equal(stacked[2:], torch.ones(3, 8))
    with torch.inference_mode():                       # weights loaded under inference mode: no version
        frozen = torch.full((8,), 0.25)
    assert torch.equal(zc.PlusOne().get((frozen,)), torch.full((8,), 1.25))


def run_tiny(dtype, on: bool, seed: int):
    model = random_target(HYBRID_PRESETS["tiny-qwen3.5"], "cpu", dtype, seed=seed)
    model.ensure_rope(128)
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(seed))
    with with_kernels(on), torch.inference_mode():
        cache = HybridCache(model.config, 1, 128, "cpu", dtype)
        prefill, pf = model(ids[:, :12], torch.arange(12), cache, 12, feature_layers=(1, 3))
        step, sf = model(ids[:, 12:], torch.arange(12, 20), cache, 20, feature_layers=(0, 3))
    return [t.float() for t in (prefill, pf, step, sf)]


def counting(monkeypatch) -> dict:
    calls = {}
    for name in ("compact_zero_centred_rms_norm", "compact_qk_norm_rope", "output_gate"):
        def counted(*args, _real=getattr(zc, name), _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args)
        monkeypatch.setattr(zc, name, counted)
    return calls


def test_bf16_hybrid_with_the_compact_forms_equals_the_reference(monkeypatch):
    """Logits and features of a prefill and a verify-sized step, compact forms on vs off; the forms do run."""
    seed = fresh_seed()
    calls = counting(monkeypatch)
    on = run_tiny(torch.bfloat16, True, seed)
    assert calls.get("compact_zero_centred_rms_norm", 0) > 0 and calls.get("compact_qk_norm_rope", 0) > 0 \
        and calls.get("output_gate", 0) > 0, calls
    seen = dict(calls)
    off = run_tiny(torch.bfloat16, False, seed)
    assert calls == seen, "fused_kernels off ran a compact form"
    for got, want in zip(on, off):
        torch.testing.assert_close(got, want, atol=0.05 * float(want.abs().amax()), rtol=0.02)


def test_fp32_runs_the_references_only(monkeypatch):
    calls = counting(monkeypatch)
    run_tiny(torch.float32, True, fresh_seed())
    assert calls == {}, f"an fp32 forward ran a compact form: {calls}"
