"""The optimization loop. Each round: take the largest gap the agents can act on, let K proposers
suggest candidates (in parallel), judge each in a worker (gate + timing, the incumbent re-measured
beside them), re-time the best against the incumbent side by side (interleaved, repeated: it wins
only by more than the measured noise), token-force the winner and integrate it, record everything.

Resume: a round's candidate list is recorded before any evaluation, each evaluation commits on its
own, and a round closes in one transaction; `resume=True` continues the last unfinished run of the
deployment, re-using recorded proposals and skipping judged candidates.
"""
import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from specpilot import settings
from specpilot.agents import gaps as gapmod
from specpilot.agents.integrate import integrate_winner
from specpilot.agents.memory import Memory
from specpilot.agents.proposers import ProposalContext
from specpilot.agents.proposers.builtin import BuiltinProposer
from specpilot.agents.workers import make_pool


@dataclass
class LoopConfig:
    target_dir: str
    drafter_dir: str | None = None
    ops: tuple = ("split12_gemv", "engine.block_size")
    rounds: int = 4
    agents: int = 2
    per_agent: int = 3                   # candidates per proposer per round
    memory_url: str = ""
    resume: bool = False
    time_budget_s: float | None = None
    device: str = "cpu"
    timer: dict = field(default_factory=lambda: {"kind": "cpu"})
    workers: int = 1                     # one per GPU on the GPU
    timeout_s: float = 120.0
    backend: str = "process"             # process | ray
    batch: int = 1
    block_size: int | None = None
    seed: int = 0
    shapes: list | None = None           # explicit GEMV gaps [(name, N, K, count)] instead of the cost model
    llm: dict | None = None              # {"base_url", "model", "api_key", "token_budget"}
    noise_sigmas: float = 3.0            # a winner beats the incumbent by more than this many standard
    repeats: int = 5                     # errors of the paired differences over this many repeats
    out_dir: str | None = None
    quick_cost: bool = True


def run_optimize(cfg: LoopConfig, forcer="auto", knob_evaluator=None, log=print) -> dict:
    memory = Memory(cfg.memory_url or settings.get().memory_url)
    deployment, dep_info = gapmod.deployment_key(cfg)
    memory.upsert_deployment(deployment, dep_info)
    run_id = memory.last_unfinished_run(deployment) if cfg.resume else None
    if cfg.resume and run_id is None:
        log(f"resume: no unfinished run for {deployment}; starting a new one")
    if run_id is None:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        memory.start_run(run_id, deployment, {"seed": cfg.seed, "rounds": cfg.rounds, "agents": cfg.agents,
                                              "ops": list(cfg.ops), "timer": cfg.timer})
        log(f"run {run_id} on {deployment}")
    else:
        log(f"resuming run {run_id} on {deployment}")
    seed = memory.run_args(run_id).get("seed", cfg.seed)

    copy_bw, gaps = gapmod.load_or_measure_gaps(memory, run_id, deployment, cfg, log)
    if forcer == "auto":
        from specpilot.agents.forcing import engine_forcer

        forcer = engine_forcer(cfg.device, block_size=cfg.block_size)
    state = gapmod.GapState(gaps, copy_bw, cfg)
    state.seed_incumbents(memory, deployment, run_id, log)
    proposers = _proposers(cfg, log)
    pool = make_pool(cfg.workers, cfg.device, cfg.timeout_s, cfg.backend)
    started = time.monotonic()
    try:
        for rnd in range(cfg.rounds):
            existing = {r["round"]: r for r in memory.rounds(run_id)}
            if existing.get(rnd, {}).get("status") == "done":
                state.replay_round(memory, run_id, existing[rnd])
                continue
            if cfg.time_budget_s is not None and time.monotonic() - started > cfg.time_budget_s:
                log(f"time budget of {cfg.time_budget_s:.0f} s used: stopping before round {rnd}")
                break
            gap = state.gap(existing[rnd]["gap_key"]) if rnd in existing else state.next_gap(knob_evaluator)
            if gap is None:
                log("no actionable gap left")
                break
            _round(cfg, memory, run_id, deployment, rnd, gap, state, proposers, pool, seed, forcer,
                   knob_evaluator, log)
        memory.finish_run(run_id)
    finally:
        pool.close()
    from specpilot.agents.report import write_report

    report = write_report(memory, run_id, deployment, state, cfg.out_dir)
    log(report["markdown"])
    return {"run_id": run_id, "deployment": deployment, "best": state.summary(), "report_path": report["path"]}


