"""The GDN fused ops' dispatch on the CPU (kernels/gdn_fused.py): the predicates name why a block
goes to the torch path, the wrappers refuse what the kernels do not take with that reason, and the
model's torch path (the reference the kernels are held to) is what a CPU forward runs."""
import pytest
import torch

from conftest import configured
from specpilot.kernels import gdn_fused
from specpilot.models import gdn


def block(t=4, c=96, hv=4, width=4, batch=1, dtype=torch.bfloat16):
    qkv = torch.randn(batch, t, c).to(dtype)
    conv_state = torch.randn(batch, c, width - 1).to(dtype)
    conv_weight = torch.randn(c, width).to(dtype)
    return qkv, conv_state, conv_weight


def test_prologue_predicate_names_the_reason():
    qkv, state, weight = block()
    assert "not CUDA" in gdn_fused.why_not_prologue(qkv, state, weight)
    assert not gdn_fused.takes_prologue(qkv, state, weight)
    meta = lambda *xs: tuple(x.to("meta") for x in xs)     # shapes and dtypes without a GPU
    assert "not CUDA" in gdn_fused.why_not_prologue(*meta(qkv, state, weight))


def test_argument_reasons_past_the_device_check(monkeypatch):
    """The shape rules, with the device rule lifted (the CPU cannot hold CUDA tensors)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    qkv, state, weight = block()
    assert gdn_fused.why_not_prologue(qkv, state, weight) is None
    assert "qkv is torch.float32, not bfloat16" in gdn_fused.why_not_prologue(qkv.float(), state, weight)
    assert "conv_weight is torch.float32" in gdn_fused.why_not_prologue(qkv, state, weight.float())
    assert "one sequence" in gdn_fused.why_not_prologue(*block(batch=2))
    assert "1..64 tokens, got 65" in gdn_fused.why_not_prologue(*block(t=65))
    assert "conv width must be one of (2, 3, 4)" in gdn_fused.why_not_prologue(*block(width=5))
    params = (torch.zeros(4, dtype=torch.float16), torch.zeros(4))
    assert "float32 or bfloat16, got torch.float16" in gdn_fused.why_not_prologue(*block(), params)
    x = torch.randn(1, 4, 8, 32).bfloat16()
    assert gdn_fused.why_not_gated_norm(x, x, torch.ones(32)) is None
    assert "must match" in gdn_fused.why_not_gated_norm(x, x[..., :16], torch.ones(32))
    assert "must match" in gdn_fused.why_not_gated_norm(x, x, torch.ones(16))
    assert "got torch.float64" in gdn_fused.why_not_gated_norm(x, x, torch.ones(32, dtype=torch.float64))


def test_predicates_follow_fused_kernels(monkeypatch):
    monkeypatch.setattr(gdn_fused, "available", lambda: True)
    monkeypatch.setattr(gdn_fused, "why_not_prologue", lambda *a: None)
    monkeypatch.setattr(gdn_fused, "why_not_gated_norm", lambda *a: None)
    with configured(fused_kernels=True):
        assert gdn_fused.takes_prologue(None, None, None) and gdn_fused.takes_gated_norm(None, None, None)
    with configured(fused_kernels=False):
        assert not gdn_fused.takes_prologue(None, None, None) and not gdn_fused.takes_gated_norm(None, None, None)


def test_wrappers_refuse_with_the_reason():
    qkv, state, weight = block()
    ab = torch.zeros(1, 4, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gdn prologue kernel: qkv is on cpu, not CUDA"):
        gdn_fused.prologue(qkv, ab, ab, state, weight, torch.zeros(4), torch.zeros(4))
    x = torch.randn(1, 4, 8, 32).bfloat16()
    with pytest.raises(ValueError, match="gdn gated norm kernel: x is on cpu, not CUDA"):
        gdn_fused.gated_norm(x, x, torch.ones(32), 1e-6)


def test_gates_are_the_documented_maps():
    b, a = torch.randn(3, 4), torch.randn(3, 4) * 10
    A_log, dt_bias = torch.rand(4), torch.randn(4)
    beta, g = gdn.gates(b, a, A_log, dt_bias)
    torch.testing.assert_close(beta, 1 / (1 + torch.exp(-b)))
    softplus = torch.where(a + dt_bias > 20, a + dt_bias, torch.log1p(torch.exp(a + dt_bias)))
    torch.testing.assert_close(g, -torch.exp(A_log) * softplus)
    assert g.dtype == torch.float32 and bool((g <= 0).all())


def test_cpu_forward_runs_the_torch_path(monkeypatch):
    """A hybrid on the CPU never reaches the kernels' wrappers (they would raise)."""
    from specpilot.engine.recurrent_state import hybrid_cache
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    def refuse(*args, **kwargs):
        raise AssertionError("a fused GDN kernel was called on the CPU")

    monkeypatch.setattr(gdn_fused, "prologue", refuse)
    monkeypatch.setattr(gdn_fused, "gated_norm", refuse)
    target = random_target(HYBRID_PRESETS["tiny-qwen3.5"], "cpu", torch.bfloat16, seed=3)
    cache = hybrid_cache(target, 1, 64)
    target.ensure_rope(64)
    ids = torch.arange(5, 13)[None]
    logits, _ = target(ids, torch.arange(8), cache, 8)
    assert logits.shape == (1, 8, target.config.vocab_size) and bool(torch.isfinite(logits.float()).all())


