"""Random-weight target + DFlash drafter pairs, at any size.

`write_pair(out, target_preset, ...)` writes two HF-format folders (config.json, safetensors, single
or sharded; a byte-level tokenizer and generation_config.json with the target) that load in our
loader and in HF / dflash (so stock runs on them). `random_target` / `random_drafter` build our
modules in memory directly on a device (the 8B scale tier: no disk).

Init: embeddings N(0, 1), linears N(0, 1/fan_in), norms 1 + N(0, 0.1^2): logits have a spread of
several units, so greedy argmax near-ties (which would make fp32 comparisons flaky) are rare.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from . import hf_names
from .config import DrafterConfig, RopeConfig, TargetConfig
from .drafter import DFlashDrafter
from .hybrid_config import HybridConfig
from .hybrid_names import hybrid_to_hf
from .hybrid import HybridLM
from .random_hybrid import HYBRID_PRESETS, fill_random_hybrid, hf_hybrid_config
from .target import TargetLM

LLAMA3_ROPE = RopeConfig(theta=500000.0, kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=8192)

TARGET_PRESETS = {
    "tiny-qwen3": TargetConfig("qwen3", 320, 64, 4, 4, 2, 16, 128, 1e-6, RopeConfig(10000.0), True, 2048),
    "tiny-llama": TargetConfig("llama", 320, 64, 4, 4, 2, 16, 160, 1e-5,
                               replace(LLAMA3_ROPE, original_max_position_embeddings=64), False, 2048),
    "qwen3-8b": TargetConfig("qwen3", 151936, 4096, 36, 32, 8, 128, 12288, 1e-6, RopeConfig(1000000.0), False, 40960),
    "llama-3.1-8b": TargetConfig("llama", 128256, 4096, 32, 32, 8, 128, 14336, 1e-5, LLAMA3_ROPE, False, 131072),
}
TARGET_PRESETS.update(HYBRID_PRESETS)              # Qwen3.5 hybrids (models/random_hybrid.py)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list:
    """dflash's spacing: uniformly between layer 1 and layer L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def drafter_config_for(target: TargetConfig, num_layers: int = 2, block_size: int = 16, layer_ids=None,
                       mask_token_id=None, **extra) -> DrafterConfig:
    """A Qwen3-style DFlash drafter config matching `target` (as the public drafters are)."""
    layer_ids = layer_ids or build_target_layer_ids(target.num_layers, num_layers)
    return DrafterConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size, num_layers=num_layers,
                         num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                         intermediate_size=target.intermediate_size, rms_norm_eps=target.rms_norm_eps,
                         rope=target.rope, target_layer_ids=tuple(layer_ids),
                         mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
                         block_size=block_size, **extra)


@torch.no_grad()
def _fill_random(module: torch.nn.Module, device, dtype, seed: int) -> None:
    gen = torch.Generator(device=device).manual_seed(seed)
    module.to(dtype)                                   # still on meta: allocate directly in dtype
    module.to_empty(device=device)
    for name, p in module.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32))
        elif name.startswith("embed"):
            p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32))
        elif p.ndim != 2:   # conv taps, biases: small tensors, N(0, 1/last dim)
            p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) / p.shape[-1] ** 0.5)
        else:   # chunked so an 8B-size matrix never needs an fp32 copy of itself
            for rows in torch.arange(p.shape[0], device="cpu").split(8192):
                r = slice(int(rows[0]), int(rows[-1]) + 1)
                chunk = torch.randn((r.stop - r.start, p.shape[1]), generator=gen, device=device)
                p[r].copy_(chunk / p.shape[1] ** 0.5)


def random_target(cfg: TargetConfig, device="cpu", dtype=torch.float32, seed: int = 0) -> TargetLM:
    """A TargetLM, or a HybridLM for a HybridConfig, with seeded random weights."""
    hybrid = isinstance(cfg, HybridConfig)
    with torch.device("meta"):
        model = HybridLM(cfg) if hybrid else TargetLM(cfg)
    (fill_random_hybrid if hybrid else _fill_random)(model, torch.device(device), dtype, seed)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.eval().requires_grad_(False)
    model.ensure_rope(4096)
    model.eos_token_ids = ()
    return model


def random_drafter(cfg: DrafterConfig, target: TargetLM, seed: int = 1) -> DFlashDrafter:
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg, target)
    _fill_random(drafter, target.device, target.dtype, seed)
    drafter.eval().requires_grad_(False)
    drafter.ensure_rope(target.rope_cos.shape[0])
    return drafter


def _rope_dict(rope: RopeConfig) -> dict:
    if rope.kind == "default":
        return {"rope_type": "default", "rope_theta": rope.theta}
    return {"rope_type": "llama3", "rope_theta": rope.theta, "factor": rope.factor,
            "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings}


def _common_hf(c) -> dict:
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
            "attention_bias": False, "rope_parameters": _rope_dict(c.rope)}


