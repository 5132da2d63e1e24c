"""Model configurations parsed from Hugging Face `config.json` files, with clear errors.

TargetConfig covers the dense causal LMs we run ourselves (Qwen3: q/k RMSNorm; LLaMA-3.x: "llama3"
RoPE frequencies). DrafterConfig is a DFlash drafter (a Qwen3-style config plus `dflash_config`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# HF `architectures[0]` -> our family name. Anything else is refused by name.
TARGET_ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
DRAFTER_ARCHITECTURES = {"DFlashDraftModel"}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"                      # "default" | "llama3"
    factor: float = 1.0                        # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class TargetConfig:
    family: str                                # "qwen3" | "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple = ()

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"


@dataclass(frozen=True)
class DrafterConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    target_layer_ids: tuple
    mask_token_id: int
    block_size: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None


def read_config_json(folder) -> dict:
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"model folder {str(folder)!r} does not exist")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing (a Hugging Face model folder needs config.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def _need(cfg: dict, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise ValueError(f"{where}: config.json has no {key!r}")
    return cfg[key]


def parse_rope(cfg: dict, where: str) -> RopeConfig:
    """Accepts transformers-5 `rope_parameters` and older `rope_theta` + `rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "llama3":
        try:
            return RopeConfig(theta=theta, kind="llama3", factor=float(merged["factor"]),
                              low_freq_factor=float(merged["low_freq_factor"]),
                              high_freq_factor=float(merged["high_freq_factor"]),
                              original_max_position_embeddings=int(merged["original_max_position_embeddings"]))
        except KeyError as e:
            raise ValueError(f"{where}: llama3 rope scaling lacks {e.args[0]!r}") from None
    raise ValueError(f"{where}: rope type {kind!r} is not supported (supported: default, llama3)")


def _eos_ids(cfg: dict) -> tuple:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def _common(cfg: dict, where: str) -> dict:
    hidden = int(_need(cfg, "hidden_size", where))
    heads = int(_need(cfg, "num_attention_heads", where))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise ValueError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError(f"{where}: attention_bias/mlp_bias=true is not supported (bias-free linears only)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act={act!r} is not supported (silu only)")
    return dict(vocab_size=int(_need(cfg, "vocab_size", where)), hidden_size=hidden,
                num_layers=int(_need(cfg, "num_hidden_layers", where)), num_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim,
                intermediate_size=int(_need(cfg, "intermediate_size", where)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope=parse_rope(cfg, where))


def target_config_from_dict(cfg: dict, where: str = "target") -> TargetConfig:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in TARGET_ARCHITECTURES:
        raise ValueError(f"{where}: architecture {arch!r} is not supported "
                         f"(supported: {sorted(TARGET_ARCHITECTURES)})")
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or cfg.get("use_sliding_window"):
        raise ValueError(f"{where}: sliding-window / non-full-attention layers are not supported "
                         f"(layer_types={sorted(set(layer_types))})")
    return TargetConfig(family=TARGET_ARCHITECTURES[arch], **_common(cfg, where),
                        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                        eos_token_ids=_eos_ids(cfg))


def drafter_config_from_dict(cfg: dict, where: str = "drafter") -> DrafterConfig:
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in DRAFTER_ARCHITECTURES:
        raise ValueError(f"{where}: architecture {archs[0] if archs else None!r} is not a supported drafter "
                         f"(supported: {sorted(DRAFTER_ARCHITECTURES)})")
    dcfg = cfg.get("dflash_config")
    if not isinstance(dcfg, dict):
        raise ValueError(f"{where}: config.json has no 'dflash_config' object")
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or cfg.get("is_causal"):
        raise ValueError(f"{where}: only non-causal full-attention DFlash layers are supported "
                         f"(layer_types={sorted(set(layer_types))}, is_causal={cfg.get('is_causal')})")
    return DrafterConfig(**block_drafter_fields(cfg, dcfg, where))


def block_drafter_fields(cfg: dict, dcfg: dict, where: str) -> dict:
    """DrafterConfig's fields of a DFlash-family block drafter (DFlash, DFlash2, DSpark): the Qwen3
    shape plus the keys of `dcfg` (its dflash_config / dspark_config), each falling back to the top
    level of config.json, as stock's _draft_value does."""
    value = lambda name, default=None: dcfg.get(name, cfg.get(name, default))
    for name in ("target_layer_ids", "mask_token_id"):
        if value(name) is None:
            raise ValueError(f"{where}: dflash_config has no {name!r}")
    layer_ids = value("target_layer_ids")
    if not isinstance(layer_ids, (list, tuple)) or not layer_ids or not all(isinstance(i, int) for i in layer_ids):
        raise ValueError(f"{where}: target_layer_ids must be a non-empty list of ints, got {layer_ids!r}")
    softcap = value("final_logit_softcapping")
    return dict(**_common(cfg, where), target_layer_ids=tuple(layer_ids),
                mask_token_id=int(value("mask_token_id")), block_size=int(value("block_size", 16)),
                input_embedding_scale=float(value("input_embedding_scale", 1.0)),
                output_multiplier=float(value("output_multiplier", 1.0)),
                final_logit_softcapping=None if softcap is None else float(softcap))