class TorchOps:
    """Stand-ins for torch.ops.specpilot's GDN ops, computing each op's contract with the torch path
    (models/gdn.py) on its flat layouts, so that a CPU forward exercises GatedDeltaNet's fused wiring
    (slices, layouts, the cache's buffers and records) against the plain torch path."""

    calls = 0

    def gdn_prologue(self, qkv, b, a, conv_state, conv_weight, A_log, dt_bias, window, mixed, g, beta):
        TorchOps.calls += 1
        window.copy_(torch.cat([conv_state, qkv.t()], dim=-1))
        mixed.copy_(gdn.causal_conv(window[None], conv_weight)[0].t())
        beta_, g_ = gdn.gates(b, a, A_log, dt_bias)
        g.copy_(g_)
        beta.copy_(beta_.float())

    def gdn_chain(self, mixed, nk, dk, g, beta, state, states_out, out):
        t, hv, dv = mixed.shape[0], state.shape[0], state.shape[2]
        q, k, v = mixed[None].split((nk * dk, nk * dk, hv * dv), dim=-1)
        q, k = (y.reshape(1, t, nk, dk).repeat_interleave(hv // nk, dim=2) for y in (q, k))
        o, _, states = gdn.recurrent_gated_delta_rule(q, k, v.reshape(1, t, hv, dv), g[None], beta[None],
                                                      state[None], keep_states=True)
        out.copy_(o[0])
        states_out.copy_(states[0])

    def gdn_gated_norm(self, x, z, weight, eps, out):
        TorchOps.calls += 1
        rows, dv = x.shape[0], weight.shape[0]
        ref = gdn.gated_rms_norm(x.reshape(rows, -1, dv), z.reshape(rows, -1, dv), weight, eps)
        out.copy_(ref.reshape(rows, -1))


def test_fused_wiring_equals_the_torch_path_on_cpu(monkeypatch):
    """GatedDeltaNet's fused branch, with the ops replaced by their torch contracts: prefill, a verify
    block, a partial commit and an AR step give the torch path's logits and committed states. bf16, as
    the kernels take (the chain's output is bf16): the chain's contract normalises q, k in fp32 where
    the torch path does in bf16, so logits and states agree to bf16 rounding; the first GDN layer's
    conv state (a copy of identical inputs) exactly."""
    from specpilot import _ext
    from specpilot.engine.recurrent_state import hybrid_cache
    from specpilot.kernels import gdn_chain
    from specpilot.models.random_ckpt import HYBRID_PRESETS, random_target

    target = random_target(HYBRID_PRESETS["tiny-qwen3.5"], "cpu", torch.bfloat16, seed=11)
    target.ensure_rope(128)
    ids = torch.randint(0, target.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(5))

    def run(fused: bool):
        with monkeypatch.context() as m:
            if fused:
                m.setattr(_ext, "ops", lambda: TorchOps())
                m.setattr(gdn_chain, "takes", lambda *a: True)
                for name in ("takes_prologue", "takes_gated_norm"):
                    m.setattr(gdn_fused, name, lambda *a: True)
                for name in ("why_not_prologue", "why_not_gated_norm"):
                    m.setattr(gdn_fused, name, lambda *a: None)
            cache = hybrid_cache(target, 1, 128)
            cache.reserve(16)                                   # the verify block writes the reserved buffers
            outs = [target(ids[:, :24], torch.arange(24), cache, 24)[0],
                    target(ids[:, 24:40], torch.arange(24, 40), cache, 40)[0],      # verify block, 16 tokens
                    target(ids[:, 30:31], torch.arange(30, 31), cache, 31)[0]]      # commits 30, then AR
            cache.commit(31)
            return outs, [c.clone() for c in cache.conv], [s.clone() for s in cache.state]

    TorchOps.calls = 0
    fused_outs, fused_conv, fused_state = run(True)
    assert TorchOps.calls == 2 * 3 * 3, "the fused branch was not taken in every GDN layer of every forward"
    ref_outs, ref_conv, ref_state = run(False)
    for ours, ref in zip(fused_outs, ref_outs):
        torch.testing.assert_close(ours.float(), ref.float(), atol=0.05 * float(ref.abs().amax()), rtol=0.02)
    assert torch.equal(fused_conv[0], ref_conv[0])
    for ours, ref in zip(fused_conv + fused_state, ref_conv + ref_state):
        torch.testing.assert_close(ours.float(), ref.float(), atol=0.02 * float(ref.abs().amax()), rtol=0.02)
