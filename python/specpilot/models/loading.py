"""Public loaders (the engine API): load_target, load_drafter, load_tokenizer."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from . import hf_names, hybrid_names
from .checkpoint import SPLIT12_FORMAT, assign_state, checkpoint_format, read_any_state_dict
from .config import drafter_config_from_dict, read_config_json, target_config_from_dict
from .drafter import DFlashDrafter
from .hybrid import HybridLM
from .hybrid_config import hybrid_config_from_dict, is_hybrid_config
from .target import TargetLM

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}
ROPE_POSITIONS = 4096  # initial RoPE table length; the engine grows it to its max_seq_len


class SlowPathWarning(UserWarning):
    """A choice that runs correctly but far slower than another giving the same tokens."""


def as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported (use one of {sorted(DTYPES)})")
    return DTYPES[dtype]


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA GPU")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r} is not supported (cpu or cuda)")
    return device


def build_target(cfg) -> TargetLM:
    """An empty (meta) TargetLM for `cfg`, to be filled by assign_state."""
    with torch.device("meta"):
        return TargetLM(cfg)


def build_hybrid(cfg) -> HybridLM:
    """An empty (meta) HybridLM for `cfg`, to be filled by assign_state."""
    with torch.device("meta"):
        return HybridLM(cfg)


def load_target(folder, device="cpu", dtype=torch.bfloat16, weights=None) -> TargetLM:
    """Qwen3 / LLaMA-3.x causal LM (or a Qwen3.5 hybrid recurrent one: HybridLM) from an HF folder (config.json + safetensors, single or sharded,
    or a split12-packed folder). weights="split12" swaps the linears for split12 ones after loading
    (a bf16 folder is packed at load), "bf16" keeps bf16 linears (a split12 folder is unpacked),
    None runs the weights as stored: split12 for a split12 folder in bf16, else bf16."""
    weights = resolve_weights(folder, dtype, weights)
    device, dtype = _device(device), as_dtype(dtype)
    raw, where = read_config_json(folder), f"target {folder}"
    if is_hybrid_config(raw):                        # Qwen3.5: Gated DeltaNet + gated attention
        cfg = hybrid_config_from_dict(raw, where=where)
        state = hybrid_names.hybrid_from_hf(read_any_state_dict(folder), cfg, where=where)
        model = build_hybrid(cfg)
    else:
        cfg = target_config_from_dict(raw, where=where)
        state = hf_names.target_from_hf(read_any_state_dict(folder), cfg, where=where)
        model = build_target(cfg)
    assign_state(model, state, f"target {folder}", device, dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.eval().requires_grad_(False)
    model.ensure_rope(max(ROPE_POSITIONS, cfg.max_position_embeddings))
    model.source_dir = str(folder)
    model.eos_token_ids = _generation_eos(folder) or cfg.eos_token_ids
    if weights == "split12":
        if device.type == "cpu":
            warnings.warn("split12 weights on the CPU run about 15x slower than bf16 (each call decodes the "
                          "12-bit planes; the packed format pays off on a GPU only); the same folder with "
                          "weights='bf16' (--weights bf16) gives the same tokens", SlowPathWarning, stacklevel=2)
        swap_to_split12(model)
    return model


def _check_weights(weights, default: str) -> None:
    if weights not in (None, "bf16", "split12"):
        raise ValueError(f"weights={weights!r}: use 'bf16', 'split12' or None ({default})")


def resolve_weights(folder, dtype, weights=None) -> str:
    """'bf16' or 'split12': `weights` if given, else as stored (split12 for a split12 folder run in
    bf16; a split12 folder run in fp32 holds the same bf16 values in fp32)."""
    _check_weights(weights, "as stored")
    if weights is not None:
        return weights
    stored = checkpoint_format(folder) if (Path(folder) / "config.json").exists() else "bf16"
    return "split12" if as_dtype(dtype) == torch.bfloat16 and stored == SPLIT12_FORMAT else "bf16"


def weights_of(model) -> str:
    """'split12' when any of the model's linears holds split12 planes, else 'bf16'."""
    from specpilot.formats.split12.linear import Split12Linear

    return "split12" if any(isinstance(m, Split12Linear) for m in model.modules()) else "bf16"


def swap_to_split12(model) -> None:
    try:
        from specpilot.formats.split12.linear import swap_linears
    except ImportError as e:
        raise RuntimeError(f"weights='split12' needs specpilot.formats.split12.linear.swap_linears, "
                           f"which is not available ({e})") from None
    dtype = next(model.parameters()).dtype
    if dtype != torch.bfloat16:
        raise ValueError(f"weights='split12' needs dtype bf16, got {dtype}")
    swap_linears(model)


