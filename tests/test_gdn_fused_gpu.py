"""The GDN fused ops (csrc/cuda/gdn_fused.cu) on the GPU: the prologue and the gated-RMSNorm epilogue
against the torch path they replace (models/gdn.py: causal_conv, gates, gated_rms_norm, the conv
window cat of models/hybrid.py) on the same inputs, outputs poisoned with NaN first; bad inputs
refused with a clear message; a bf16 hybrid engine with the ops vs without them; a graphed step that
replays them. Skipped on CPU.

Tolerance rule: the kernels round to bf16 exactly where the torch path does and accumulate in fp32,
so only the fp32 summation order (and fma contraction) differs. That moves an fp32 intermediate by a
few fp32 ulps (~2^-22 relative), which changes a following bf16 rounding only when the value lies
that close to a rounding boundary: rarely (well under 1% of elements), and then by one bf16 ulp per
rounding downstream of the reordered sum. So: the conv window (a copy) is bit-equal; mixed (conv ->
bf16 -> silu -> bf16) at most 2 ulps; beta (sigmoid -> bf16) at most 1 ulp; the norm (normed -> bf16,
w * normed -> bf16, * silu(z) -> bf16) at most 3 ulps; in each, at most 1% of the elements differ at
all. g is fp32 from the same fp32 formula: 1e-6 relative. A kernel that skipped or added a rounding
differs on a large share of elements and fails the 1% rule."""
import dataclasses

import pytest
import torch

from conftest import refused_in_subprocess, requires_gpu
from gdn_fused_checks import check_gated_norm, check_prologue, gdn_block, norm_inputs
from test_engine_helpers import fresh_seed
from specpilot.kernels import gdn_fused

pytestmark = requires_gpu


@pytest.mark.parametrize("t", [1, 4, 16, 64])
@pytest.mark.parametrize("nk, hv, dk, dv, width, param_dtype", [
    (16, 32, 128, 128, 4, torch.bfloat16),      # Qwen3.5-9B
    (16, 32, 128, 128, 4, torch.float32),
    (16, 48, 128, 128, 4, torch.bfloat16),     # Qwen3.5-27B: three value heads per key head
    (2, 4, 64, 64, 3, torch.bfloat16),
    (2, 2, 64, 32, 2, torch.float32)])
def test_prologue_equals_torch_path(t, nk, hv, dk, dv, width, param_dtype):
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    c = 2 * nk * dk + hv * dv
    inputs = gdn_block(t, c, hv, width, param_dtype, gen, "cuda")
    qkv, b, a, conv_state, conv_weight, A_log, dt_bias = inputs
    assert gdn_fused.takes_prologue(qkv, conv_state, conv_weight, (A_log, dt_bias))
    window = torch.full((c, width - 1 + t), float("nan"), device="cuda", dtype=torch.bfloat16)
    mixed = torch.full((t, c), float("nan"), device="cuda", dtype=torch.bfloat16)
    g, beta = (torch.full((t, hv), float("nan"), device="cuda") for _ in range(2))
    torch.ops.specpilot.gdn_prologue(qkv[0], b[0], a[0], conv_state[0], conv_weight, A_log, dt_bias, window, mixed,
                                     g, beta)
    check_prologue((window, mixed, g, beta), inputs)