class FallbackProposer:
    """The LLM agent, replaced for the rest of the run by a built-in proposer the first time the
    LLM turns out to be unusable (no client package, endpoint unreachable): one message, no crash."""

    def __init__(self, make_llm, log):
        self.fallback, self.log = BuiltinProposer(), log
        from specpilot.agents.proposers.llm import LLMUnavailable

        self.unavailable = LLMUnavailable
        try:
            self.llm = make_llm()
        except LLMUnavailable as e:
            self._give_up(e)
        self.name = self.llm.name if self.llm is not None else self.fallback.name

    def _give_up(self, e) -> None:
        self.llm = None
        self.log(f"LLM proposer unavailable ({e}): this run continues with the built-in proposer")

    def propose(self, ctx):
        if self.llm is not None:
            try:
                return self.llm.propose(ctx)
            except self.unavailable as e:
                self._give_up(e)
        return self.fallback.propose(ctx)


def _proposers(cfg: LoopConfig, log=print) -> list:
    proposers = [BuiltinProposer() for _ in range(max(1, cfg.agents))]
    if cfg.llm and cfg.llm.get("base_url") and cfg.llm.get("model"):
        def make_llm():
            from specpilot.agents.proposers.llm import LLMProposer

            return LLMProposer(cfg.llm["base_url"], cfg.llm["model"], cfg.llm.get("api_key", ""),
                               token_budget=int(cfg.llm.get("token_budget", 200_000)),
                               usd_per_mtok=cfg.llm.get("usd_per_mtok"), usd_budget=cfg.llm.get("usd_budget"),
                               token_param=cfg.llm.get("token_param") or "max_tokens")
        proposers[-1] = FallbackProposer(make_llm, log)  # the last agent is the LLM
    return proposers


def _propose(cfg, memory, run_id, rnd, gap, state, proposers, seed, log) -> list:
    recorded = memory.round_candidates(run_id, rnd)
    if recorded:
        return recorded
    history = memory.gap_history(run_id, gap.key)
    ctxs = [ProposalContext(gap.op, gap.shape, cfg.device, rnd, i, cfg.per_agent, seed, gap.incumbent,
                            gap.best_time, gap.ceiling_s, history) for i in range(len(proposers))]

    def ask(pair):
        proposer, ctx = pair
        try:
            return proposer.propose(ctx)
        except Exception as e:  # one failing proposer (an LLM endpoint down) must not stop the round
            log(f"  proposer {getattr(proposer, 'name', proposer)} failed: {type(e).__name__}: {e}")
            return []

    with ThreadPoolExecutor(max_workers=len(proposers)) as ex:
        proposed = [c for batch in ex.map(ask, zip(proposers, ctxs)) for c in batch]
    first = [c for c in (gap.incumbent_candidate(), *gap.pending_transfers) if c is not None]
    gap.pending_transfers = []
    seen, out = set(), []
    for c in first + proposed:
        if c.cand_id not in seen:
            seen.add(c.cand_id)
            out.append(c)
    memory.record_proposals(run_id, rnd, gap.key, out)
    return out


