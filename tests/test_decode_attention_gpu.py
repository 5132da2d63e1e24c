"""specpilot::decode_attention on the GPU (csrc/cuda/decode_attention.cu) against an fp64 softmax on
fresh random bf16 inputs: T in {1, 3, 16, 32}, D in {64, 128}, g in {1, 4, 8}, spans 256 / 1024
with `last` well below the span, causal (target) and non-causal (drafter) rows, all-masked rows,
NaN in every cache slot no row sees, strided views, every split path (direct, several, many),
PDL on and off, CUDA-graph replay with new `last` values; then the engine: a tiny bf16 pair whose
logits with the kernel stay as close to the fp32 model as SDPA's, with the same greedy tokens.

Tolerance (kernel vs fp64): |out - ref| <= 2^-8 (|ref| + sum_j p_j |v_j|) + 1e-6. Why: the output
is rounded to bf16 (relative 2^-9 of |ref|) and each probability p_j is rounded to bf16 before
the P.V product (relative 2^-9 of p_j, so at most 2^-9 sum_j p_j |v_j| in the output); fp32
scores, exp2 and accumulation add ~1e-6 relative. The bound takes twice that.
Runs on the H200 (`python -m pytest -q tests/test_decode_attention_gpu.py`); skipped on CPU."""

import pytest
import torch
from conftest import refused_in_subprocess, requires_gpu, configured

from specpilot import _ext

pytestmark = [requires_gpu, pytest.mark.gpu, pytest.mark.usefixtures("cuda_build")]


@pytest.fixture
def gen(cuda_gen):
    return cuda_gen


def reference(q, k, v, last, scale):
    """fp64 softmax(q k^T * scale) v over slots j <= last[t] -> (out [B, T, Hq*D], sum_j p_j |v_j|)."""
    b, hq, t, d = q.shape
    hkv, span = k.shape[1], k.shape[2]
    g = hq // hkv
    kk = k.double().repeat_interleave(g, dim=1)                    # q head h uses KV head h // g
    vv = v.double().repeat_interleave(g, dim=1)
    visible = torch.arange(span, device=q.device)[None, :] <= last[:, None]     # [T, span]
    scores = (q.double() @ kk.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    seen = visible.any(dim=1)[None, None, :, None]                 # rows with at least one key
    probs = torch.softmax(scores.masked_fill(~seen, 0.0), dim=-1) * seen
    vv = torch.nan_to_num(vv) * visible.any(dim=0)[None, None, :, None]          # unseen slots hold NaN
    out = probs @ vv
    mag = probs @ vv.abs()
    flat = lambda x: x.transpose(1, 2).reshape(b, t, hq * d)
    return flat(out), flat(mag)


def assert_close_to_reference(out, q, k, v, last, scale):
    ref, mag = reference(q, k, v, last, scale)
    assert not torch.isnan(out).any(), "NaN in the output (a poisoned slot leaked, or a row was not written)"
    err = (out.double() - ref).abs()
    tol = 2.0 ** -8 * (ref.abs() + mag) + 1e-6
    worst = (err - tol).max()
    assert worst <= 0, f"max excess over tolerance {float(worst):.3g}, max err {float(err.max()):.3g}"


def make_inputs(gen, b, hq, hkv, t, d, slots, span, last, q_scale=2.0):
    """Fresh bf16 q / cache; every slot >= max(last) + 1 and >= span holds NaN (must not leak)."""
    q = (torch.randn(b, hq, t, d, generator=gen, device="cuda") * q_scale).to(torch.bfloat16)
    k = torch.randn(b, hkv, slots, d, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(b, hkv, slots, d, generator=gen, device="cuda").to(torch.bfloat16)
    unseen = max(int(last.max()) + 1, 0)
    k[:, :, unseen:] = float("nan")
    v[:, :, unseen:] = float("nan")
    return q, k[:, :, :span], v[:, :, :span]


def run_kernel(q, k, v, last, scale, splits):
    from specpilot.kernels.decode_attention import default_splits

    b, hq, t, d = q.shape
    if splits is None:
        splits = default_splits(b, k.shape[1], (hq // k.shape[1]) * t, k.shape[2],
                                torch.cuda.get_device_properties(0).multi_processor_count)
    outs = []
    for writes_at_last in (False, True):    # with no writer before it, loading keys early changes no bit
        out = torch.full((b, t, hq * d), float("nan"), dtype=torch.bfloat16, device="cuda")
        ws = torch.full((splits, b * t * hq, d + 1), float("nan"), dtype=torch.float32, device="cuda")
        _ext.ops().decode_attention(q, k, v, last.contiguous(), k.shape[2], d ** -0.5, out, ws, writes_at_last)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "writes_at_last changed the output"
    return outs[0]


def causal_last(start, t):
    return torch.arange(start, start + t, device="cuda")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2), (32, 8)])
