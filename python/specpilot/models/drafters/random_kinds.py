"""Random-weight target + drafter pairs of every kind, in each kind's published layout (tests and
benchmarks): `write_kind_pair(out, kind, preset, ...)` writes out/target (as random_ckpt.write_pair)
and out/drafter. Inits as random_ckpt's (spread-out logits, rare near-ties), plus: conv taps near
the identity (base tap 0 = 1 + noise, the rest and the dynamic kernel small), so DFlash2's conv
keeps the signal's scale. The default conv_kernel_size is 3: stock's conv fails on a block shorter
than kernel_size - 1 (a tail block of 2 needs a kernel of at most 3).

Scale shapes (SCALE_SHAPES, for the Qwen3-8B preset): DFlash2 block 8 with 5 layers, DSpark block 7
with 5 layers at layers [1, 9, 17, 25, 33] and Markov rank 256, PARD a Qwen3-0.6B-shaped causal LM
drafting 12 tokens.
"""
from __future__ import annotations

import json

import torch

from .. import hf_names
from ..config import TargetConfig
from ..hybrid_config import HybridConfig
from ..hybrid_names import hybrid_to_hf
from ..random_ckpt import (TARGET_PRESETS, _fill_random, drafter_config_for, hf_drafter_config, random_target,
                           save_safetensors, write_byte_tokenizer, write_configs)

QWEN3_0_6B = TargetConfig("qwen3", 151936, 1024, 28, 16, 8, 128, 3072, 1e-6, TARGET_PRESETS["qwen3-8b"].rope,
                          True, 40960)
# DFlash2's conv and selector sizes here (kernel 3, group 16, rank 64, top-k 8) are our defaults, not
# read from a published config: the cost they model is of that order (elementwise taps, r x V codebooks).
SCALE_SHAPES = {
    "dflash2": dict(drafter_layers=5, block_size=8),
    "dspark": dict(drafter_layers=5, block_size=8, layer_ids=[1, 9, 17, 25, 33], markov_rank=256),
    "pard": dict(block_size=13, pard_shape=QWEN3_0_6B),
}


