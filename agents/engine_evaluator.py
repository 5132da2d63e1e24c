"""The engine evaluator: a mechanism assignment run end to end on a real checkpoint pair and gated.

Timing: every prompt generated with the assignment's EngineConfig (concurrency 1: Engine.generate_spec
per prompt; concurrency C > 1: the batched engine with its BatchConfig over all prompts at once);
tokens per second over the decode wall time, best of `repeats`. With `replay_tau` (the scale tier:
random weights accept ~nothing) the timed runs replay that tau over the target's own AR transcript
(engine/replay.py, a timing tool), and the gate judges a separate run without replay.

Gate, by precision:
- fp32 (the CPU): the outputs must equal transformers' greedy generation of the target alone
  (verify.target_greedy: lossless means exactly that), token for token.
- bf16 (the GPU): the full verdict (confirm) is verify.forcing.token_force on the single-request
  engine with the assignment's EngineConfig (forced paths, the referee's rule), and at C > 1 each
  batched output must also equal that engine's own output (strict: a bf16 near-tie fork between batch
  shapes rejects the candidate rather than risk passing a bug). It is run on the start, whose outputs
  then become the reference every candidate must equal token for token, and on every candidate about
  to become the incumbent (what the issue asks: every integrated change token-forced).
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

import torch

from specpilot.agents.mechanisms import configs_for

# Not searched by this evaluator: torch.compile of every layer takes minutes per candidate, more
# than a 10-minute search can spend on one (opt-in: it stays off unless set by hand).
SLOW = {"engine.compile_layers"}
SEEN_ON_CPU = {"engine.fused_steps", "engine.two_level", "batch.ragged_verify", "batch.batched_draft",
               "batch.adaptive_verify", "batch.verify_prefix", "batch.page_size", "batch.prefill_chunk",
               "run.block_size"}


@dataclass
class EngineRun:
    tokens_per_s: float
    outputs: list
    label: str


class EngineEvaluator:
    forced = True

    def __init__(self, target_dir, drafter_dir, prompts, max_new_tokens: int = 32, device: str = "cpu",
                 dtype=torch.float32, repeats: int = 1, replay_tau: float | None = None):
        """drafter_dir: a drafter folder, or a list of those that fit the target (run.drafter picks one)."""
        from specpilot.agents.mechanisms import MAX_DRAFTERS
        from specpilot.models import load_drafter, load_target

        if not prompts or not all(prompts):
            raise ValueError("EngineEvaluator needs at least one non-empty prompt (token-id lists)")
        self.drafter_dirs = [drafter_dir] if isinstance(drafter_dir, (str, os.PathLike)) else list(drafter_dir)
        if not 1 <= len(self.drafter_dirs) <= MAX_DRAFTERS:
            raise ValueError(f"EngineEvaluator takes 1 to {MAX_DRAFTERS} drafters, got {len(self.drafter_dirs)}")
        self.target_dir, self.device, self.dtype = target_dir, device, dtype
        self.prompts = [list(map(int, p)) for p in prompts]
        self.max_new_tokens, self.repeats, self.replay_tau = max_new_tokens, repeats, replay_tau
        self._transcripts = {}
        self._referee = None
        self.name = f"engine-{device}-{str(dtype).replace('torch.', '')}"
        self._targets, self._drafters, self._stocks = {}, {}, {}
        self._load_target, self._load_drafter = load_target, load_drafter
        self.stock = self._stock(0)

    def _stock(self, drafter: int):
        """The stock pair of the target and drafter `drafter` (forcing's reference run)."""
        from specpilot.verify.stock import load_stock

        if drafter not in self._stocks:
            self._stocks[drafter] = load_stock(self.target_dir, self.drafter_dirs[drafter], device=self.device,
                                               dtype=self.dtype)
        return self._stocks[drafter]

    def _pair(self, weights: str, drafter: int = 0):
        """Our target in `weights` with drafter `drafter`. One target is resident at a time: an 8B
        target in both formats beside the stock pair and the fp32 referee overflows an 80 GB card (the
        first H100 demonstration's shipped configuration ran out of memory loading split12)."""
        if weights not in self._targets:
            self._targets.clear()
            self._drafters.clear()
            gc.collect()                          # engines of earlier evaluations still reference it
            if self.device == "cuda":
                torch.cuda.empty_cache()
            kw = {} if weights == "bf16" else {"weights": weights}
            self._targets[weights] = self._load_target(self.target_dir, device=self.device, dtype=self.dtype, **kw)
        target = self._targets[weights]
        if (weights, drafter) not in self._drafters:
            self._drafters[weights, drafter] = self._load_drafter(self.drafter_dirs[drafter], target)
        return target, self._drafters[weights, drafter]

    def models(self, mechanism) -> bool:
        if mechanism.name in SLOW:
            return False
        if mechanism.name == "run.drafter":
            return len(self.drafter_dirs) > 1
        if self.device == "cuda":
            return mechanism.name != "engine.draft_vocab" or self._has_ranking()
        return mechanism.name in SEEN_ON_CPU

    noisy = True   # measured: a would-be winner is re-timed beside the incumbent (mechanism_search)

    def allows(self, name: str, value) -> bool:
        """Block sizes below every candidate drafter's own (None runs its own; the batched engine refuses
        longer); drafter indices of the candidates given."""
        if name == "run.block_size" and value is not None:
            from specpilot.cost.gaps import _drafter_block_size

            return all(int(value) < _drafter_block_size(d) for d in self.drafter_dirs)
        if name == "run.drafter":
            return value < len(self.drafter_dirs)
        return True

    def time(self, dep, a: dict) -> float:
        """Tokens per second of one timed run (replayed where replay_tau is set), no gate."""
        engine_cfg, batch_cfg, run = configs_for(a, dep.weights)
        return self._generate(dep, engine_cfg, batch_cfg, run, self.replay_tau is not None, 1)[0]

    def _has_ranking(self) -> bool:
        from pathlib import Path

        return all((Path(d) / "token_ranking.json").exists() for d in self.drafter_dirs)

    def gaps(self, dep, a: dict) -> dict:
        """The cost model's gap table of this pair on this device, by family (cost/gaps.py rows). tau 1:
        it scales every draft / verify row alike, and only the ranking of the families is used."""
        from specpilot.cost import cost_report

        _, _, run = configs_for(a, dep.weights)
        report = cost_report(self.target_dir, self.drafter_dirs[run["drafter"]], batch=dep.concurrency, block_size=run["block_size"],
                             tau=1.0, device=self.device, weights=run["weights"] if self.device == "cuda" else "bf16",
                             quick=self.device == "cpu")
        lost = {}
        for r in report.rows:
            fam = ("spec.knob" if r["kind"] == "knob" else r["kind"] if r["kind"] in ("launches", "attention")
                   else "launches" if r["kind"] == "recurrent"       # the GDN kernels are fused_kernels
                   else "draft.lm_head" if r["name"] == "draft.lm_head" else
                   "verify.lm_head" if (r["step"], r["name"]) == ("verify", "lm_head") else
                   "launches" if r["kind"] == "accept" else
                   "decode.linear" if r["step"] == "decode" else "spec.linear")
            if r["step"] != "decode":
                lost[fam] = lost.get(fam, 0.0) + r["lost_per_token_s"]
        return lost

    def reference(self, dep) -> list | None:
        """fp32: transformers' greedy output of the target. bf16: None, so the search takes the start's
        outputs once confirm() passed them, and confirms every would-be incumbent."""
        if self.dtype != torch.float32:
            return None
        from specpilot.verify.target_greedy import run_target_greedy

        return [run_target_greedy(self.stock, p, self.max_new_tokens).tokens for p in self.prompts]

    def _transcript(self, weights: str) -> list:
        """Our engine's greedy AR output per prompt: what a replayed run commits."""
        from specpilot.engine import Engine

        if weights not in self._transcripts:
            target, drafter = self._pair(weights)
            engine = Engine(target, drafter)
            self._transcripts[weights] = [engine.generate_ar(p, self.max_new_tokens).tokens for p in self.prompts]
        return self._transcripts[weights]

    def _generate(self, dep, engine_cfg, batch_cfg, run, replay: bool, repeats: int) -> tuple:
        from specpilot.engine import Engine
        from specpilot.engine.batch import BatchEngine, Request
        from specpilot.engine.batch.run import pool_pages
        from specpilot.engine.replay import AcceptanceReplay

        target, drafter = self._pair(run["weights"], run["drafter"])
        plans = ([(lambda t=t: AcceptanceReplay(t, self.replay_tau)) for t in self._transcript(run["weights"])]
                 if replay else [lambda: None] * len(self.prompts))
        best, outputs = None, None
        for _ in range(repeats):
            if dep.concurrency == 1:
                engine = Engine(target, drafter, config=engine_cfg)
                results = [engine.generate_spec(p, self.max_new_tokens, block_size=run["block_size"], replay=plan())
                           for p, plan in zip(self.prompts, plans)]
                seconds = sum(r.decode_s for r in results)
            else:
                engine = BatchEngine(target, drafter, batch_cfg, max_batch=dep.concurrency, block_size=run["block_size"],
                                     kv_pages=pool_pages(self.prompts, self.max_new_tokens, dep.concurrency,
                                                         batch_cfg.page_size), engine_config=engine_cfg)
                # graphs captured and step costs measured before the clock, as serve and the bench do
                engine.warmup(max(len(p) for p in self.prompts) + self.max_new_tokens)
                t0 = time.perf_counter()
                ids = [engine.submit(Request(tuple(p), self.max_new_tokens, replay=plan()))
                       for p, plan in zip(self.prompts, plans)]
                by_id = {r.request_id: r for r in engine.run_until_done()}
                seconds = time.perf_counter() - t0
                results = [by_id[i] for i in ids]
                engine.close()                    # its caches and graphs, before the next evaluation's
                failed = [r.error for r in results if r.error]
                if failed:
                    raise ValueError(f"batched requests failed: {failed[:3]}")
            tps = sum(len(r.tokens) for r in results) / max(seconds, 1e-9)
            if best is None or tps > best:
                best, outputs = tps, [list(r.tokens) for r in results]
        return best, outputs

    def __call__(self, dep, a: dict) -> EngineRun:
        engine_cfg, batch_cfg, run = configs_for(a, dep.weights)
        tps, outputs = self._generate(dep, engine_cfg, batch_cfg, run, self.replay_tau is not None, self.repeats)
        label = f"{self.name} end to end, C={dep.concurrency}, best of {self.repeats}"
        if self.replay_tau is not None:   # the gate judges what a user gets: a run without replay
            label += f", tau {self.replay_tau} replayed"
            outputs = self._generate(dep, engine_cfg, batch_cfg, run, False, 1)[1]
        return EngineRun(tps, outputs, label)

    def confirm(self, dep, a: dict) -> tuple | None:
        """bf16: (verdict, reasons) of token_force on the single-request engine with the assignment's
        EngineConfig, and at C > 1 each batched output must equal that engine's output. fp32: None
        (outputs equal to the target's greedy output are the verdict)."""
        if self.dtype == torch.float32:
            return None
        engine_cfg, batch_cfg, run = configs_for(a, dep.weights)
        batched = self._generate(dep, engine_cfg, batch_cfg, run, False, 1)[1] if dep.concurrency > 1 else None
        return self._token_force(engine_cfg, run, batched)

    def _token_force(self, engine_cfg, run, batched) -> tuple:
        from specpilot.engine import Engine
        from specpilot.verify.forcing import token_force
        from specpilot.verify.referee import load_referee

        target, drafter = self._pair(run["weights"], run["drafter"])
        engine = Engine(target, drafter, config=engine_cfg)
        if self._referee is None:        # loaded once: the target at a higher precision is large
            self._referee = load_referee(self.target_dir, self.dtype, self.device)
        referee = self._referee
        spec = [engine.generate_spec(p, self.max_new_tokens, block_size=run["block_size"]) for p in self.prompts]
        report = token_force(engine, self._stock(run["drafter"]), self.prompts, self.max_new_tokens, block_size=run["block_size"],
                             spec_results=spec, referee=referee)
        reasons = list(report.reasons)
        if batched is not None:
            reasons += [f"prompt {i}: the batched output differs from the single-request engine's"
                        for i, (b, s) in enumerate(zip(batched, spec)) if list(b) != list(s.tokens)]
        return ("pass" if report.passed and not reasons else "reject"), reasons
