"""fused_ops on the CPU: the eager references equal the models' previous formulas bit for bit (fp32 and
bf16), op by op and through whole target / drafter forwards (logits, features, K/V caches).
The CUDA kernels are checked against these references in test_fused_ops_gpu.py."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from conftest import configured

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine.cache import KVCache
from specpilot.ops import norm_rope
from specpilot.ops.attention import attend
from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

DTYPES = [torch.float32, torch.bfloat16]


# -- the previous formulas, verbatim (models/layers.py, target.py, drafter.py before fused_ops) --------
def old_norm(norm, x):
    return F.rms_norm(x, (x.shape[-1],), eps=norm.eps) * norm.weight


def old_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def old_mlp(mlp, x):
    gate, up = mlp.gate_up(x).split(mlp.inter, dim=-1)
    return mlp.down(F.silu(gate) * up)


def old_target_qkv(a, qkv, cos, sin, positions, k_cache, v_cache):
    """qkv [B, T, Hq + 2 Hkv, D] -> q [B, Hq, T, D]; k / v into the caches (q and k normed together)."""
    qk, v = qkv[:, :, :a.nq + a.nkv], qkv[:, :, a.nq + a.nkv:]
    if a.q_norm is not None:
        w = torch.cat([a.q_norm.weight.expand(a.nq, a.d), a.k_norm.weight.expand(a.nkv, a.d)])
        qk = F.rms_norm(qk, (a.d,), eps=a.eps) * w
    qk = old_rope(qk.transpose(1, 2), cos, sin)
    k_cache.index_copy_(2, positions, qk[:, a.nq:])
    v_cache.index_copy_(2, positions, v.transpose(1, 2))
    return qk[:, :a.nq]


def old_target_attention(a, x, cos, sin, positions, k_cache, v_cache, kv_len, mask):
    b, t, _ = x.shape
    q = old_target_qkv(a, a.qkv(x).view(b, t, a.nq + 2 * a.nkv, a.d), cos, sin, positions, k_cache, v_cache)
    return a.o(attend(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], mask, a.scale))


def old_project_kv(a, x, cos, sin):
    b, t, _ = x.shape
    k, v = a.kv(x).split(a.nkv * a.d, dim=-1)
    k = old_rope(old_norm(a.k_norm, k.view(b, t, a.nkv, a.d)).transpose(1, 2), cos, sin)
    return k, v.view(b, t, a.nkv, a.d).transpose(1, 2)


def old_draft_attention(a, x, cos, sin, positions, k_cache, v_cache, kv_len, mask):
    b, t, _ = x.shape
    q = old_rope(old_norm(a.q_norm, a.q(x).view(b, t, a.nq, a.d)).transpose(1, 2), cos, sin)
    k, v = old_project_kv(a, x, cos, sin)
    k_cache.index_copy_(2, positions, k)
    v_cache.index_copy_(2, positions, v)
    return a.o(attend(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], mask, a.scale))


def old_block(layer, attention, x, *args):
    x = x + attention(layer.attn, old_norm(layer.attn_norm, x), *args)
    return x + old_mlp(layer.mlp, old_norm(layer.mlp_norm, x))


def layer_args(model, run):
    """Runs `run()` and returns the (cos, sin, positions, kv_len, mask) its first layer was called
    with: the old loop reuses exactly the new forward's tables and mask."""
    seen = {}

    def hook(_module, args):
        seen["args"] = args[2:5] + args[7:9]              # (cos, sin, positions) and (kv_len, mask)

    handle = model.layers[0].register_forward_pre_hook(hook)
    try:
        out = run()
    finally:
        handle.remove()
    return out, seen["args"]