def load_drafter(folder, target: TargetLM, weights=None) -> DFlashDrafter:
    """A drafter of any kind (DFlash, DFlash2, DSpark, PARD: detected from config.json,
    models/drafters/kinds.py); the rest of this text is DFlash's (the others: models/drafters/load.py).
    DFlash drafter from an HF folder, validated against `target` (hidden size, vocab, layer ids,
    mask token); on the target's device and dtype, sharing its embedding and LM head. weights:
    "split12" packs its linears (layers and fc) at load, "bf16" keeps them; None follows the target
    (split12 when the target's linears are): fewer bytes per draft step (docs/design.md,
    eighteenth session). The drafts can differ from a bf16 drafter's by fp32 summation order only (the
    split12 skinny pair's decode-bound grid; prompt-length calls run cuBLAS on the same weight bits),
    which moves acceptance at a near-tie at most; the target's verification keeps the output lossless."""
    _check_weights(weights, "as the target")
    where = f"drafter {folder}"
    raw = read_config_json(folder)
    from .drafters.kinds import detect_kind
    kind = detect_kind(raw, where)
    if kind != "dflash":                          # DFlash2 / DSpark / PARD: models/drafters
        from .drafters.load import load_other_drafter
        return load_other_drafter(kind, raw, folder, target, weights)
    cfg = drafter_config_from_dict(raw, where=where)
    check_block_drafter_fits(cfg, target, where)
    state = hf_names.drafter_from_hf(read_any_state_dict(folder), cfg, where=where)
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg, target)
    assign_state(drafter, state, where, target.device, target.dtype)
    drafter.eval().requires_grad_(False)
    if (weights or weights_of(target)) == "split12":
        swap_to_split12(drafter)
    drafter.ensure_rope(target.rope_cos.shape[0])
    drafter.source_dir = str(folder)
    return drafter


def check_block_drafter_fits(cfg, target: TargetLM, where: str) -> None:
    """A DFlash-family drafter config against its target: hidden size, vocab, layer ids, mask token,
    block size, each refused with a message naming both sides."""
    t = target.config
    if cfg.hidden_size != t.hidden_size:
        raise ValueError(f"{where}: hidden_size {cfg.hidden_size} != target hidden_size {t.hidden_size}")
    if cfg.vocab_size != t.vocab_size:
        raise ValueError(f"{where}: vocab_size {cfg.vocab_size} != target vocab_size {t.vocab_size}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < t.num_layers]
    if bad:
        raise ValueError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} include {bad}, outside the "
                         f"target's layers 0..{t.num_layers - 1}")
    if not 0 <= cfg.mask_token_id < t.vocab_size:
        raise ValueError(f"{where}: mask_token_id {cfg.mask_token_id} is outside the vocab (size {t.vocab_size})")
    if cfg.block_size < 1:
        raise ValueError(f"{where}: block_size {cfg.block_size} must be >= 1")


def _generation_eos(folder) -> tuple:
    path = Path(folder) / "generation_config.json"
    if not path.exists():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def stop_ids_for(target: TargetLM, tokenizer=None) -> tuple:
    """Stop tokens: generation_config.json's eos, else config.json's, else the tokenizer's eos."""
    ids = tuple(getattr(target, "eos_token_ids", ()) or ())
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids = (int(tokenizer.eos_token_id),)
    return ids


def load_tokenizer(folder):
    """The transformers tokenizer of a model folder."""
    from transformers import AutoTokenizer

    if not (Path(folder) / "tokenizer.json").exists() and not (Path(folder) / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"{folder} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(str(folder))


def load_pair(target_dir, drafter_dir=None, device="cpu", dtype=torch.bfloat16, weights=None):
    """(target, drafter, tokenizer) from HF folders or Hugging Face ids in the local HF cache (never the
    network): the target on `device` in `dtype` with `weights` ("bf16", "split12" or None: as stored),
    the drafter (None without drafter_dir) loaded against it (its weights follow the target's), and
    the target folder's tokenizer."""
    from .model_paths import resolve_model_dir

    target_dir = resolve_model_dir(target_dir, "target")
    drafter_dir = resolve_model_dir(drafter_dir, "drafter") if drafter_dir else None
    target = load_target(target_dir, device=device, dtype=dtype, weights=weights)
    drafter = load_drafter(drafter_dir, target) if drafter_dir else None
    return target, drafter, load_tokenizer(target_dir)
