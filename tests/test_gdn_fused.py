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
