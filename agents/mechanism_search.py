"""The search over engine mechanisms for one deployment.

From a start assignment (by default the de-tuned one: every switch off), each candidate changes the
incumbent by one mechanism value (or, when starting from memory, adopts the nearest deployment's
winner whole, then its single changes); the cost model's gap ranking of the incumbent decides which
family's mechanisms go first. Every candidate is measured end to end by a pluggable evaluator,
gated (its outputs must equal the reference token for token: verify.spec_checks.first_fork) and
recorded in memory with its gain, verdict and reasons. A candidate replaces the incumbent when it
passes the gate and is faster by more than `min_gain`. Evaluator errors are verdicts, never a crash
of the search. An evaluator that runs nothing (the cost model) yields verdict "estimate": its winners
are recorded as such, never as validated.

Evaluator protocol: name, forced (bool), models(mechanism) -> bool, gaps(deployment, assignment) ->
{family: seconds lost per token}, reference(deployment) -> [token lists] (forced only), and
__call__(deployment, assignment) -> object with tokens_per_s, outputs ([token lists] or None), label, and
optionally allows(mechanism name, value) -> bool (values the pair cannot run: a block longer than the
drafter's), noisy (bool) with time(deployment, assignment) -> tokens/s (a measured evaluator: a would-be
winner is re-timed beside the incumbent, see _Search._paired), and confirm(deployment, assignment) -> (verdict, reasons) or None: a full verdict (token_force
in bf16, engine_evaluator.py) that a would-be incumbent must also pass; with reference() None the
start's outputs, once confirmed, are the reference the other candidates must equal.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from specpilot.agents.deployment import Deployment, distance
from specpilot.agents.mechanisms import FAMILIES, plainest, registry
from specpilot.verify.spec_checks import first_fork


@dataclass
class SearchResult:
    run_id: str
    deployment: str
    evaluator: str
    baseline_tokens_per_s: float
    best_tokens_per_s: float
    best_config: dict
    verdict: str                       # pass (token-forced) | estimate (nothing ran)
    evaluations: int
    trajectory: list = field(default_factory=list)   # best tokens/s after each evaluation
    transferred_from: str | None = None
    skipped: list = field(default_factory=list)      # applicable mechanisms the evaluator cannot see
    shipped_tokens_per_s: float | None = None        # the hand-tuned defaults, measured after the search

    def to_dict(self) -> dict:
        return dict(vars(self))


def gate(reference, outputs) -> tuple:
    """(verdict, reasons): "pass" iff every output equals its reference token for token; "estimate"
    when nothing ran (outputs None)."""
    if outputs is None:
        return "estimate", ["not token-forced: the evaluator produced no outputs (a cost-model estimate)"]
    if reference is None or len(reference) != len(outputs):
        return "reject", [f"{len(outputs)} outputs against {None if reference is None else len(reference)} references"]
    reasons = []
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        fork = first_fork(list(out), list(ref))
        if fork is not None:
            got = out[fork] if fork < len(out) else "end"
            want = ref[fork] if fork < len(ref) else "end"
            reasons.append(f"prompt {i}: token {fork} is {got}, the reference's is {want}")
    return ("pass" if not reasons else "reject"), reasons


def nearest_winner(memory, dep: Deployment, evaluator) -> dict | None:
    """The nearest other deployment's winner this search may start from: token-forced winners for a
    forced evaluator; for an estimating one, winners of the same evaluator."""
    rows = [w for w in memory.mech_winners() if w["deployment"] != dep.key and
            (w["verdict"] == "pass" if evaluator.forced else w["evaluator"] == evaluator.name)]
    if not rows:
        return None
    return min(rows, key=lambda w: (distance(dep, Deployment.from_key(w["deployment"])), w["deployment"]))


class _Search:
    def __init__(self, dep, evaluator, memory, run_id, budget, min_gain, log, time_budget_s=None):
        self.dep, self.ev, self.memory, self.run_id = dep, evaluator, memory, run_id
        self.budget, self.min_gain, self.log = budget, min_gain, log
        self.deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
        self.repeats, self.sigmas = 5, 3.0     # paired re-timing of a noisy evaluator's would-be winner
        self.reference = evaluator.reference(dep) if evaluator.forced else None
        # a forced evaluator with no independent reference (bf16): the start's outputs become the
        # reference once its full verdict (confirm) passed
        self.adopt = evaluator.forced and self.reference is None
        self.seen = {}            # frozen assignment -> tokens/s (None: failed)
        self.seq = 0
        self.best_a, self.best_t = None, None
        self.trajectory = []

    def _confirm(self, a) -> tuple | None:
        confirm = getattr(self.ev, "confirm", None)
        return confirm(self.dep, a) if confirm is not None else None

    def evaluate(self, a: dict, compete: bool = True) -> float | None:
        """Measures, gates and records one assignment; returns its tokens/s when it passed the gate
        (or is an estimate), None otherwise. A candidate about to become the incumbent also passes the
        evaluator's full verdict (confirm: token_force in bf16) first. compete=False: a reference
        measurement (the shipped configuration) that never becomes the incumbent."""
        key = frozenset(a.items())
        if key in self.seen and compete:
            return self.seen[key]
        wins = False
        try:
            out = self.ev(self.dep, a)
            tps, label = float(out.tokens_per_s), out.label
            if self.adopt and self.reference is None:
                verdict, reasons = self._confirm(a) or ("reject", ["the evaluator has no reference and no verdict"])
                if verdict == "pass":
                    self.reference = out.outputs
            else:
                verdict, reasons = gate(self.reference, out.outputs)
            if not tps > 0:
                verdict, reasons = "reject", reasons + [f"tokens/s {tps} is not positive"]
            wins = verdict in ("pass", "estimate") and compete and self.best_t is not None and tps > self.best_t * (1.0 + self.min_gain)
            if wins and getattr(self.ev, "noisy", False):
                wins, paired = self._paired(a)
                label += f"; paired re-timing: {paired}"
            if wins and (confirmed := self._confirm(a)) is not None and confirmed[0] != "pass":
                verdict, reasons = "reject", [f"full verdict: {r}" for r in confirmed[1]] or ["full verdict failed"]
        except Exception as e:   # a candidate that crashes is a verdict, not the end of the search
            verdict, reasons, tps, label = "crash", [f"{type(e).__name__}: {e}"[:500]], None, ""
        changed = {k: v for k, v in a.items() if self.best_a is None or self.best_a.get(k) != v}
        gain = tps / self.best_t - 1.0 if (tps and self.best_t) else None
        self.memory.record_mech_eval(self.run_id, self.seq, self.dep.key, a, changed, self.ev.name, tps, gain,
                                     verdict, reasons, label)
        self.seq += 1
        ok = tps if verdict in ("pass", "estimate") else None
        if not compete:
            self.log(f"  [ref] the shipped configuration: {verdict} {tps or 0:.1f} tok/s")
            return ok
        self.seen[key] = ok
        if ok is not None and (self.best_t is None or (wins and ok > self.best_t * (1.0 + self.min_gain))):
            self.best_a, self.best_t = dict(a), ok
        self.trajectory.append(self.best_t)
        text = ", ".join(f"{k}={v}" for k, v in changed.items()) or "start"
        gain_text = f"{gain:+.1%}" if gain is not None else "-"
        self.log(f"  [{self.seq:>3}] {text:<60} {verdict:<8} {tps or 0:10.1f} tok/s {gain_text}"
                 + (f"  ({reasons[0]})" if verdict not in ("pass", "estimate") else ""))
        return ok

    def _paired(self, a: dict) -> tuple:
        """A noisy evaluator's would-be winner, re-timed beside the incumbent, interleaved (the order
        alternating) `repeats` times: it wins only when the mean paired gain exceeds min_gain of the
        incumbent and `sigmas` standard errors of the paired differences. -> (wins, text)."""
        import math
        import statistics

        inc, cand = [], []
        for r in range(self.repeats):
            for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                (inc if which == 0 else cand).append(self.ev.time(self.dep, self.best_a if which == 0 else a))
        diffs = [c - i for c, i in zip(cand, inc)]
        mean = statistics.fmean(diffs)
        sem = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
        floor = self.min_gain * statistics.fmean(inc)
        wins = mean > max(floor, self.sigmas * sem)
        return wins, (f"mean gain {mean:.1f} tok/s vs {self.sigmas:g} x {sem:.1f} standard error and a {floor:.1f} "
                      f"floor over {len(diffs)} interleaved pairs: {'wins' if wins else 'noise'}")

    @property
    def left(self) -> int:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return 0
        return self.budget - len(self.trajectory)


def _gaps(evaluator, dep, a, log) -> dict:
    try:
        return evaluator.gaps(dep, a)
    except Exception as e:   # no ranking is a slower search, not a failed one
        log(f"  gap ranking unavailable ({type(e).__name__}: {e}): registry order")
        return {}


def _ranked(mechs, gaps: dict, prior: dict) -> list:
    """Mechanisms ordered by the prior from memory (see _prior; cold: none), then by their family's time
    lost per token (largest first), then by the sensitivity memory measured, registry order last."""
    rank = {fam: -gaps.get(fam, 0.0) for fam in FAMILIES}
    return sorted(mechs, key=lambda m: (prior.get(m.name, (0, 0.0))[0], rank[m.family], -prior.get(m.name, (0, 0.0))[1]))


def _prior(memory, winner: dict, start: dict, names) -> dict:
    """mechanism -> (group, sensitivity) from the source deployment's search: group 0 for mechanisms
    the source could not search (new here: the batching mechanisms going from C = 1 to C > 1), 1 for
    those the source left at their start value, 2 for the source's winners (trusted: their reversal
    is tried last). Sensitivity: the largest |gain| of a single-mechanism change the source measured
    (a mechanism that mattered there is tried earlier within its group)."""
    sens = {}
    for e in memory.mech_evals(run_id=winner["run_id"]):
        if len(e["changed"]) == 1 and e["gain"] is not None:
            (name,) = e["changed"]
            sens[name] = max(sens.get(name, 0.0), abs(e["gain"]))
    prior = {}
    for name in names:
        group = 0 if name not in winner["config"] else (2 if winner["config"][name] != start.get(name) else 1)
        prior[name] = (group, sens.get(name, 0.0))
    return prior


def search_mechanisms(dep: Deployment, evaluator, memory, budget: int = 40, start: dict | None = None,
                      from_memory: bool = True, min_gain: float = 0.01, compare_shipped: bool = False,
                      time_budget_s: float | None = None, log=print) -> SearchResult:
    """compare_shipped: also measure the shipped (hand-tuned) configuration once after the search,
    outside the budget and never as a candidate, to state how much of it the search recovered."""
    if budget < 1:
        raise ValueError(f"budget {budget} must be >= 1 evaluation")
    applicable = [m for m in registry() if dep.supports(m.scope)]
    mechs = [m for m in applicable if evaluator.models(m)]
    skipped = [m.name for m in applicable if not evaluator.models(m)]
    names = {m.name: m for m in mechs}
    start = plainest(mechs) if start is None else dict(start)
    bad = [k for k in start if k not in names]
    if bad:
        raise ValueError(f"start assignment names mechanisms this deployment / evaluator cannot search: {bad}")
    start = {**{m.name: m.default for m in mechs}, **start}   # every searched mechanism named
    run_id = f"mech-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{dep.key}"
    memory.upsert_deployment(dep.key, dep.info())
    memory.start_run(run_id, dep.key, {"search": "mechanisms", "evaluator": evaluator.name, "budget": budget,
                                       "start": start, "from_memory": from_memory, "skipped": skipped})
    log(f"mechanism search {run_id}: {len(mechs)} mechanisms, {evaluator.name}"
        + (f"; not seen by this evaluator: {', '.join(skipped)}" if skipped else ""))
    s = _Search(dep, evaluator, memory, run_id, budget, min_gain, log, time_budget_s)
    allows = getattr(evaluator, "allows", lambda name, value: True)
    if s.evaluate(start) is None:
        memory.finish_run(run_id, "failed")
        raise RuntimeError(f"the start assignment failed its gate on {dep.key}: "
                           f"{memory.mech_evals(run_id=run_id)[-1]['reasons']}")
    baseline = s.best_t
    queue, source, prior = [], None, {}
    winner = nearest_winner(memory, dep, evaluator) if from_memory else None
    if winner is not None:
        source = winner["deployment"]
        moved = {k: v for k, v in winner["config"].items() if k in names and v in names[k].values and allows(k, v)}
        log(f"  starting from memory: {source}'s winner ({len(moved)} mechanisms)")
        prior = _prior(memory, winner, start, names)
        queue.append(moved)                                     # the winner whole, then each of its changes
        queue += [{k: v} for k, v in moved.items() if start.get(k) != v]
    while s.left > 0:
        if queue:
            cand = {**s.best_a, **queue.pop(0)}
            if frozenset(cand.items()) not in s.seen:
                s.evaluate(cand)
            continue
        before = s.best_a
        for m in _ranked(mechs, _gaps(evaluator, dep, s.best_a, log), prior):
            for v in [v for v in m.values if allows(m.name, v)]:
                cand = {**s.best_a, m.name: v}
                if frozenset(cand.items()) in s.seen or s.left <= 0:
                    continue
                s.evaluate(cand)
                if s.best_a is not before:
                    break       # re-rank the gaps from the new incumbent
            if s.best_a is not before or s.left <= 0:
                break
        if s.best_a is before:
            break               # a whole pass found nothing better: a local optimum
    shipped = s.evaluate({m.name: m.default for m in mechs}, compete=False) if compare_shipped else None
    verdict = "pass" if evaluator.forced else "estimate"
    memory.record_mech_winner(dep.key, evaluator.name, run_id, s.best_a, s.best_t, baseline, verdict, source)
    memory.finish_run(run_id)
    log(f"  best {s.best_t:.1f} tok/s ({s.best_t / baseline:.2f}x the start) after {len(s.trajectory)} evaluations"
        + (f"; {s.best_t / shipped:.1%} of the shipped configuration's {shipped:.1f} tok/s" if shipped else ""))
    return SearchResult(run_id, dep.key, evaluator.name, baseline, s.best_t, s.best_a, verdict, len(s.trajectory),
                        s.trajectory, source, skipped, shipped)
