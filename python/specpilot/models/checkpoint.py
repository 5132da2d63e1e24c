"""Loading HF-format folders into our modules: safetensors (single or sharded), name mapping,
shape checks. Everything is validated before any parameter is assigned: nothing half-loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from specpilot.progress import progress

SPLIT12_FORMAT = "split12"


def safetensors_files(folder) -> list[Path]:
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index} is malformed (needs a 'weight_map' object): {e}") from None
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) that do not exist: {missing}")
        return files
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor model.safetensors.index.json")


def checkpoint_format(folder) -> str:
    """'split12' for folders written by `specpilot pack`, else 'bf16' (plain safetensors)."""
    from safetensors import safe_open

    first = safetensors_files(folder)[0]
    try:
        with safe_open(str(first), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error type for a corrupt header
        raise ValueError(f"{first} is not a readable safetensors file: {e}") from None
    return SPLIT12_FORMAT if meta.get("format") == SPLIT12_FORMAT else "bf16"


def read_state_dict(folder, device="cpu") -> dict[str, torch.Tensor]:
    """All tensors of a plain safetensors folder (HF names), on `device`."""
    from safetensors.torch import load_file

    state = {}
    for path in safetensors_files(folder):
        try:
            part = load_file(str(path), device=str(device))
        except Exception as e:
            raise ValueError(f"{path} is not a readable safetensors file: {e}") from None
        dup = set(part) & set(state)
        if dup:
            raise ValueError(f"tensor(s) {sorted(dup)[:5]} appear in more than one shard of {folder}")
        state.update(part)
    return state


def read_any_state_dict(folder, device="cpu") -> dict[str, torch.Tensor]:
    """Plain safetensors, or a split12-packed folder (`specpilot pack`) decoded back to bf16 (bit-exact)
    with specpilot.formats.split12 (our fused modules re-pack on `weights="split12"`)."""
    if checkpoint_format(folder) != SPLIT12_FORMAT:
        return read_state_dict(folder, device)
    try:
        from specpilot.formats.split12 import io as split12_io
        from specpilot.formats.split12.reference import Split12Tensor, unpack
    except ImportError as e:
        raise RuntimeError(f"{folder} is a split12-packed checkpoint but specpilot.formats.split12 "
                           f"is not available ({e})") from None
    state = {}
    packed = split12_io.load_state_dict(folder)
    for name, value in progress(packed.items(), total=len(packed), desc=f"unpacking {folder}", unit="tensor"):
        state[name] = (unpack(value) if isinstance(value, Split12Tensor) else value).to(device)
    return state


def assign_state(module: torch.nn.Module, state: dict[str, torch.Tensor], where: str, device, dtype) -> None:
    """Loads `state` (our names) into a module built on the meta device, after checking the names and
    shapes of every tensor (so a bad checkpoint raises before anything is assigned)."""
    own = module.state_dict()                      # names -> meta tensors (tied weights under both names)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{where}: checkpoint does not fit the config: missing {missing[:8]}"
                         f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}")
    bad = [(n, tuple(state[n].shape), tuple(t.shape)) for n, t in own.items() if state[n].shape != t.shape]
    if bad:
        raise ValueError(f"{where}: tensor shapes do not match the config (name, file, expected): {bad[:6]}")
    converted = {}
    for name, t in progress(state.items(), total=len(state), desc=f"loading {where}", unit="tensor"):
        # convert each distinct tensor once (tied weights)
        key = id(t)
        if key not in converted:
            converted[key] = t.to(device=device, dtype=dtype)
    module.load_state_dict({n: converted[id(t)] for n, t in state.items()}, strict=True, assign=True)
