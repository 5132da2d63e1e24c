"""Tensor-name mapping between HF Qwen3.5 / Qwen3-Next hybrid checkpoints and HybridLM's fused modules,
both ways. Qwen3-Next groups its GDN projections per key head (in_proj_qkvz, in_proj_ba): loading
permutes those rows into our layout; its experts load from per-expert or fused tensors.

Fused rows: GDN in_proj = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a], attention qkv =
[q_proj (query | gate per head); k_proj; v_proj], mlp gate_up = [gate_proj; up_proj]; the GDN conv
weight [C, 1, K] is stored as [C, K]. A Qwen3_5ForConditionalGeneration checkpoint keeps the text model
under `model.language_model.`; its vision tower (`model.visual.`) and MTP head (`mtp.`) are not loaded.
"""
from __future__ import annotations

import torch

from .hf_names import finish_head, take
from .hybrid_config import HybridConfig

IGNORED_PREFIXES = ("mtp.", "model.visual.")


def _text_names(hf: dict) -> dict:
    """HF names with the multimodal wrapper's `model.language_model.` turned into `model.`, the
    ignored parts dropped."""
    out = {}
    for name, t in hf.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model."):]
        if not name.startswith(IGNORED_PREFIXES):
            out[name] = t
    return out


def _per_layer(cfg: HybridConfig, i: int) -> list:
    """(HF name, our name) of the tensors a layer maps one to one."""
    src, dst = f"model.layers.{i}.", f"layers.{i}."
    pairs = [(src + "input_layernorm.weight", dst + "attn_norm.weight"),
             (src + "post_attention_layernorm.weight", dst + "mlp_norm.weight")]
    if i in cfg.moe_layers:
        pairs.append((src + "mlp.gate.weight", dst + "mlp.router.weight"))
        if cfg.shared_expert_intermediate_size:
            pairs += [(src + "mlp.shared_expert.down_proj.weight", dst + "mlp.shared.down.weight"),
                      (src + "mlp.shared_expert_gate.weight", dst + "mlp.shared_gate.weight")]
    else:
        pairs.append((src + "mlp.down_proj.weight", dst + "mlp.down.weight"))
    if cfg.layer_types[i] == "linear_attention":
        a = src + "linear_attn."
        pairs += [(a + "A_log", dst + "mixer.A_log"), (a + "dt_bias", dst + "mixer.dt_bias"),
                  (a + "norm.weight", dst + "mixer.norm_weight"),
                  (a + "out_proj.weight", dst + "mixer.out_proj.weight")]
    else:
        a = src + "self_attn."
        pairs += [(a + "q_norm.weight", dst + "mixer.q_norm.weight"),
                  (a + "k_norm.weight", dst + "mixer.k_norm.weight"), (a + "o_proj.weight", dst + "mixer.o.weight")]
    return pairs