@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("span", [256, 1024])
@pytest.mark.parametrize("splits", [None, 1, 7])
def test_causal_rows_match_fp64(gen, d, hq, hkv, t, span, splits):
    start = int(torch.randint(span // 3, span // 2, (1,)))       # last well below the span
    last = causal_last(start, t)
    q, k, v = make_inputs(gen, 1, hq, hkv, t, d, span, span, last)
    out = run_kernel(q, k, v, last, d ** -0.5, splits)
    assert_close_to_reference(out, q, k, v, last, d ** -0.5)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("g", [1, 4])
def test_drafter_rows_noncausal_and_batch(gen, d, g):
    """Every row sees up to the block's last slot (DFlash drafter); batch 2; cache longer than span."""
    t, span, slots = 16, 512, 640
    last = torch.full((t,), 300, device="cuda")
    q, k, v = make_inputs(gen, 2, 2 * g, 2, t, d, slots, span, last)
    for splits in (None, 1, 5):
        assert_close_to_reference(run_kernel(q, k, v, last, d ** -0.5, splits), q, k, v, last, d ** -0.5)


@pytest.mark.parametrize("d", [64, 128])
def test_many_rows_and_edges(gen, d):
    """T=32 with g=8 (256 rows: 4 row blocks per KV head); last past the span (clamped: the trash
    slot of padded rows); rows that see only slot 0; a single key."""
    t = 32
    last = torch.randint(0, 700, (t,), device="cuda")
    last[0], last[1], last[2] = 0, 5000, 1                       # slot 0 only; beyond the span; two keys
    q, k, v = make_inputs(gen, 1, 16, 2, t, d, 1024, 1024, torch.tensor([1023], device="cuda"))
    for splits in (None, 1, 3, 128):
        assert_close_to_reference(run_kernel(q, k, v, last, d ** -0.5, splits), q, k, v, last, d ** -0.5)
    one = torch.zeros(1, dtype=torch.long, device="cuda")
    q1, k1, v1 = make_inputs(gen, 1, 4, 1, 1, d, 256, 256, one)
    assert_close_to_reference(run_kernel(q1, k1, v1, one, d ** -0.5, None), q1, k1, v1, one, d ** -0.5)


@pytest.mark.parametrize("splits", [1, 4])
def test_all_masked_rows_are_zero(gen, splits):
    """Rows with last < 0 see nothing: zeros (not NaN), whether or not other rows see keys."""
    d, t = 128, 3
    for last in (torch.tensor([-1, -5, -1], device="cuda"), torch.tensor([-1, 40, -3], device="cuda")):
        q, k, v = make_inputs(gen, 1, 8, 2, t, d, 256, 256, last)
        out = run_kernel(q, k, v, last, d ** -0.5, splits)
        masked = (last < 0).nonzero().flatten()
        assert torch.equal(out[:, masked], torch.zeros_like(out[:, masked]))
        assert_close_to_reference(out, q, k, v, last, d ** -0.5)


def test_strided_q_and_deterministic(gen):
    """q as a head slice of a bigger [B, Hq + Hkv, T, D] tensor (as the target's fused q/k), and as a
    transposed [B, T, Hq, D] view (as the drafter's); two runs bit-identical."""
    from specpilot.kernels.decode_attention import decode_attention

    d, t = 128, 16
    last = causal_last(400, t)
    qk = (torch.randn(1, 40, t, d, generator=gen, device="cuda") * 2).to(torch.bfloat16)
    _, k, v = make_inputs(gen, 1, 32, 8, t, d, 1024, 1024, last)
    q = qk[:, :32]
    a = decode_attention(q, k, v, last, d ** -0.5)
    assert_close_to_reference(a, q, k, v, last, d ** -0.5)
    assert torch.equal(a, decode_attention(q, k, v, last, d ** -0.5))
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)           # strides (T*Hq*D, D, Hq*D, 1)
    assert torch.equal(decode_attention(qt, k, v, last, d ** -0.5), a)


@pytest.mark.parametrize("t", [1, 16])
def test_keys_written_just_before_are_seen(gen, t):
    """The target's chain in one CUDA graph with PDL: qk_norm_rope_cache writes this step's keys at
    `positions` (poisoned with NaN before each replay), then the attention with writes_at_last, which
    loads the older keys before its PDL wait. Replayed over new positions and projections, each
    output equals the attention run again on its own afterwards, bit for bit: no fresh key was
    read before the rope kernel wrote it."""
    from specpilot.kernels.decode_attention import decode_attention
    from specpilot.ops.norm_rope import qk_norm_rope_cache

    hq, hkv, d, slots = 32, 8, 128, 1024
    bf = lambda *shape: torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
    kc, vc = bf(1, hkv, slots, d), bf(1, hkv, slots, d)
    qkv, qw, kw, cos, sin = bf(1, t, hq + 2 * hkv, d), bf(d), bf(d), bf(slots, d), bf(slots, d)
    positions = torch.arange(100, 100 + t, device="cuda")

    def step():
        q, k, v = qkv.split((hq, hkv, hkv), dim=2)
        qr = qk_norm_rope_cache(q, k, v, qw, kw, cos[positions].contiguous(), sin[positions].contiguous(),
                                positions, 1e-6, kc, vc)
        return qr, decode_attention(qr, kc, vc, positions, d ** -0.5, writes_at_last=True)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, out = step()
    for start in (5, 300, slots - t, 37):
        positions.copy_(torch.arange(start, start + t, device="cuda"))
        qkv.copy_(bf(1, t, hq + 2 * hkv, d))
        kc[:, :, start:start + t] = float("nan")
        vc[:, :, start:start + t] = float("nan")
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"start {start}: a poisoned (not yet written) key was read"
        assert torch.equal(out, decode_attention(q_out, kc, vc, positions, d ** -0.5)), f"start {start}"


@pytest.mark.parametrize("hq,hkv,d,norm", [(32, 8, 128, True), (8, 2, 64, True), (32, 8, 128, False)])
def test_rope_prologue_equals_rope_kernel_then_attention(gen, hq, hkv, d, norm):
    """decode_attention_rope (the one-token step's rope / cache write inside the attention kernel)
    against qk_norm_rope_cache then decode_attention: the same output and cache bits, batch 1 and 2,
    the new key at the end of the span, at slot 0, at the last slot, and past the span (written,
    not seen); with per-head norms (Qwen3) and without (LLaMA)."""
    from specpilot.kernels.decode_attention import decode_attention, decode_attention_rope
    from specpilot.ops.norm_rope import qk_norm_rope_cache

    slots = 1024
    bf = lambda *shape: torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
    cos_table, sin_table = bf(slots, d), bf(slots, d)
    for b, pos, kv_len in ((1, 600, 601), (2, 37, 38), (1, 0, 1), (1, slots - 1, slots), (1, 1000, 700)):
        kc, vc = bf(b, hkv, slots, d), bf(b, hkv, slots, d)
        kc2, vc2 = kc.clone(), vc.clone()
        qkv = bf(b, 1, (hq + 2 * hkv) * d)
        q_weight, k_weight = (bf(d), bf(d)) if norm else (None, None)
        positions = torch.tensor([pos], device="cuda")
        cos, sin = cos_table[positions], sin_table[positions]
        q, k, v = qkv.view(b, 1, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=2)
        q = qk_norm_rope_cache(q, k, v, q_weight, k_weight, cos, sin, positions, 1e-6, kc, vc)
        ref = decode_attention(q, kc[:, :, :kv_len], vc[:, :, :kv_len], positions, d ** -0.5)
        out = decode_attention_rope(qkv, q_weight, k_weight, cos, sin, positions, 1e-6, kc2, vc2, kv_len,
                                    d ** -0.5, hq)
        assert torch.equal(out, ref), f"b={b} pos={pos} kv_len={kv_len}: output differs"
        assert torch.equal(kc2, kc) and torch.equal(vc2, vc), f"b={b} pos={pos}: cache differs"


def test_engine_rope_in_attention_is_bit_identical(fresh_seed, monkeypatch):
    """The engine's one-token steps with the rope / cache write inside the attention kernel (the
    default) and as its own kernel: identical logits over 32 teacher-forced graphed AR steps, then a
    verify and a draft step."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models import target as target_mod

    target, drafter = tiny_bf16_pair(fresh_seed)
    g = torch.Generator().manual_seed(fresh_seed)
    prompt = torch.randint(0, 318, (300,), generator=g).tolist()
    forced = torch.randint(0, 318, (32,), generator=g).tolist()
    calls = []
    real = target_mod.decode_attention_rope
    monkeypatch.setattr(target_mod, "decode_attention_rope", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = {}
    for fused in (False, True):
        config = EngineConfig(attention="specpilot", attention_fused_rope=fused)
        results[fused] = forced_logits(Engine(target, drafter, max_seq_len=400, config=config), prompt, forced, 8)
        assert bool(calls) == fused, f"fused rope {fused}: decode_attention_rope called {len(calls)} times"
    for name, a, b in zip(("ar", "verify", "draft"), results[False], results[True]):
        assert torch.equal(a, b), f"{name}: logits differ with the rope inside the attention kernel"


@pytest.mark.parametrize("pdl", [False, True])
def test_graph_replay_follows_last(gen, pdl):
    """One captured call (fixed span 1024 and grid) replayed with new `last` values: contexts from 1
    to 1024 keys, causal and flat; every replay matches the reference. PDL on and off."""
    from specpilot.kernels.decode_attention import decode_attention

    d, t = 128, 16
    with configured(attention_pdl=pdl):
        q, k, v = make_inputs(gen, 1, 32, 8, t, d, 1024, 1024, torch.tensor([1023], device="cuda"))
        last = causal_last(100, t)
        decode_attention(q, k, v, last, d ** -0.5)                # warm-up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode_attention(q, k, v, last, d ** -0.5)
        for new in (causal_last(0, t) - 15, causal_last(0, t), causal_last(600, t), causal_last(1008, t),
                    torch.full((t,), 37, device="cuda"), causal_last(2000, t)):
            last.copy_(new)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_close_to_reference(out, q, k, v, new, d ** -0.5)


def test_rejects_bad_arguments():
    setup = """
    q, k = bf(1, 8, 1, 128), bf(1, 2, 256, 128)
    last = torch.zeros(1, dtype=torch.long, device="cuda")
    out = torch.empty(1, 1, 1024, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(4, 8, 129, dtype=torch.float32, device="cuda")
    op = ops.decode_attention
    """
    refused_in_subprocess(setup, [
        ("op(q[..., :96], k[..., :96], k[..., :96], last, 256, 0.1, out, ws)", "head dim"),
        ("op(q, k, k, last, 257, 0.1, out, ws)", "span"),
        ("op(q, k, k, last.int(), 256, 0.1, out, ws)", "last"),
        ("op(q, k, k, last, 256, 0.1, out, ws[:, :4])", "workspace"),
        ("ops.decode_attention_rope(bf(1, 1, 11 * 128), None, None, bf(128), bf(128), last, 1e-6, k, k.clone(), "
         "256, 0.1, out, ws)", "qkv has"),
        ("ops.decode_attention_rope(bf(1, 1, 12 * 128), bf(128), bf(128), bf(64), bf(128), last, 1e-6, k, "
         "k.clone(), 256, 0.1, out, ws)", "cos must be"),
        ("op(bf(1, 8, 33, 128), k, k, torch.zeros(33, dtype=torch.long, device='cuda'), 256, 0.1, out, ws)",
         "T must be"),
    ])


# -- engine level -----------------------------------------------------------------------------------

def tiny_bf16_pair(seed):
    """tiny-qwen3 widened to a kernel shape (Hq 8, Hkv 2, D 64, as the zoo target), bf16 on CUDA."""
    from dataclasses import replace

    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    cfg = replace(TARGET_PRESETS["tiny-qwen3"], hidden_size=128, num_heads=8, num_kv_heads=2, head_dim=64,
                  intermediate_size=256)
    target = random_target(cfg, "cuda", torch.bfloat16, seed)
    drafter = random_drafter(drafter_config_for(cfg, 2, 8, [0, 2]), target, seed + 1)
    return target, drafter


def forced_logits(engine, prompt, forced, block):
    """Prefill, then the graphed AR step fed `forced` tokens one by one (teacher forcing), then one
    graphed verify (T = block) and one graphed draft step at the end: stacked logits."""
    runner = engine.runner
    ids = torch.tensor([prompt], device="cuda")
    logits, feats = runner.prefill(ids, with_features=True)
    rows = [logits[0, -1].float().clone()]
    pos = len(prompt)
    for tok in forced:
        step, _ = runner.target_step(torch.tensor([[tok]], device="cuda"), pos, with_features=False)
        rows.append(step[0, -1].float().clone())
        pos += 1
    blk = torch.tensor([forced[-block:]], device="cuda")
    verify, vfeats = runner.target_step(blk, pos, with_features=True)
    draft = runner.draft_step(vfeats.clone(), pos, blk, pos + block - 1, block)
    return torch.stack(rows), verify[0].float().clone(), draft[0].float().clone()


def test_engine_kernel_vs_sdpa_bf16(fresh_seed, monkeypatch):
    """Teacher-forced over 32 AR steps, a verify and a draft step (all graphed): the kernel's logits
    are within 2x SDPA's own distance to the fp32 model (+0.02), and the greedy token
    equals SDPA's wherever SDPA's top-2 margin exceeds that distance (a bf16 near-tie otherwise)."""
    import copy

    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.kernels import decode_attention as kernel_mod

    target, drafter = tiny_bf16_pair(fresh_seed)
    g = torch.Generator().manual_seed(fresh_seed)
    prompt = torch.randint(0, 318, (300,), generator=g).tolist()     # context ~300-340 in a 512 span
    block = 8
    results = {}
    calls = []
    real = kernel_mod.decode_attention
    monkeypatch.setattr(kernel_mod, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    sdpa, ours = EngineConfig(attention="sdpa"), EngineConfig(attention="specpilot")
    e = Engine(target, drafter, max_seq_len=400, config=sdpa)
    forced = [int(torch.argmax(e.runner.prefill(torch.tensor([prompt], device="cuda"), False)[0][0, -1]))]
    pos = len(prompt)
    for _ in range(31):                                          # SDPA's own greedy continuation
        step, _ = e.runner.target_step(torch.tensor([[forced[-1]]], device="cuda"), pos, with_features=False)
        forced.append(int(torch.argmax(step[0, -1])))
        pos += 1
    results["sdpa"] = forced_logits(Engine(target, drafter, max_seq_len=400, config=sdpa), prompt, forced,
                                         block)
    assert not calls
    results["specpilot"] = forced_logits(Engine(target, drafter, max_seq_len=400, config=ours), prompt, forced,
                                         block)
    assert calls, "the specpilot backend never called the kernel"
    t32 = copy.deepcopy(target).float()
    d32 = copy.deepcopy(drafter)
    d32._target = [t32]
    d32.float()
    results["fp32"] = forced_logits(Engine(t32, d32, max_seq_len=400, config=sdpa), prompt, forced, block)
    for i, name in enumerate(("ar", "verify", "draft")):
        ref, eff, ker = results["fp32"][i], results["sdpa"][i], results["specpilot"][i]
        noise = float((eff - ref).abs().max())
        diff = float((ker - eff).abs().max())
        assert float((ker - ref).abs().max()) <= 2 * noise + 0.02, f"{name}: kernel {diff:.3g} vs SDPA noise {noise:.3g}"
        if name == "ar":
            top2 = eff.topk(2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > 2 * (noise + diff)
            assert torch.equal(ker.argmax(-1)[clear], eff.argmax(-1)[clear])
            assert clear.float().mean() > 0.5, "too many near-ties to say anything"
