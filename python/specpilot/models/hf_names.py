"""Tensor-name mapping between HF checkpoints and our fused modules, both directions.

Fused rows: qkv = [q_proj; k_proj; v_proj], gate_up = [gate_proj; up_proj], drafter kv = [k_proj; v_proj].
"""
from __future__ import annotations

import torch

from .config import DrafterConfig, TargetConfig


def take(state: dict, name: str, where: str) -> torch.Tensor:
    """Pops a tensor a checkpoint must hold, with an error naming it."""
    if name not in state:
        raise ValueError(f"{where}: checkpoint lacks tensor {name!r}")
    return state.pop(name)


def finish_head(hf: dict, ours: dict, tied: bool, where: str) -> dict:
    """The LM head (the embedding when tied), then refuses any tensor left unmapped."""
    if tied:
        hf.pop("lm_head.weight", None)             # some tied checkpoints store a copy
        ours["lm_head.weight"] = ours["embed.weight"]
    else:
        ours["lm_head.weight"] = take(hf, "lm_head.weight", where)
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
    if hf:
        raise ValueError(f"{where}: unexpected tensors in checkpoint: {sorted(hf)[:8]}")
    return ours


def _norms(src: str, dst: str, qk_norm: bool) -> list:
    pairs = [(f"{src}input_layernorm.weight", f"{dst}attn_norm.weight"),
             (f"{src}post_attention_layernorm.weight", f"{dst}mlp_norm.weight")]
    if qk_norm:
        pairs += [(f"{src}self_attn.q_norm.weight", f"{dst}attn.q_norm.weight"),
                  (f"{src}self_attn.k_norm.weight", f"{dst}attn.k_norm.weight")]
    return pairs


def target_from_hf(hf: dict, cfg: TargetConfig, where: str = "target") -> dict:
    """HF Qwen3/LLaMA names -> our TargetLM names. Leftover tensors are reported as unexpected."""
    hf = dict(hf)
    ours = {"embed.weight": take(hf, "model.embed_tokens.weight", where),
            "norm.weight": take(hf, "model.norm.weight", where)}
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        a = src + "self_attn."
        ours[dst + "attn.qkv.weight"] = torch.cat([take(hf, a + f"{p}_proj.weight", where) for p in "qkv"])
        ours[dst + "attn.o.weight"] = take(hf, a + "o_proj.weight", where)
        ours[dst + "mlp.gate_up.weight"] = torch.cat([take(hf, src + f"mlp.{p}_proj.weight", where)
                                                      for p in ("gate", "up")])
        ours[dst + "mlp.down.weight"] = take(hf, src + "mlp.down_proj.weight", where)
        for s, d in _norms(src, dst, cfg.qk_norm):
            ours[d] = take(hf, s, where)
    return finish_head(hf, ours, cfg.tie_word_embeddings, where)


def target_to_hf(ours: dict, cfg: TargetConfig) -> dict:
    """Our TargetLM names -> HF names (for writing random checkpoints)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    hf = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"]}
    for i in range(cfg.num_layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        for name, t in zip("qkv", ours[src + "attn.qkv.weight"].split([q, kv, kv])):
            hf[dst + f"self_attn.{name}_proj.weight"] = t
        hf[dst + "self_attn.o_proj.weight"] = ours[src + "attn.o.weight"]
        gate, up = ours[src + "mlp.gate_up.weight"].split(cfg.intermediate_size)
        hf[dst + "mlp.gate_proj.weight"], hf[dst + "mlp.up_proj.weight"] = gate, up
        hf[dst + "mlp.down_proj.weight"] = ours[src + "mlp.down.weight"]
        for h, o in _norms(dst, src, cfg.qk_norm):
            hf[h] = ours[o]
    if not cfg.tie_word_embeddings:
        hf["lm_head.weight"] = ours["lm_head.weight"]
    return {k: v.contiguous() for k, v in hf.items()}


def drafter_from_hf(hf: dict, cfg: DrafterConfig, where: str = "drafter") -> dict:
    hf = dict(hf)
    ours = {n: take(hf, n, where) for n in ("fc.weight", "hidden_norm.weight", "norm.weight")}
    for i in range(cfg.num_layers):
        src, dst = f"layers.{i}.", f"layers.{i}."
        a = src + "self_attn."
        ours[dst + "attn.q.weight"] = take(hf, a + "q_proj.weight", where)
        ours[dst + "attn.kv.weight"] = torch.cat([take(hf, a + "k_proj.weight", where),
                                                  take(hf, a + "v_proj.weight", where)])
        ours[dst + "attn.o.weight"] = take(hf, a + "o_proj.weight", where)
        ours[dst + "mlp.gate_up.weight"] = torch.cat([take(hf, src + f"mlp.{p}_proj.weight", where)
                                                      for p in ("gate", "up")])
        ours[dst + "mlp.down.weight"] = take(hf, src + "mlp.down_proj.weight", where)
        for s, d in _norms(src, dst, True):
            ours[d] = take(hf, s, where)
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
    if hf:
        raise ValueError(f"{where}: unexpected tensors in drafter checkpoint (a DFlash drafter holds only "
                         f"layers.*, fc, hidden_norm, norm): {sorted(hf)[:8]}")
    return ours


def drafter_to_hf(ours: dict, cfg: DrafterConfig) -> dict:
    kv = cfg.num_kv_heads * cfg.head_dim
    hf = {n: ours[n] for n in ("fc.weight", "hidden_norm.weight", "norm.weight")}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        hf[p + "self_attn.q_proj.weight"] = ours[p + "attn.q.weight"]
        k, v = ours[p + "attn.kv.weight"].split(kv)
        hf[p + "self_attn.k_proj.weight"], hf[p + "self_attn.v_proj.weight"] = k, v
        hf[p + "self_attn.o_proj.weight"] = ours[p + "attn.o.weight"]
        gate, up = ours[p + "mlp.gate_up.weight"].split(cfg.intermediate_size)
        hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
        hf[p + "mlp.down_proj.weight"] = ours[p + "mlp.down.weight"]
        for h, o in _norms(p, p, True):
            hf[h] = ours[o]
    return {k: v.contiguous() for k, v in hf.items()}