@pytest.mark.parametrize("rows, hv, dv", [(1, 32, 128), (4, 32, 128), (16, 32, 128), (16, 48, 128), (6, 4, 64), (3, 2, 80)])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_gated_norm_equals_torch_path(rows, hv, dv, weight_dtype):
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    x, z, weight = norm_inputs(rows, hv, dv, weight_dtype, gen, "cuda")
    out = torch.full((rows, hv * dv), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.ops.specpilot.gdn_gated_norm(x.view(rows, hv * dv), z, weight, 1e-6, out)
    check_gated_norm(out, x, z, weight, 1e-6)
    wrapped = gdn_fused.gated_norm(x[None], z.reshape(1, rows, hv, dv), weight, 1e-6)
    assert torch.equal(wrapped[0], out.view(rows, hv, dv))


def test_bad_inputs_are_refused():
    refused_in_subprocess("""
        qkv, b, a, cs, cw = bf(4, 96), bf(4, 4), bf(4, 4), bf(96, 3), bf(96, 4)
        p = torch.zeros(4, device="cuda")
        win, mixed, g, beta = bf(96, 7), bf(4, 96), torch.zeros(4, 4, device="cuda"), torch.zeros(4, 4, device="cuda")
        x, out, w = bf(4, 128), bf(4, 128), torch.ones(32, device="cuda")
        pro = lambda **kw: ops.gdn_prologue(*[kw.get(k, v) for k, v in dict(
            qkv=qkv, b=b, a=a, cs=cs, cw=cw, A_log=p, dt_bias=p, win=win, mixed=mixed, g=g, beta=beta).items()])
        """, [
        ("pro(cw=bf(96, 5))", r"conv width must be 2, 3 or 4, got 5"),
        ("pro(win=bf(96, 6))", r"window must have shape \[96, 7\], got \[96, 6\]"),
        ("pro(g=g.double())", r"g must be Float, got Double"),
        ("pro(A_log=p.half())", r"A_log must be Float or BFloat16, got Half"),
        ("pro(b=bf(4, 8)[:, ::2])", r"b must have unit column stride"),
        ("pro(qkv=qkv.cpu())", r"qkv must be a CUDA tensor"),
        ("pro(cs=bf(96, 2))", r"conv_state must have shape \[96, 3\]"),
        ("ops.gdn_gated_norm(x, x, bf(48), 1e-6, out)", r"128 columns, not a multiple of head_dim 48"),
        ("ops.gdn_gated_norm(x, x, w, 1e-6, out.float())", r"out must be BFloat16, got Float"),
        ("ops.gdn_gated_norm(x, bf(4, 64), w, 1e-6, out)", r"z must have shape \[4, 128\]"),
        ("ops.gdn_gated_norm(x, x, w, 0.0, out)", r"eps must be positive"),
    ])


def kernel_hybrid():
    """tiny-qwen3.5 with GDN head dims the chain kernel takes (so the prologue runs)."""
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = dataclasses.replace(HYBRID_PRESETS["tiny-qwen3.5"], linear_key_head_dim=64, linear_value_head_dim=64)
    return random_target(cfg, "cuda", torch.bfloat16, seed=fresh_seed())


def count_calls(monkeypatch) -> dict:
    calls = {"prologue": 0, "gated_norm": 0}
    for name in calls:
        def counted(*args, _real=getattr(gdn_fused, name), _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(gdn_fused, name, counted)
    return calls


def without_fused_ops(monkeypatch):
    """Within the monkeypatch's scope: the torch prologue / epilogue (the chain kernel still runs)."""
    monkeypatch.setattr(gdn_fused, "takes_prologue", lambda *a: False)
    monkeypatch.setattr(gdn_fused, "takes_gated_norm", lambda *a: False)


@torch.inference_mode()
def test_engine_with_fused_ops_equals_torch_path(monkeypatch):
    """A bf16 hybrid on the GPU, everything else equal (GEMMs, chain kernel): with the fused ops vs the
    torch path, the first GDN layer's conv windows are bit-equal (its input is), the verify logits
    and recurrent states agree to bf16 rounding, a partial commit keeps the same conv state, and
    greedy AR tokens agree up to a near tie, also with fused_kernels off altogether (bf16 roundings of
    a random tiny model's flat logits: one fresh seed forked at its third token)."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine

    target = kernel_hybrid()
    prompt = list(range(5, 45))
    fused, torch_ops, off = (Engine(target, None, max_seq_len=256, config=EngineConfig(fused_kernels=on))
                             for on in (True, True, False))
    calls = count_calls(monkeypatch)
    results = []
    for engine in (fused, torch_ops):
        if engine is torch_ops:
            assert calls["prologue"] > 0 and calls["gated_norm"] > 0, calls
            without_fused_ops(monkeypatch)
            seen = dict(calls)
        ids = torch.tensor([prompt], device="cuda")
        engine.runner.prefill(ids, with_features=False)
        logits, _ = engine.runner.target_step(ids[:, :16], len(prompt), with_features=False)
        windows, snapshots = engine.cache.windows[0].clone(), engine.cache.snapshots[0].clone()
        engine.cache.commit(len(prompt) + 5)                                   # accept 5 of the 16
        results.append((logits.float(), windows, snapshots, [c.clone() for c in engine.cache.conv]))
    assert calls == seen, "the torch run called a fused op"
    (lf, wf, sf, cf), (lt, wt, st, ct) = results
    torch.testing.assert_close(lf, lt, atol=0.05 * float(lt.abs().amax()), rtol=0.02)
    assert torch.equal(wf, wt) and torch.equal(cf[0], ct[0])
    torch.testing.assert_close(sf, st, atol=0.02 * float(st.abs().amax()), rtol=0.02)
    tokens = torch_ops.generate_ar(prompt, 24).tokens[:8]
    reference = [torch_ops.runner.prefill(torch.tensor([prompt + tokens[:i]], device="cuda"), with_features=False)[0]
                 [0, -1].float() for i in range(len(tokens))]          # the torch path's logits at each token
    monkeypatch.undo()
    for engine in (fused, off):
        same_or_near_tie(engine.generate_ar(prompt, 24).tokens[:8], tokens, reference,
                         tol=0.05 * float(lt.abs().amax()))


def same_or_near_tie(ours: list, tokens: list, reference: list, tol: float) -> None:
    """Greedy tokens equal the reference's up to where the two may fork: a token whose reference logit
    is within `tol` (the logits' agreement bound above) of the reference's own choice."""
    for i, (a, b) in enumerate(zip(ours, tokens)):
        if a != b:
            gap = float(reference[i][b] - reference[i][a])
            assert gap <= tol, f"token {i}: ours {a}, the torch path's {b}, which its logits prefer by {gap:.4f} > {tol:.4f}"
            return
    assert len(ours) == len(tokens)


@torch.inference_mode()
def test_graphed_steps_replay_the_fused_ops(monkeypatch):
    """A graphed AR / verify step captures the fused ops once and replays them (no Python call after
    capture), bit-equal to the eager step at the same kv span, conv windows included."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.engine.graphs import kv_bucket

    target = kernel_hybrid()
    graphed, eager = (Engine(target, None, max_seq_len=300, config=EngineConfig(cuda_graphs=on))
                      for on in (True, False))
    calls = count_calls(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    vocab, start = target.config.vocab_size, 40
    prompt = torch.randint(0, vocab, (1, start), device="cuda", generator=gen)
    for engine in (graphed, eager):
        engine.runner.prefill(prompt, with_features=False)
    assert graphed.use_graphs and graphed.runner.hybrid is not None
    captured, replays = set(), 0
    for step, t in enumerate((1, 16, 1, 16, 4, 1)):
        ids = torch.randint(0, vocab, (1, t), device="cuda", generator=gen)
        span = kv_bucket(start + t, graphed.runner.capacity)
        before = dict(calls)
        ours, _ = graphed.runner.target_step(ids, start, with_features=False)
        if (t, span) in captured:
            assert calls == before, f"step {step}: a replay ran the fused ops' Python"
            replays += 1
        else:
            assert calls["prologue"] > before["prologue"] and calls["gated_norm"] > before["gated_norm"]
            captured.add((t, span))
        ref, _ = eager.runner.forward_target(ids, torch.arange(start, start + t, device="cuda"), span, False)
        assert torch.equal(ours, ref), f"step {step} (T={t}): logits differ"
        for j in range(len(graphed.cache.conv)):
            assert torch.equal(graphed.cache.windows[j], eager.cache.windows[j]), f"step {step}: conv window"
            assert torch.equal(graphed.cache.snapshots[j], eager.cache.snapshots[j]), f"step {step}: states"
        start += 1 + step % t if t > 1 else 1                                  # accept a prefix
    assert replays >= 2 and {t for t, _ in captured} == {1, 4, 16}
    for engine in (graphed, eager):
        engine.cache.commit(start)
    for a, b in zip(graphed.cache.state + graphed.cache.conv, eager.cache.state + eager.cache.conv):
        assert torch.equal(a, b)