def _round(cfg, memory, run_id, deployment, rnd, gap, state, proposers, pool, seed, forcer, knob_evaluator, log):
    cands = _propose(cfg, memory, run_id, rnd, gap, state, proposers, seed, log)
    judged = memory.evaluated(run_id, rnd)
    todo = [c for c in cands if c.cand_id not in judged]
    log(f"[round {rnd}] gap {gap.key} ({gap.op} {gap.shape_text}): {len(cands)} candidates "
        f"({len(cands) - len(todo)} already judged), incumbent {gap.incumbent_label}")

    def record(i, result):
        c = todo[i]
        meas = {"time_s": result["time_s"]} if result.get("time_s") is not None else {}
        for k, v in (result.get("timing_extra") or {}).items():
            meas[k] = v
        memory.record_evaluation(run_id, rnd, c, result["verdicts"], meas, result.get("timing_label", ""))
        judged[c.cand_id] = {"passed": all(v["passed"] for v in result["verdicts"]), "time_s": result.get("time_s")}
        verdict = "pass" if judged[c.cand_id]["passed"] else "REJECT " + _first_fail(result["verdicts"])
        t = f" {result['time_s'] * 1e6:.2f} us" if result.get("time_s") is not None else ""
        log(f"    {c.proposer:<10} {c.label:<24} {verdict}{t}")

    if gap.op == "engine.block_size":
        from specpilot.agents.knobs import evaluate_knob

        for i, c in enumerate(todo):
            record(i, evaluate_knob(c, knob_evaluator))
    else:
        tasks = [{"candidate": c.to_dict(), "device": cfg.device, "timer": cfg.timer,
                  "copy_bandwidth": state.roofline_bandwidth} for c in todo]
        pool.run(tasks, on_result=record)

    inc_id = gap.incumbent.cand_id if gap.incumbent is not None else None
    before = judged.get(inc_id, {}).get("time_s") if inc_id else None
    passing = [(judged[c.cand_id]["time_s"], c) for c in cands
               if judged.get(c.cand_id, {}).get("passed") and judged[c.cand_id]["time_s"] is not None]
    best_t, best = min(passing, key=lambda tc: tc[0]) if passing else (None, None)
    if before is None and inc_id is not None:
        log(f"  incumbent {gap.incumbent_label} failed its gate this round: it stays out of integration")
    paired = None
    if best is not None and best.cand_id != inc_id and before is not None:
        paired = _paired(cfg, pool, gap.incumbent, best, knob_evaluator if gap.op == "engine.block_size" else None)
        if paired.get("incumbent_s"):
            before, best_t = paired["incumbent_median_s"], paired["candidate_median_s"]
    wins = best is not None and best.cand_id != inc_id and (before is None or bool(paired and paired.get("wins")))
    if not wins:
        note = "no candidate passed the gates" if best is None else (
            "no candidate beat the incumbent" if best.cand_id == inc_id else
            f"{best.label} did not beat the incumbent beyond the noise: {_paired_text(paired)}")
        memory.finish_round(run_id, rnd, None, before, before, False, note, None)
        gap.observe(gap.incumbent, before, False, before)
        log(f"  round {rnd}: {note}; best so far {gap.best_text}")
        return
    integrated, note, evidence = integrate_winner(cfg, deployment, gap, best, best_t, before, forcer, log)
    if paired is not None:
        evidence["paired"] = paired
    mechanism = {"deployment": deployment, "op": gap.op, "shape": gap.shape, "cand_id": best.cand_id,
                 "label": best.label, "params": best.params, "before_s": before, "after_s": best_t,
                 "integrated": integrated, "evidence": evidence}
    memory.finish_round(run_id, rnd, best.cand_id, before, best_t, integrated, note, mechanism)
    gap.observe(best, best_t, True, before)
    speed = f"{before / best_t:.2f}x" if before else "n/a"
    log(f"  round {rnd}: winner {best.label} {best_t * 1e6:.2f} us ({speed} over the incumbent); {note}")


def _paired(cfg, pool, incumbent, best, knob_evaluator=None) -> dict:
    """Incumbent and candidate re-timed side by side, interleaved, cfg.repeats times (kernels in one
    worker; engine knobs through the knob evaluator). The candidate wins when the mean paired
    difference exceeds noise_sigmas standard errors of the differences."""
    if knob_evaluator is not None:
        from specpilot.agents.knobs import evaluate_knob

        r = {"verdicts": [], "incumbent_s": [], "candidate_s": []}
        for rep in range(cfg.repeats):
            for key, c in ((("incumbent_s", incumbent), ("candidate_s", best))[::1 if rep % 2 == 0 else -1]):
                out = evaluate_knob(c, knob_evaluator)
                if out["time_s"] is None:
                    r = {"verdicts": out["verdicts"]}
                    break
                r[key].append(out["time_s"])
            if "incumbent_s" not in r:
                break
    else:
        task = {"pair": [incumbent.to_dict(), best.to_dict()], "device": cfg.device, "timer": cfg.timer,
                "repeats": cfg.repeats}
        (r,) = pool.run([task])
    if not r.get("incumbent_s"):
        return {"wins": False, "failed": _first_fail(r["verdicts"])}
    diffs = [a - b for a, b in zip(r["incumbent_s"], r["candidate_s"])]
    mean = statistics.fmean(diffs)
    sem = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return {"incumbent_s": r["incumbent_s"], "candidate_s": r["candidate_s"],
            "incumbent_median_s": statistics.median(r["incumbent_s"]),
            "candidate_median_s": statistics.median(r["candidate_s"]),
            "mean_diff_s": mean, "sem_s": sem, "sigmas": cfg.noise_sigmas,
            "wins": mean > 0 and mean > cfg.noise_sigmas * sem}


def _paired_text(paired) -> str:
    if not paired:
        return "not re-timed"
    if "failed" in paired:
        return f"paired re-timing failed: {paired['failed']}"
    return (f"mean gain {paired['mean_diff_s'] * 1e6:.3f} us vs {paired['sigmas']:g} x "
            f"{paired['sem_s'] * 1e6:.3f} us standard error over {len(paired['incumbent_s'])} interleaved repeats")


def _first_fail(verdicts) -> str:
    for v in verdicts:
        if not v["passed"]:
            return f"[{v['check']}] {v.get('reason', '')}"[:160]
    return ""


def geometric_mean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
