"""Which drafter a checkpoint holds, from its config.json alone (the published layouts):

  pard     a plain causal LM (Qwen3 / LLaMA architecture) whose config has `pard_token`
  dflash2  architectures[0] == "DFlash2DraftModel"
  dspark   an architecture named *DSpark* (deepseek-ai's Qwen3DSparkModel) or a `markov_rank` key
  dflash   architectures[0] == "DFlashDraftModel" with a `dflash_config`
"""
from __future__ import annotations

KINDS = ("dflash", "dflash2", "dspark", "pard")


def detect_kind(cfg: dict, where: str = "drafter") -> str:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if cfg.get("pard_token") is not None:
        return "pard"
    if arch == "DFlash2DraftModel":
        return "dflash2"
    if (arch and "DSpark" in arch) or cfg.get("markov_rank") is not None or isinstance(cfg.get("dspark_config"), dict):
        return "dspark"
    if arch == "DFlashDraftModel":
        dcfg = cfg.get("dflash_config") or {}
        if any(k in dcfg for k in ("conv_kernel_size", "selector_rank")):
            raise ValueError(f"{where}: architecture DFlashDraftModel with DFlash2 keys (conv / selector) in "
                             f"dflash_config: a DFlash2 checkpoint must say DFlash2DraftModel")
        return "dflash"
    raise ValueError(f"{where}: cannot tell the drafter kind from config.json (architectures={archs}, no "
                     f"pard_token / markov_rank); supported kinds: {', '.join(KINDS)} (DFlashDraftModel, "
                     f"DFlash2DraftModel, *DSpark* architectures, a causal LM with pard_token)")


def verify_block_size(kind: str, cfg: dict) -> int:
    """The engine's default verify block (anchor + drafts) of a drafter, from its config.json:
    block_size for DFlash / DFlash2 (the anchor row drafts nothing), block_size + 1 for DSpark (every
    row drafts), pard_draft_k + 1 for PARD (12 + 1 when absent, PARD's default K)."""
    if kind == "pard":
        return int(cfg.get("pard_draft_k", 12)) + 1
    inner = cfg.get("dflash_config") or cfg.get("dspark_config") or {}
    block = inner.get("block_size", cfg.get("block_size"))
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"drafter config has no usable block_size (got {block!r})")
    return block + 1 if kind == "dspark" else block