def hf_target_config(cfg: TargetConfig, eos_token_id: int) -> dict:
    if isinstance(cfg, HybridConfig):
        return hf_hybrid_config(cfg, eos_token_id)
    arch = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama": ("LlamaForCausalLM", "llama")}[cfg.family]
    out = {"architectures": [arch[0]], "model_type": arch[1], **_common_hf(cfg),
           "tie_word_embeddings": cfg.tie_word_embeddings, "max_position_embeddings": cfg.max_position_embeddings,
           "eos_token_id": eos_token_id, "bos_token_id": eos_token_id, "use_cache": True}
    if cfg.family == "llama":
        out["mlp_bias"] = False
    return out


def hf_drafter_config(cfg: DrafterConfig, target: TargetConfig) -> dict:
    dflash = {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
              "block_size": cfg.block_size}
    for name in ("input_embedding_scale", "output_multiplier"):
        if getattr(cfg, name) != 1.0:
            dflash[name] = getattr(cfg, name)
    if cfg.final_logit_softcapping is not None:
        dflash["final_logit_softcapping"] = cfg.final_logit_softcapping
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **_common_hf(cfg),
            "num_target_layers": target.num_layers, "block_size": cfg.block_size, "dflash_config": dflash,
            "tie_word_embeddings": False, "max_position_embeddings": target.max_position_embeddings}


def save_safetensors(state: dict, folder: Path, max_shard_bytes: int | None = None) -> None:
    """model.safetensors, or shards + model.safetensors.index.json when max_shard_bytes is given."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    if max_shard_bytes is None:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    shards, current, size = [], {}, 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name], size = t, size + nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_byte_tokenizer(folder: Path, vocab_size: int) -> tuple:
    """A byte-level BPE tokenizer (256 byte tokens, no merges) + <|endoftext|> and <|mask|> specials,
    padded to vocab_size with unused tokens. Returns (eos_id, mask_id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 258:
        raise ValueError(f"the byte tokenizer needs vocab_size >= 258, got {vocab_size}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i in range(len(vocab), vocab_size - 2):
        vocab[f"<|unused{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   mask_token="<|mask|>")
    fast.add_special_tokens({"additional_special_tokens": []})
    fast.save_pretrained(str(folder))
    eos, mask = fast.convert_tokens_to_ids("<|endoftext|>"), fast.convert_tokens_to_ids("<|mask|>")
    if (eos, mask) != (vocab_size - 2, vocab_size - 1):
        raise RuntimeError(f"byte tokenizer specials landed at {eos}, {mask}, expected {vocab_size - 2}, {vocab_size - 1}")
    return eos, mask


def write_configs(out, target_cfg="tiny-qwen3", drafter_layers: int = 2, block_size: int = 16, layer_ids=None,
                  **drafter_extra) -> tuple:
    """Writes out/target/{config,generation_config}.json and out/drafter/config.json (all that
    `specpilot cost` reads); returns (target_dir, drafter_dir, target config, drafter config). The
    specials are the byte tokenizer's: <|endoftext|> at vocab - 2, <|mask|> at vocab - 1."""
    cfg = TARGET_PRESETS[target_cfg] if isinstance(target_cfg, str) else target_cfg
    out = Path(out)
    tdir, ddir = out / "target", out / "drafter"
    tdir.mkdir(parents=True, exist_ok=True)
    ddir.mkdir(parents=True, exist_ok=True)
    eos, mask = cfg.vocab_size - 2, cfg.vocab_size - 1
    dcfg = drafter_config_for(cfg, drafter_layers, block_size, layer_ids, mask_token_id=mask, **drafter_extra)
    (tdir / "config.json").write_text(json.dumps(hf_target_config(cfg, eos), indent=2))
    (tdir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": eos,
                                                              "do_sample": False}))
    (ddir / "config.json").write_text(json.dumps(hf_drafter_config(dcfg, cfg), indent=2))
    return tdir, ddir, cfg, dcfg


def write_pair(out, target_cfg="tiny-qwen3", drafter_layers: int = 2, block_size: int = 16, seed: int = 0,
               dtype=torch.float32, max_shard_bytes=None, layer_ids=None, device="cpu", **drafter_extra):
    """Writes out/target and out/drafter; returns (target_dir, drafter_dir). `device` is where the
    random weights are drawn (cuda: seconds for an 8B shape instead of minutes on the CPU); the
    values depend on the device's generator, so a seed names a checkpoint only per device."""
    tdir, ddir, cfg, dcfg = write_configs(out, target_cfg, drafter_layers, block_size, layer_ids, **drafter_extra)
    if cfg.vocab_size >= 258:
        write_byte_tokenizer(tdir, cfg.vocab_size)
    target = random_target(cfg, device, dtype, seed)
    drafter = random_drafter(dcfg, target, seed + 1)
    to_hf = hybrid_to_hf if isinstance(cfg, HybridConfig) else hf_names.target_to_hf
    save_safetensors(to_hf(target.state_dict(), cfg), tdir, max_shard_bytes)
    save_safetensors(hf_names.drafter_to_hf(drafter.state_dict(), dcfg), ddir, max_shard_bytes)
    return tdir, ddir
