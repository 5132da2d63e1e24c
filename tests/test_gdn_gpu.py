"""The Gated DeltaNet chain kernel (csrc/cuda/gdn_chain.cu) on the GPU: against the torch reference
(models/gdn.py) in fp32 on the same inputs, for decode (T = 1) and verify blocks, both key head dims,
grouped value heads; outputs poisoned with NaN first; bad inputs refused; then a tiny hybrid engine
in bf16 with the kernel on vs off. Skipped on CPU.

Tolerance: fp32 throughout with another summation order (states: 1e-4 relative to their scale after
up to 64 rank-1 updates), then one bf16 rounding of the output (2^-8 relative)."""
import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.models import gdn

pytestmark = requires_gpu


def inputs(t, nk, hv, dk, dv, g):
    mixed = torch.randn(t, 2 * nk * dk + hv * dv, generator=g, device="cuda").to(torch.bfloat16)
    decay = -torch.rand(t, hv, generator=g, device="cuda") * 2
    beta = torch.rand(t, hv, generator=g, device="cuda").to(torch.bfloat16).float()
    state = torch.randn(hv, dk, dv, generator=g, device="cuda") * 0.1
    return mixed, decay, beta, state


def reference(mixed, nk, dk, decay, beta, state):
    t, hv, dv = mixed.shape[0], state.shape[0], state.shape[2]
    x = mixed.float()[None]
    q, k, v = x.split((nk * dk, nk * dk, hv * dv), dim=-1)
    q, k = (y.reshape(1, t, nk, dk).repeat_interleave(hv // nk, dim=2) for y in (q, k))
    out, _, states = gdn.recurrent_gated_delta_rule(q, k, v.reshape(1, t, hv, dv), decay[None], beta[None],
                                                    state[None], keep_states=True)
    return out[0], states[0]


@pytest.mark.parametrize("t", [1, 2, 16, 64])
@pytest.mark.parametrize("nk, hv, dk, dv", [(4, 8, 64, 64), (16, 32, 128, 128), (16, 48, 128, 128), (2, 2, 128, 96)])
def test_chain_kernel_equals_reference(t, nk, hv, dk, dv):
    from specpilot.kernels.gdn_chain import available

    assert available(), "the extension was built without gdn_chain"
    g = torch.Generator(device="cuda").manual_seed(fresh_seed())
    mixed, decay, beta, state = inputs(t, nk, hv, dk, dv, g)
    states = torch.full((t, hv, dk, dv), float("nan"), device="cuda")
    out = torch.full((t, hv, dv), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.ops.specpilot.gdn_chain(mixed, nk, dk, decay, beta, state, states, out)
    ref_out, ref_states = reference(mixed, nk, dk, decay, beta, state)
    scale = ref_states.abs().amax()
    torch.testing.assert_close(states, ref_states, atol=1e-4 * float(scale), rtol=1e-4)
    torch.testing.assert_close(out.float(), ref_out, atol=1e-3 * float(ref_out.abs().amax()), rtol=2 ** -8)


def test_bad_inputs_are_refused():
    g = torch.Generator(device="cuda").manual_seed(0)
    mixed, decay, beta, state = inputs(4, 2, 4, 64, 64, g)
    states = torch.empty(4, 4, 64, 64, device="cuda")
    out = torch.empty(4, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="key_head_dim must be 64 or 128"):
        torch.ops.specpilot.gdn_chain(mixed, 2, 32, decay, beta, state, states, out)
    with pytest.raises(RuntimeError, match="mixed has .* channels"):
        torch.ops.specpilot.gdn_chain(mixed[:, 1:], 2, 64, decay, beta, state, states, out)
    with pytest.raises(RuntimeError, match="g must be Float"):
        torch.ops.specpilot.gdn_chain(mixed, 2, 64, decay.double(), beta, state, states, out)


def test_engine_with_the_kernel_equals_the_reference(tmp_path):
    """A bf16 hybrid on the GPU: the verify logits with the kernel (fused_kernels on) and with the
    torch reference (off) agree to bf16 rounding, and greedy AR tokens agree."""
    import dataclasses

    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    cfg = dataclasses.replace(HYBRID_PRESETS["tiny-qwen3.5"], linear_key_head_dim=64, linear_value_head_dim=64)
    target = random_target(cfg, "cuda", torch.bfloat16, seed=fresh_seed())
    prompt = list(range(5, 45))
    on, off = Engine(target, None, max_seq_len=256), Engine(target, None, max_seq_len=256,
                                                          config=EngineConfig(fused_kernels=False))
    logits = []
    for engine in (on, off):
        ids = torch.tensor([prompt], device="cuda")
        engine.runner.prefill(ids, with_features=False)
        out, _ = engine.runner.target_step(ids[:, :16], len(prompt), with_features=False)
        logits.append(out.float())
    torch.testing.assert_close(logits[0], logits[1], atol=0.05 * float(logits[1].abs().amax()), rtol=0.02)
    # Greedy tokens agree, or part at a near-tie: random weights give flat logits, and the kernels round
    # differently from torch (fp32 sums in another order), so a flip is allowed only where the two
    # tokens' logits are within 2x the largest logit difference the two paths showed above.
    a, b = on.generate_ar(prompt, 24).tokens[:8], off.generate_ar(prompt, 24).tokens[:8]
    if a != b:
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        fresh = Engine(target, None, max_seq_len=256, config=EngineConfig(fused_kernels=False))
        last, _ = fresh.runner.prefill(torch.tensor([prompt + a[:k]], device="cuda"), with_features=False)
        margin = abs(float(last[0, -1, a[k]]) - float(last[0, -1, b[k]]))
        delta = float((logits[0] - logits[1]).abs().amax())
        assert margin <= 2 * delta, f"tokens part at {k} ({a[k]} vs {b[k]}) with a margin {margin:.4f} > 2 x {delta:.4f}"


def test_zoo_hybrid_pair_passes_the_verdict_in_bf16():
    """The trained hybrid pair on the GPU in bf16 (the chain kernel on): token-forced against the
    target's own greedy AR under the referee rule, our speculative output included."""
    from specpilot import settings
    from specpilot.engine import Engine
    from specpilot.models import load_pair
    from specpilot.models.prompts import encode_prompt, read_prompts
    from specpilot.verify.forcing import token_force
    from specpilot.verify.stock import load_stock
    from specpilot.verify.target_greedy import TARGET_GREEDY

    zoo = settings.get().zoo
    if not (zoo / "hybrid-tiny").is_dir():
        pytest.skip(f"no hybrid-tiny pair under {zoo}")
    tdir, ddir = zoo / "hybrid-tiny", zoo / "hybrid-tiny-dflash-b16"
    target, drafter, tok = load_pair(tdir, ddir, device="cuda", dtype=torch.bfloat16)
    rows = read_prompts(zoo / "prompts" / "humaneval.jsonl", limit=4)
    prompts = [encode_prompt(tok, row) for row in rows]
    engine = Engine(target, drafter, max_seq_len=1024)
    report = token_force(engine, load_stock(tdir, ddir, "cuda", torch.bfloat16), prompts, 128,
                         stop_ids=target.eos_token_ids)
    assert report.reference == TARGET_GREEDY
    assert report.passed and report.reasons == [], report.summary()
