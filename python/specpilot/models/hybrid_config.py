"""Configuration of hybrid recurrent targets (Qwen3.5 text: Gated DeltaNet + gated full attention),
parsed from Hugging Face `config.json` with clear errors for shapes our modules cannot run.

Accepted: `Qwen3_5ForCausalLM` (`qwen3_5_text`), the text part of `Qwen3_5ForConditionalGeneration`
(its `text_config`; the vision tower and MTP head are not loaded) and `Qwen3NextForCausalLM`
(`qwen3_next`: the same layers, with sparse MoE MLPs in the layers `moe_layers` names).
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import RopeConfig, _eos_ids, parse_rope

HYBRID_ARCHITECTURES = {"Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
                        "Qwen3NextForCausalLM": "qwen3_next"}
LAYER_KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class HybridConfig:
    family: str                     # "qwen3_5" | "qwen3_next"
    vocab_size: int
    hidden_size: int
    layer_types: tuple              # per layer: "linear_attention" (GDN) | "full_attention"
    num_heads: int                  # gated full attention
    num_kv_heads: int
    head_dim: int
    partial_rotary_factor: float
    linear_num_key_heads: int       # Gated DeltaNet
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple = ()
    moe_layers: tuple = ()          # Qwen3-Next: layers whose MLP is the sparse MoE block
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layers(self) -> tuple:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layers(self) -> tuple:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def validate(self, where: str = "hybrid target") -> "HybridConfig":
        bad = sorted({t for t in self.layer_types if t not in LAYER_KINDS})
        if bad:
            raise ValueError(f"{where}: layer_types {bad} are not supported (supported: {list(LAYER_KINDS)})")
        if not self.attention_layers:
            raise ValueError(f"{where}: no full_attention layer in layer_types; a hybrid target needs at least one")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{where}: num_attention_heads={self.num_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"{where}: linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                             f"linear_num_key_heads={self.linear_num_key_heads}")
        if self.conv_kernel < 2:
            raise ValueError(f"{where}: linear_conv_kernel_dim={self.conv_kernel} must be >= 2 (a causal conv "
                             f"keeps kernel - 1 inputs as state)")
        if self.rotary_dim < 2 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"{where}: partial_rotary_factor={self.partial_rotary_factor} gives rotary dim "
                             f"{self.rotary_dim} for head_dim {self.head_dim}; it must be even and in 2..head_dim")
        if self.moe_layers and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"{where}: num_experts_per_tok={self.num_experts_per_tok} must be in 1..num_experts="
                             f"{self.num_experts}")
        for name in ("hidden_size", "head_dim", "linear_key_head_dim", "linear_value_head_dim", "intermediate_size",
                     "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}: {name}={getattr(self, name)} must be >= 1")
        return self


def _need(cfg: dict, key: str, where: str):
    if cfg.get(key) is None:
        raise ValueError(f"{where}: config.json has no {key!r}")
    return cfg[key]


def text_config_of(cfg: dict, where: str) -> dict:
    """The text model's config: the file itself, or `text_config` of a ForConditionalGeneration one."""
    archs = cfg.get("architectures") or []
    if archs and archs[0] == "Qwen3_5ForConditionalGeneration":
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"{where}: Qwen3_5ForConditionalGeneration config.json has no 'text_config' object")
        eos = text.get("eos_token_id", cfg.get("eos_token_id"))
        return {**text, "architectures": archs, "eos_token_id": eos,
                "tie_word_embeddings": text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))}
    return cfg


def is_hybrid_config(cfg: dict) -> bool:
    archs = cfg.get("architectures") or []
    return bool(archs) and archs[0] in HYBRID_ARCHITECTURES


def hybrid_config_from_dict(cfg: dict, where: str = "target") -> HybridConfig:
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in HYBRID_ARCHITECTURES:
        raise ValueError(f"{where}: architecture {archs[0] if archs else None!r} is not a supported hybrid "
                         f"(supported: {sorted(HYBRID_ARCHITECTURES)})")
    text = text_config_of(cfg, where)
    if text.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias=true is not supported (bias-free linears only)")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act={act!r} is not supported (silu only)")
    layers = int(_need(text, "num_hidden_layers", where))
    interval = int(text.get("full_attention_interval", 4))
    types = text.get("layer_types") or ["linear_attention" if (i + 1) % interval else "full_attention"
                                        for i in range(layers)]
    if len(types) != layers:
        raise ValueError(f"{where}: layer_types has {len(types)} entries for num_hidden_layers={layers}")
    rope_params = dict(text.get("rope_parameters") or {})
    partial = float(rope_params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
    rope_type = rope_params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"{where}: rope type {rope_type!r} is not supported for hybrid targets (default only)")
    hidden, heads = int(_need(text, "hidden_size", where)), int(_need(text, "num_attention_heads", where))
    return HybridConfig(
        family=HYBRID_ARCHITECTURES[archs[0]], vocab_size=int(_need(text, "vocab_size", where)), hidden_size=hidden,
        layer_types=tuple(types), num_heads=heads, num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads), partial_rotary_factor=partial,
        linear_num_key_heads=int(_need(text, "linear_num_key_heads", where)),
        linear_num_value_heads=int(_need(text, "linear_num_value_heads", where)),
        linear_key_head_dim=int(_need(text, "linear_key_head_dim", where)),
        linear_value_head_dim=int(_need(text, "linear_value_head_dim", where)),
        conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
        intermediate_size=int(_need(text, "intermediate_size", where)),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)), rope=parse_rope(text, where),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
        eos_token_ids=_eos_ids(text), **_moe_fields(text, layers, where)).validate(where)


def _moe_fields(cfg: dict, layers: int, where: str) -> dict:
    """Qwen3-Next's sparse MoE: which layers use it (transformers' rule) and its sizes; {} without experts."""
    experts = int(cfg.get("num_experts") or 0)
    if not experts:
        return {}
    step = int(cfg.get("decoder_sparse_step", 1))
    dense = set(cfg.get("mlp_only_layers") or [])
    return dict(moe_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
                num_experts=experts, num_experts_per_tok=int(_need(cfg, "num_experts_per_tok", where)),
                moe_intermediate_size=int(_need(cfg, "moe_intermediate_size", where)),
                shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", True)))
