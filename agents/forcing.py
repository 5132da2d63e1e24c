"""Token forcing of the whole engine with a variant switched on: the last gate before integration.

The engine provides `specpilot.verify.forcing.token_force` (docs/CONTRACTS.md), the verdict of
`specpilot verify`; this module keeps the call behind one interface, `Forcer`:
forcer(target_dir, drafter_dir, variant) -> ForcingOutcome, and passes exactly when that verdict
does (its forced paths, our speculative output against stock's and against our greedy AR output,
which is the M = 1 path an integrated GEMV variant serves, and the referee's rule). The variant is
written into the registry's manifest, which the forced engine's EngineConfig names (so its dispatch, kernels/dispatch.py, picks it up:
split12_linear with M = 1 on CUDA) before forcing and taken out again if forcing fails. The
outcome says whether the dispatch really served the variant (`variant_dispatched`). Tests pass a
fake forcer; with no engine, `engine_forcer()` is None and the loop records the winner as
kernel-validated only (not integrated).
"""
from dataclasses import dataclass, field


@dataclass
class ForcingOutcome:
    passed: bool
    reason: str
    report: dict = field(default_factory=dict)


def engine_forcer(device: str, n_prompts: int = 3, max_new_tokens: int = 48, block_size: int | None = None):
    """A Forcer backed by the engine's token_force (stock dflash vs our engine, split12 weights with
    the registry's variants), or None when the engine does not provide it."""
    try:
        import torch

        from specpilot.config import EngineConfig
        from specpilot.engine import Engine
        from specpilot.kernels.registry import variants_file
        from specpilot.models import load_drafter, load_target
        from specpilot.verify.forcing import token_force
        from specpilot.verify.referee import load_referee
        from specpilot.verify.stock import load_stock
    except ImportError:
        return None

    def force(target_dir, drafter_dir, variant: dict) -> ForcingOutcome:
        if not drafter_dir:
            return ForcingOutcome(False, "token forcing needs a drafter: stock is dflash_generate")
        dtype = torch.bfloat16  # split12 weights are bf16 by definition (the engine requires it)
        try:
            target = load_target(target_dir, device=device, dtype=dtype, weights="split12")
            manifest = str(variants_file())                     # the manifest the variant was written to
            engine = Engine(target, load_drafter(drafter_dir, target), config=EngineConfig(variants_manifest=manifest))
            stock = load_stock(target_dir, drafter_dir, device=device, dtype=dtype)
            referee = load_referee(target_dir, dtype, device)
            report = token_force(engine, stock, _prompts(target_dir, n_prompts), max_new_tokens,
                                 block_size=block_size, referee=referee)
        except Exception as e:
            return ForcingOutcome(False, f"token forcing raised {type(e).__name__}: {e}")
        summary = {k: _plain(v) for k, v in report.summary().items()}
        summary["variant_dispatched"] = _dispatched(variant, device, manifest)
        verdict = "token forcing passed " if report.passed else \
            "token forcing failed: " + "; ".join(report.reasons) + " "
        return ForcingOutcome(bool(report.passed), verdict + str(summary), summary)

    return force


def _dispatched(variant: dict, device: str, manifest: str):
    """Whether the engine's split12 dispatch serves this variant (True/False), None when the
    record names no GEMV shape. False on the GPU means forcing ran the engine's own kernel."""
    shape = variant.get("shape") if variant else None
    if not shape or len(shape) != 2:
        return None
    from specpilot.kernels.dispatch import integrated_launcher

    launch = integrated_launcher("split12_gemv", tuple(shape), device, manifest)
    return launch is not None and launch.record.get("cand_id") == variant.get("cand_id")


def _prompts(target_dir, n: int) -> list:
    """The first n HumanEval prompts of the zoo, tokenized with the target's tokenizer."""
    import json
    from pathlib import Path

    from specpilot import settings
    from specpilot.models import load_tokenizer

    tok = load_tokenizer(target_dir)
    candidates = [settings.get().zoo / "prompts" / "humaneval.jsonl",
                  Path(target_dir).resolve().parent / "prompts" / "humaneval.jsonl"]  # the zoo's own layout
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        raise FileNotFoundError(f"token forcing prompts not found in {[str(p) for p in candidates]} (set SPECPILOT_ZOO)")
    lines = path.read_text().splitlines()[:n]
    return [tok.encode(json.loads(line)["prompt"], add_special_tokens=False) for line in lines]


def _plain(v):
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return len(v)
    return str(v)
