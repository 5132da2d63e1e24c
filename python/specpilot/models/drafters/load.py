"""Loading DFlash2 / DSpark / PARD drafters from their published Hugging Face layouts, validated
against the target (hidden size, vocab, layer ids, mask / pard token, block size) before any
weight is assigned. Their linears stay bf16 (split12 packing is DFlash's for now)."""
from __future__ import annotations

import torch

from ..checkpoint import assign_state, read_any_state_dict


def load_other_drafter(kind: str, raw: dict, folder, target, weights=None):
    where = f"drafter {folder}"
    if weights == "split12":
        raise ValueError(f"{where}: weights='split12' is supported for DFlash drafters only, not {kind}")
    build = {"dflash2": _dflash2, "dspark": _dspark, "pard": _pard}[kind]
    drafter, state = build(raw, folder, target, where)
    assign_state(drafter, state, where, target.device, target.dtype)
    drafter.eval().requires_grad_(False)
    drafter.after_load()
    drafter.ensure_rope(target.rope_cos.shape[0])
    drafter.source_dir = str(folder)
    return drafter


def _dflash2(raw, folder, target, where):
    from ..loading import check_block_drafter_fits
    from .dflash2 import DFlash2Drafter, dflash2_config_from_dict, dflash2_from_hf

    cfg = dflash2_config_from_dict(raw, where)
    check_block_drafter_fits(cfg, target, where)
    state = dflash2_from_hf(read_any_state_dict(folder), cfg, where)
    with torch.device("meta"):
        return DFlash2Drafter(cfg, target), state


def _dspark(raw, folder, target, where):
    from ..loading import check_block_drafter_fits
    from .dspark import DSparkDrafter, dspark_config_from_dict, dspark_from_hf

    cfg = dspark_config_from_dict(raw, where)
    check_block_drafter_fits(cfg, target, where)
    state = dspark_from_hf(read_any_state_dict(folder), cfg, where)
    with torch.device("meta"):
        return DSparkDrafter(cfg, target), state


def _pard(raw, folder, target, where):
    from .pard import PardDrafter, pard_config_from_dict, pard_from_hf

    cfg = pard_config_from_dict(raw, target.config, where)
    state = pard_from_hf(read_any_state_dict(folder), cfg, where, folder)
    with torch.device("meta"):
        return PardDrafter(cfg, target), state