def _tiny_pard_shape(target) -> TargetConfig:
    """A PARD drafter of half the target's depth and width (same vocab and rope; a dense Qwen3 for a
    hybrid target, as PARD drafters are)."""
    heads = max(2, target.num_heads // 2)
    return TargetConfig("qwen3" if isinstance(target, HybridConfig) else target.family, target.vocab_size,
                        target.hidden_size // 2, max(1, target.num_layers // 2), heads,
                        max(1, min(target.num_kv_heads, heads)), target.head_dim, target.intermediate_size // 2,
                        target.rms_norm_eps, target.rope, True, target.max_position_embeddings, target.eos_token_ids)


@torch.no_grad()
def _init_conv_taps(module) -> None:
    for name, p in module.named_parameters():
        if name.endswith("base_kernel"):          # [2, K, H]
            p.mul_(0.1)
            p[:, 0] += 1.0
        elif name.endswith("kernel_projection.weight"):
            p.mul_(0.1)


def write_kind_pair(out, kind: str, target_cfg="tiny-qwen3", drafter_layers: int = 2, block_size: int = 8,
                    seed: int = 0, dtype=torch.float32, max_shard_bytes=None, layer_ids=None, device="cpu",
                    two_token_head: bool = False, **extra):
    """out/target and out/drafter of `kind` ("dflash", "dflash2", "dspark", "pard"); returns the two
    folders. block_size is the engine's verify block (anchor + drafts): DFlash / DFlash2 store it as
    is, DSpark stores block_size - 1 (every position drafts), PARD stores pard_draft_k = block_size - 1.
    extra: DFlash2 conv_kernel_size, conv_group_size, selector_rank, selector_top_k, layer_types,
    sliding_window; DSpark markov_rank, confidence_head; PARD pard_shape (a TargetConfig, or "target":
    the target's shape and weights, so its first draft is the target's own next token), and for
    PARD-2 pard2_layers (HF hidden_states indices), pard2_scale, pard2_bias.
    two_token_head: the LM-head rows of tokens 0 and 1 become w and -w, scaled by PEAK_SCALE (tied
    embeddings too), so the target mostly emits 0 or 1 by the sign of <h, w>, and so does a drafter
    with that head (the target's, or DSpark's copy, or PARD's own made the same way): about half
    the drafts are accepted, and tests see acceptance lengths above 1 and mixed outputs.
    """
    if kind not in ("dflash", "dflash2", "dspark", "pard"):
        raise ValueError(f"drafter kind {kind!r} is not one of dflash, dflash2, dspark, pard")
    tdir, ddir, cfg, dcfg = write_configs(out, target_cfg, drafter_layers, block_size, layer_ids)
    if cfg.vocab_size >= 258:
        write_byte_tokenizer(tdir, cfg.vocab_size)
    target = random_target(cfg, device, dtype, seed)
    if two_token_head:
        _two_token_head(target.lm_head.weight)
    to_hf = hybrid_to_hf if isinstance(cfg, HybridConfig) else hf_names.target_to_hf
    save_safetensors(to_hf(target.state_dict(), cfg), tdir, max_shard_bytes)
    extra_pard_copy = extra.get("pard_shape") == "target"
    config_json, drafter, to_hf = _build(kind, cfg, dcfg, block_size, target, extra)
    _fill_random(drafter, target.device, target.dtype, seed + 1)
    if hasattr(drafter, "after_load"):
        drafter.after_load()                  # PARD: re-tie its embedding and head
    _init_conv_taps(drafter)
    _copy_from_target(kind, drafter, target, extra_pard_copy)
    if two_token_head and kind == "pard" and not extra_pard_copy:
        _two_token_head(drafter.model.lm_head.weight)
    (ddir / "config.json").write_text(json.dumps(config_json, indent=2))
    save_safetensors(to_hf(drafter.state_dict()), ddir, max_shard_bytes)
    if kind == "pard" and drafter.config.pard2:
        from .pard import write_warp
        write_warp(drafter.state_dict(), ddir)
    return tdir, ddir


PEAK_SCALE = 20.0


@torch.no_grad()
def _two_token_head(weight) -> None:
    weight[1] = -weight[0]
    weight[:2] *= PEAK_SCALE


@torch.no_grad()
def _copy_from_target(kind, drafter, target, pard_copy: bool) -> None:
    if kind == "dspark":            # DSpark's own embedding and head start as the target's
        drafter.embed.weight.copy_(target.embed.weight)
        drafter.lm_head.weight.copy_(target.lm_head.weight)
    if kind == "pard" and pard_copy:
        for name, t in target.state_dict().items():
            drafter.model.state_dict()[name].copy_(t)


def _build(kind, cfg, dcfg, block_size, target, extra):
    """(config.json dict, a meta-device drafter module, its state -> HF names)."""
    if kind == "dflash":
        from ..drafter import DFlashDrafter

        if extra:
            raise ValueError(f"unknown DFlash options {sorted(extra)}")
        with torch.device("meta"):
            return hf_drafter_config(dcfg, cfg), DFlashDrafter(dcfg, target), lambda s: hf_names.drafter_to_hf(s, dcfg)
    if kind == "dflash2":
        from .dflash2 import DFlash2Config, DFlash2Drafter, dflash2_to_hf, hf_dflash2_config

        layer_types = tuple(extra.pop("layer_types", ("full_attention",) * dcfg.num_layers))
        c = DFlash2Config(**{**dcfg.__dict__}, layer_types=layer_types, **{
            "conv_kernel_size": 3, "conv_group_size": 16 if dcfg.hidden_size % 16 == 0 else 1,
            "selector_rank": min(64, dcfg.hidden_size), "selector_top_k": 8, **extra})
        with torch.device("meta"):
            return hf_dflash2_config(c, cfg), DFlash2Drafter(c, target), lambda s: dflash2_to_hf(s, c)
    if kind == "dspark":
        from .dspark import DSparkConfig, DSparkDrafter, dspark_to_hf, hf_dspark_config

        c = DSparkConfig(**{**dcfg.__dict__, "block_size": block_size - 1},
                         markov_rank=int(extra.pop("markov_rank", 16)),
                         confidence_head=bool(extra.pop("confidence_head", True)))
        if extra:
            raise ValueError(f"unknown DSpark options {sorted(extra)}")
        with torch.device("meta"):
            return hf_dspark_config(c, cfg), DSparkDrafter(c, target), lambda s: dspark_to_hf(s, c)
    from .pard import PardConfig, PardDrafter, hf_pard_config, pard_to_hf

    shape = extra.pop("pard_shape", None) or _tiny_pard_shape(cfg)
    shape = cfg if shape == "target" else shape
    pard2_layers = tuple(extra.pop("pard2_layers", ()))       # PARD-2: HF hidden_states indices (>= 1)
    pard2 = dict(feature_layers=tuple(i - 1 for i in pard2_layers), feature_dim=len(pard2_layers) * cfg.hidden_size,
                 feature_scale=float(extra.pop("pard2_scale", 0.02)), feature_bias=bool(extra.pop("pard2_bias", False)))
    if extra:
        raise ValueError(f"unknown PARD options {sorted(extra)}")
    c = PardConfig(model=shape, pard_token=dcfg.mask_token_id, num_drafts=block_size - 1, **pard2)
    with torch.device("meta"):
        return hf_pard_config(c), PardDrafter(c, target), lambda s: pard_to_hf(s, c)


def random_kind_drafter(kind: str, target, drafter_layers: int, block_size: int, seed: int = 1):
    """A random drafter of `kind` for an in-memory random target (bench's random:<preset>:<layers>:<kind>),
    built on the target's device and dtype; on an 8B preset with the kind's published scale shape."""
    cfg = target.config
    options = {"drafter_layers": drafter_layers, "block_size": block_size}
    if cfg.hidden_size >= 4096 and kind in SCALE_SHAPES:
        options.update({k: v for k, v in SCALE_SHAPES[kind].items() if k != "block_size"})
    layers, layer_ids = options.pop("drafter_layers"), options.pop("layer_ids", None)
    options.pop("block_size")
    dcfg = drafter_config_for(cfg, layers, block_size, layer_ids, mask_token_id=cfg.vocab_size - 1)
    _, drafter, _ = _build(kind, cfg, dcfg, block_size, target, options)
    _fill_random(drafter, target.device, target.dtype, seed)
    _init_conv_taps(drafter)
    _copy_from_target(kind, drafter, target, False)
    drafter.after_load()
    drafter.eval().requires_grad_(False)
    drafter.ensure_rope(target.rope_cos.shape[0])
    return drafter