def old_target_forward(model, ids, cache, args, feature_layers):
    cos, sin, positions, kv_len, mask = args
    x, feats, last = model.embed(ids), {}, len(model.layers) - 1
    for i, layer in enumerate(model.layers):
        x = old_block(layer, old_target_attention, x, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
        if i in feature_layers and i != last:
            feats[i] = x
    x = old_norm(model.norm, x)
    if last in feature_layers:
        feats[last] = x
    return model.lm_head(x), torch.cat([feats[i] for i in feature_layers], dim=-1)


def old_write_context(drafter, features, positions, cache):
    h = old_norm(drafter.hidden_norm, drafter.fc(features))
    cos, sin = drafter.rope_cos[positions], drafter.rope_sin[positions]
    for i, layer in enumerate(drafter.layers):
        k, v = old_project_kv(layer.attn, h, cos, sin)
        cache.k[i].index_copy_(2, positions, k)
        cache.v[i].index_copy_(2, positions, v)


def old_forward_block(drafter, block_ids, cache, args):
    cos, sin, positions, kv_len, mask = args
    x = drafter.target.embed(block_ids)
    for i, layer in enumerate(drafter.layers):
        x = old_block(layer, old_draft_attention, x, cos, sin, positions, cache.k[i], cache.v[i], kv_len, mask)
    return drafter.compute_logits(old_norm(drafter.norm, x)[:, 1:])


# -- op by op --------------------------------------------------------------------------------------
def test_kernels_follow_the_config_and_cpu_uses_the_reference():
    assert norm_rope.fused_kernels_enabled()                       # the default config
    with configured(fused_kernels=False):
        assert not norm_rope.fused_kernels_enabled()
    assert norm_rope.fused_kernels_enabled()
    assert norm_rope._kernels_for(torch.zeros(2, dtype=torch.bfloat16)) is None     # CPU tensors


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_and_silu_mul_equal_old_formulas(dtype):
    g = torch.Generator().manual_seed(fresh_seed())
    x, delta = (torch.randn(3, 5, 96, generator=g).to(dtype) for _ in range(2))
    norm = torch.nn.Module()
    norm.eps, norm.weight = 1e-6, (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    total, normed = norm_rope.add_rms_norm(x, delta, norm.weight, norm.eps)
    assert torch.equal(total, x + delta) and torch.equal(normed, old_norm(norm, x + delta))
    same, normed = norm_rope.add_rms_norm(x, None, norm.weight, norm.eps)
    assert same is x and torch.equal(normed, old_norm(norm, x))
    gate_up = torch.randn(2, 7, 2 * 40, generator=g).to(dtype)
    gate, up = gate_up.split(40, dim=-1)
    assert torch.equal(norm_rope.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm,head_dim,tokens", [(True, 64, 5), (False, 128, 3), (True, 16, 1)])
def test_qk_norm_rope_cache_equals_old_target_formula(dtype, qk_norm, head_dim, tokens):
    g = torch.Generator().manual_seed(fresh_seed())
    a = torch.nn.Module()
    a.nq, a.nkv, a.d, a.eps = 4, 2, head_dim, 1e-6
    a.q_norm = a.k_norm = None
    if qk_norm:
        a.q_norm, a.k_norm = torch.nn.Module(), torch.nn.Module()
        a.q_norm.weight, a.k_norm.weight = ((1 + 0.1 * torch.randn(head_dim, generator=g)).to(dtype) for _ in "qk")
    qkv = torch.randn(2, tokens, a.nq + 2 * a.nkv, head_dim, generator=g).to(dtype)
    cos, sin = (torch.randn(tokens, head_dim, generator=g).to(dtype) for _ in "cs")
    positions = torch.randperm(20, generator=g)[:tokens]
    caches = [torch.randn(2, a.nkv, 20, head_dim, generator=g).to(dtype) for _ in range(2)]
    old_caches = [c.clone() for c in caches]
    want_q = old_target_qkv(a, qkv, cos, sin, positions, *old_caches)
    q, k, v = qkv.split((a.nq, a.nkv, a.nkv), dim=2)
    got_q = norm_rope.qk_norm_rope_cache(q, k, v, a.q_norm.weight if qk_norm else None,
                                         a.k_norm.weight if qk_norm else None, cos, sin, positions, a.eps, *caches)
    assert torch.equal(got_q, want_q)
    assert all(torch.equal(c, o) for c, o in zip(caches, old_caches))
    # Context K/V only (the drafter's write_context): no q, same cache writes.
    caches = [c.clone() for c in caches]
    assert norm_rope.qk_norm_rope_cache(None, k, v, None, a.k_norm.weight if qk_norm else None, cos, sin,
                                        positions, a.eps, *caches) is None
    assert all(torch.equal(c, o) for c, o in zip(caches, old_caches))


# -- whole models ----------------------------------------------------------------------------------
def small_configs():
    """The tiny presets (head_dim 16) and a head_dim-64 Qwen3 (the kernels' smallest head size)."""
    qwen64 = replace(TARGET_PRESETS["tiny-qwen3"], hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=256, num_layers=3)
    return {"tiny-qwen3": TARGET_PRESETS["tiny-qwen3"], "tiny-llama": TARGET_PRESETS["tiny-llama"],
            "qwen3-d64": qwen64}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(small_configs()))
def test_models_equal_old_formulas(name, dtype):
    """Target (two steps, features of every layer, the last one final-normed) and drafter
    (write_context + forward_block) against the previous per-layer code, bit for bit."""
    cfg = small_configs()[name]
    seed = fresh_seed()
    target = random_target(cfg, dtype=dtype, seed=seed)
    drafter = random_drafter(drafter_config_for(target.config, num_layers=2, block_size=4,
                                                layer_ids=[0, cfg.num_layers - 1]), target, seed=seed + 1)
    c = target.config
    new, old = (KVCache(c.num_layers, 1, c.num_kv_heads, 40, c.head_dim, "cpu", dtype) for _ in range(2))
    g = torch.Generator().manual_seed(seed)
    layers = tuple(range(c.num_layers))
    with torch.inference_mode():
        for start, t in ((0, 11), (11, 4)):
            ids = torch.randint(0, c.vocab_size, (1, t), generator=g)
            positions = torch.arange(start, start + t)
            (logits, feats), args = layer_args(target, lambda: target(ids, positions, new, start + t, layers))
            want_logits, want_feats = old_target_forward(target, ids, old, args, layers)
            assert torch.equal(logits, want_logits) and torch.equal(feats, want_feats)
        assert all(torch.equal(a, b) for a, b in zip(new.k + new.v, old.k + old.v))

        d = drafter.config
        new, old = (KVCache(d.num_layers, 1, d.num_kv_heads, 40, d.head_dim, "cpu", dtype) for _ in range(2))
        features = torch.randn(1, 9, len(d.target_layer_ids) * d.hidden_size, generator=g).to(dtype)
        ctx = torch.arange(9)
        drafter.write_context(features, ctx, new)
        old_write_context(drafter, features, ctx, old)
        block = torch.randint(0, c.vocab_size, (1, 4), generator=g)
        positions = torch.arange(9, 13)
        logits, args = layer_args(drafter, lambda: drafter.forward_block(block, positions, new, 13))
        assert torch.equal(logits, old_forward_block(drafter, block, old, args))
        assert all(torch.equal(a, b) for a, b in zip(new.k + new.v, old.k + old.v))
