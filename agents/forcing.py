"""Token forcing of the whole engine with a variant switched on: the last gate before integration.

The engine provides `specpilot.verify.forcing.token_force` (docs/CONTRACTS.md). This module keeps
the call behind one interface, `Forcer`: forcer(target_dir, drafter_dir, variant) -> ForcingOutcome.
The variant is written into the registry (so the engine's dispatch, kernels/dispatch.py, picks it
up: split12_linear with M = 1 on CUDA) before forcing and taken out again if forcing fails. The
outcome says whether the dispatch really served the variant (`variant_dispatched`). Because the
dispatch serves M = 1 only, greedy AR decode is compared with stock as well (`ar_against_stock`). Tests pass a fake forcer; with no engine, `engine_forcer()` is
None and the loop records the winner as kernel-validated only (not integrated).
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

        from specpilot.engine import Engine
        from specpilot.models import load_drafter, load_target
        from specpilot.verify.forcing import token_force
        from specpilot.verify.stock import load_stock
    except ImportError:
        return None

    def force(target_dir, drafter_dir, variant: dict) -> ForcingOutcome:
        if not drafter_dir:
            return ForcingOutcome(False, "token forcing needs a drafter: stock is dflash_generate")
        dtype = torch.bfloat16  # split12 weights are bf16 by definition (the engine requires it)
        try:
            target = load_target(target_dir, device=device, dtype=dtype, weights="split12")
            engine = Engine(target, load_drafter(drafter_dir, target))
            stock = load_stock(target_dir, drafter_dir, device=device, dtype=dtype)
            prompts = _prompts(target_dir, n_prompts)
            report = token_force(engine, stock, prompts, max_new_tokens, block_size=block_size)
            ar_rows = ar_against_stock(engine, stock, prompts, max_new_tokens, block_size)
        except Exception as e:
            return ForcingOutcome(False, f"token forcing raised {type(e).__name__}: {e}")
        summary = {k: _plain(v) for k, v in report.summary().items()}
        summary["variant_dispatched"] = _dispatched(variant, device)
        bad_ar = [r for r in ar_rows if r["divergence"] and not r["divergence"]["tolerated"]]
        summary.update(ar_prompts=len(ar_rows), ar_identical=sum(r["divergence"] is None for r in ar_rows),
                       ar_mismatches=len(bad_ar))
        passed = bool(report.passed) and not bad_ar
        return ForcingOutcome(passed, ("token forcing passed " if passed else "token forcing failed ") + str(summary),
                              summary)

    return force


def ar_against_stock(engine, stock, prompts, max_new_tokens: int, block_size=None) -> list:
    """Greedy AR decode (M = 1 every step: the path an integrated GEMV variant serves; token_force's
    forced pass and spec verify run M > 1) against stock's transcript, compared up to the first
    divergence. A divergence passes only at a stock near-tie (top-2 margin < eps, token_force's rule)."""
    from specpilot.verify.forcing import eps_for
    from specpilot.verify.stock import hf_logits, run_stock

    rows = []
    for prompt in prompts:
        ref = run_stock(stock, prompt, max_new_tokens, (), 0.0, block_size).tokens
        ours = engine.generate_ar(list(prompt), max_new_tokens).tokens
        n = min(len(ours), len(ref))
        j = next((i for i in range(n) if ours[i] != ref[i]), n)
        row = {"tokens": n, "identical_prefix": j, "divergence": None}
        if j < n:
            top2 = hf_logits(stock, list(prompt) + ref)[len(prompt) - 1 + j].topk(2).values.tolist()
            margin, eps = top2[0] - top2[1], eps_for(engine.target.dtype, top2[0])
            row["divergence"] = {"position": j, "ours": ours[j], "stock": ref[j], "margin": margin, "eps": eps,
                                 "tolerated": margin < eps}
        rows.append(row)
    return rows


def _dispatched(variant: dict, device: str):
    """Whether the engine's split12 dispatch serves this variant (True/False), None when the
    record names no GEMV shape. False on the GPU means forcing ran the engine's own kernel."""
    shape = variant.get("shape") if variant else None
    if not shape or len(shape) != 2:
        return None
    from specpilot.kernels.dispatch import integrated_launcher

    launch = integrated_launcher("split12_gemv", tuple(shape), device)
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