def _fused(cfg: HybridConfig, i: int) -> list:
    """(our name, [HF names in row order]) of a layer's fused projections."""
    src, dst = f"model.layers.{i}.", f"layers.{i}."
    if i not in cfg.moe_layers:
        out = [(dst + "mlp.gate_up.weight", [src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"])]
    elif cfg.shared_expert_intermediate_size:
        shared = src + "mlp.shared_expert."
        out = [(dst + "mlp.shared.gate_up.weight", [shared + f"{p}_proj.weight" for p in ("gate", "up")])]
    else:
        out = []
    if cfg.family == "qwen3_next" and cfg.layer_types[i] == "linear_attention":
        return out                                   # qkvz / ba: grouped per key head (_qwen3_next_in_proj)
    if cfg.layer_types[i] == "linear_attention":
        a = src + "linear_attn."
        out.append((dst + "mixer.in_proj.weight", [a + f"in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")]))
    else:
        a = src + "self_attn."
        out.append((dst + "mixer.qkv.weight", [a + f"{p}_proj.weight" for p in "qkv"]))
    return out


def _group_sizes(cfg: HybridConfig):
    """Qwen3-Next's per-key-head groups: qkvz rows [q dk, k dk, v r*dv, z r*dv], ba rows [b r, a r]."""
    r = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return [dk, dk, r * dv, r * dv], [r, r]


def _next_in_proj_from_hf(qkvz, ba, cfg: HybridConfig, i: int, where: str) -> torch.Tensor:
    """Qwen3-Next's grouped in_proj_qkvz / in_proj_ba -> our [q; k; v; z; b; a] rows (a row permutation:
    each output row is computed exactly as before)."""
    nk, hidden = cfg.linear_num_key_heads, qkvz.shape[-1]
    qkvz_sizes, ba_sizes = _group_sizes(cfg)
    if qkvz.shape[0] != nk * sum(qkvz_sizes) or ba.shape[0] != nk * sum(ba_sizes):
        raise ValueError(f"{where}: layer {i} in_proj_qkvz / in_proj_ba have {qkvz.shape[0]} / {ba.shape[0]} rows, "
                         f"expected {nk * sum(qkvz_sizes)} / {nk * sum(ba_sizes)} for the config's GDN heads")
    parts = qkvz.view(nk, -1, hidden).split(qkvz_sizes, dim=1) + ba.view(nk, -1, hidden).split(ba_sizes, dim=1)
    return torch.cat([p.reshape(-1, hidden) for p in parts])


def _next_in_proj_to_hf(in_proj, cfg: HybridConfig):
    nk, hidden = cfg.linear_num_key_heads, in_proj.shape[-1]
    qkvz_sizes, ba_sizes = _group_sizes(cfg)
    parts = in_proj.split([nk * n for n in qkvz_sizes + ba_sizes])
    grouped = [p.view(nk, -1, hidden) for p in parts]
    return (torch.cat(grouped[:4], dim=1).reshape(-1, hidden), torch.cat(grouped[4:], dim=1).reshape(-1, hidden))


def _experts_from_hf(hf: dict, cfg: HybridConfig, i: int, where: str) -> dict:
    """The routed experts, from per-expert tensors (the Hub's form) or transformers' fused 3D ones."""
    e, dst = f"model.layers.{i}.mlp.experts.", f"layers.{i}.mlp."
    if e + "gate_up_proj" in hf:
        return {dst + "gate_up": take(hf, e + "gate_up_proj", where), dst + "down": take(hf, e + "down_proj", where)}
    gate_up = [torch.cat([take(hf, f"{e}{x}.gate_proj.weight", where), take(hf, f"{e}{x}.up_proj.weight", where)])
               for x in range(cfg.num_experts)]
    down = [take(hf, f"{e}{x}.down_proj.weight", where) for x in range(cfg.num_experts)]
    return {dst + "gate_up": torch.stack(gate_up), dst + "down": torch.stack(down)}


def _experts_to_hf(ours: dict, cfg: HybridConfig, i: int) -> dict:
    e, dst = f"model.layers.{i}.mlp.experts.", f"layers.{i}.mlp."
    out = {}
    for x in range(cfg.num_experts):
        gate, up = ours[dst + "gate_up"][x].split(cfg.moe_intermediate_size)
        out[f"{e}{x}.gate_proj.weight"], out[f"{e}{x}.up_proj.weight"] = gate, up
        out[f"{e}{x}.down_proj.weight"] = ours[dst + "down"][x]
    return out


def hybrid_from_hf(hf: dict, cfg: HybridConfig, where: str = "target") -> dict:
    """HF names -> HybridLM names. Leftover tensors are reported as unexpected."""
    hf = _text_names(hf)
    ours = {"embed.weight": take(hf, "model.embed_tokens.weight", where),
            "norm.weight": take(hf, "model.norm.weight", where)}
    for i in range(cfg.num_layers):
        for h, o in _per_layer(cfg, i):
            ours[o] = take(hf, h, where)
        for o, parts in _fused(cfg, i):
            ours[o] = torch.cat([take(hf, h, where) for h in parts])
        if i in cfg.moe_layers:
            ours.update(_experts_from_hf(hf, cfg, i, where))
        if cfg.family == "qwen3_next" and cfg.layer_types[i] == "linear_attention":
            a = f"model.layers.{i}.linear_attn."
            ours[f"layers.{i}.mixer.in_proj.weight"] = _next_in_proj_from_hf(
                take(hf, a + "in_proj_qkvz.weight", where), take(hf, a + "in_proj_ba.weight", where), cfg, i, where)
        if cfg.layer_types[i] == "linear_attention":
            conv = take(hf, f"model.layers.{i}.linear_attn.conv1d.weight", where)
            if conv.dim() != 3 or conv.shape[1] != 1:
                raise ValueError(f"{where}: layer {i} conv1d.weight has shape {tuple(conv.shape)}, expected "
                                 f"[{cfg.conv_dim}, 1, {cfg.conv_kernel}] (depthwise)")
            ours[f"layers.{i}.mixer.conv_weight"] = conv[:, 0]
            if conv.shape[-1] != cfg.conv_kernel:
                raise ValueError(f"{where}: layer {i} conv width {conv.shape[-1]} != linear_conv_kernel_dim "
                                 f"{cfg.conv_kernel}")
    return finish_head(hf, ours, cfg.tie_word_embeddings, where)


def hybrid_to_hf(ours: dict, cfg: HybridConfig) -> dict:
    """HybridLM names -> HF Qwen3_5ForCausalLM names (for writing random checkpoints)."""
    hf = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"]}
    sizes = {"linear_attention": [cfg.conv_dim, cfg.value_dim, cfg.linear_num_value_heads,
                                  cfg.linear_num_value_heads],
             "full_attention": [2 * cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                                cfg.num_kv_heads * cfg.head_dim]}
    for i in range(cfg.num_layers):
        for h, o in _per_layer(cfg, i):
            hf[h] = ours[o]
        for o, parts in _fused(cfg, i):
            split = [cfg.intermediate_size] * 2 if o.endswith("mlp.gate_up.weight") else \
                [cfg.shared_expert_intermediate_size] * 2 if o.endswith("shared.gate_up.weight") else \
                sizes[cfg.layer_types[i]]
            hf.update(zip(parts, ours[o].split(split)))
        if i in cfg.moe_layers:
            hf.update(_experts_to_hf(ours, cfg, i))
        if cfg.family == "qwen3_next" and cfg.layer_types[i] == "linear_attention":
            a = f"model.layers.{i}.linear_attn."
            hf[a + "in_proj_qkvz.weight"], hf[a + "in_proj_ba.weight"] = _next_in_proj_to_hf(
                ours[f"layers.{i}.mixer.in_proj.weight"], cfg)
        if cfg.layer_types[i] == "linear_attention":
            hf[f"model.layers.{i}.linear_attn.conv1d.weight"] = ours[f"layers.{i}.mixer.conv_weight"][:, None]
    if not cfg.tie_word_embeddings:
        hf["lm_head.weight"] = ours["lm_head.weight"]
    return {k: v.contiguous() for k, v in hf.items()}
