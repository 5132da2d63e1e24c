"""Integration of a round's winner: token-force the engine with it on, then keep it in the registry.

Order: write the variant's source next to the kernel cache, put its record in the registry
(atomic), token-force; a failed forcing, or one that ran without the variant dispatched
(`variant_dispatched` not true: it judged another kernel), puts the previous record back. With no forcer (the engine
cannot token-force yet) nothing is written to the registry: the winner stays kernel-validated only
(it still becomes the incumbent the search continues from, and the memory says which it is).
Replaying this after a kill rewrites the same files with the same content (idempotent).
"""
import time

from specpilot import settings
from specpilot.kernels import registry


def _save_source(cand) -> str | None:
    if not cand.source:
        return None
    folder = settings.get().kernel_cache / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cand.cand_id}.cu"
    if not path.exists():
        path.write_text(cand.source)
    return str(path)


def integrate_winner(cfg, deployment: str, gap, best, best_t, before, forcer, log):
    """-> (integrated, note, evidence)."""
    gpu = deployment.split("|")[0]
    record = {"cand_id": best.cand_id, "label": best.label, "params": best.params, "kind": best.kind,
              "shape": list(gap.shape), "time_s": best_t, "baseline_s": before, "source_path": _save_source(best),
              "deployment": deployment, "integrated_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    evidence = {"gate": "passed", "time_s": best_t, "incumbent_s": before, "timer": cfg.timer.get("kind")}
    if gap.op == "engine.block_size":
        # knob candidates were token-forced end to end when they were evaluated (agents/knobs.py)
        registry.integrate_variant(gpu, gap.op, gap.shape, record)
        return True, "integrated (token-forced when evaluated)", evidence
    if forcer is None:
        return False, "kernel-validated only: no token forcing available, so not integrated", evidence
    previous = registry.integrate_variant(gpu, gap.op, gap.shape, record)
    outcome = forcer(cfg.target_dir, cfg.drafter_dir, record)
    evidence["forcing"] = {"passed": outcome.passed, "reason": outcome.reason, **outcome.report}
    if not outcome.passed:
        registry.restore_variant(gpu, gap.op, gap.shape, previous)
        log(f"  token forcing rejected {best.label}: {outcome.reason}")
        return False, f"not integrated: {outcome.reason}", evidence
    if outcome.report.get("variant_dispatched") is not True:  # forcing judged some other kernel
        registry.restore_variant(gpu, gap.op, gap.shape, previous)
        why = f"token forcing ran without the variant dispatched (variant_dispatched={outcome.report.get('variant_dispatched')})"
        log(f"  {best.label} not integrated: {why}")
        return False, f"not integrated: {why}", evidence
    return True, f"integrated; {outcome.reason}", evidence
