"""Tensor-name mapping between HF Qwen3.5 hybrid checkpoints and HybridLM's fused modules, both ways.

Fused rows: GDN in_proj = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a], attention qkv =
[q_proj (query | gate per head); k_proj; v_proj], mlp gate_up = [gate_proj; up_proj]; the GDN conv
weight [C, 1, K] is stored as [C, K]. A Qwen3_5ForConditionalGeneration checkpoint keeps the text model
under `model.language_model.`; its vision tower (`model.visual.`) and MTP head (`mtp.`) are not loaded.
"""
from __future__ import annotations

import torch

from .hybrid_config import HybridConfig

IGNORED_PREFIXES = ("mtp.", "model.visual.")


def _take(state: dict, name: str, where: str) -> torch.Tensor:
    if name not in state:
        raise ValueError(f"{where}: checkpoint lacks tensor {name!r}")
    return state.pop(name)


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
             (src + "post_attention_layernorm.weight", dst + "mlp_norm.weight"),
             (src + "mlp.down_proj.weight", dst + "mlp.down.weight")]
    if cfg.layer_types[i] == "linear_attention":
        a = src + "linear_attn."
        pairs += [(a + "A_log", dst + "mixer.A_log"), (a + "dt_bias", dst + "mixer.dt_bias"),
                  (a + "norm.weight", dst + "mixer.norm_weight"), (a + "out_proj.weight", dst + "mixer.out_proj.weight")]
    else:
        a = src + "self_attn."
        pairs += [(a + "q_norm.weight", dst + "mixer.q_norm.weight"), (a + "k_norm.weight", dst + "mixer.k_norm.weight"),
                  (a + "o_proj.weight", dst + "mixer.o.weight")]
    return pairs


def _fused(cfg: HybridConfig, i: int) -> list:
    """(our name, [HF names in row order]) of a layer's fused projections."""
    src, dst = f"model.layers.{i}.", f"layers.{i}."
    out = [(dst + "mlp.gate_up.weight", [src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"])]
    if cfg.layer_types[i] == "linear_attention":
        a = src + "linear_attn."
        out.append((dst + "mixer.in_proj.weight", [a + f"in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")]))
    else:
        a = src + "self_attn."
        out.append((dst + "mixer.qkv.weight", [a + f"{p}_proj.weight" for p in "qkv"]))
    return out


def hybrid_from_hf(hf: dict, cfg: HybridConfig, where: str = "target") -> dict:
    """HF names -> HybridLM names. Leftover tensors are reported as unexpected."""
    hf = _text_names(hf)
    ours = {"embed.weight": _take(hf, "model.embed_tokens.weight", where),
            "norm.weight": _take(hf, "model.norm.weight", where)}
    for i in range(cfg.num_layers):
        for h, o in _per_layer(cfg, i):
            ours[o] = _take(hf, h, where)
        for o, parts in _fused(cfg, i):
            ours[o] = torch.cat([_take(hf, h, where) for h in parts])
        if cfg.layer_types[i] == "linear_attention":
            conv = _take(hf, f"model.layers.{i}.linear_attn.conv1d.weight", where)
            if conv.dim() != 3 or conv.shape[1] != 1:
                raise ValueError(f"{where}: layer {i} conv1d.weight has shape {tuple(conv.shape)}, expected "
                                 f"[{cfg.conv_dim}, 1, {cfg.conv_kernel}] (depthwise)")
            ours[f"layers.{i}.mixer.conv_weight"] = conv[:, 0]
            if conv.shape[-1] != cfg.conv_kernel:
                raise ValueError(f"{where}: layer {i} conv width {conv.shape[-1]} != linear_conv_kernel_dim "
                                 f"{cfg.conv_kernel}")
    if cfg.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
        ours["lm_head.weight"] = ours["embed.weight"]
    else:
        ours["lm_head.weight"] = _take(hf, "lm_head.weight", where)
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
    if hf:
        raise ValueError(f"{where}: unexpected tensors in checkpoint: {sorted(hf)[:8]}")
    return ours


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
            split = [cfg.intermediate_size] * 2 if o.endswith("gate_up.weight") else sizes[cfg.layer_types[i]]
            hf.update(zip(parts, ours[o].split(split)))
        if cfg.layer_types[i] == "linear_attention":
            hf[f"model.layers.{i}.linear_attn.conv1d.weight"] = ours[f"layers.{i}.mixer.conv_weight"][:, None]
    if not cfg.tie_word_embeddings:
        hf["lm_head.weight"] = ours["lm_head.weight"]
    return {k: v.contiguous() for k, v in hf.items()}
