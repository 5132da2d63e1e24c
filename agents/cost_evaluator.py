"""The cost-model evaluator: tokens per second of a mechanism assignment on a deployment's shapes,
from cost/'s components at stated ceilings plus the measured effect sizes of the mechanisms the
components cannot see. It needs no device and no checkpoint, so the search and the transfer study
run on the CPU; its numbers are ESTIMATES (verdict "estimate": nothing is token-forced, nothing it
picks is integrated). Every stated number below names where it comes from.

What it models: the weight format (bytes per weight), the block size (components at the block, tau
from a geometric acceptance fitted to the stated tau at the drafter's block), the certified head
(two_level, at the measured fallback rate), ragged verify and batched draft (off: one forward per
request, so the weights are read C times), CUDA graphs (off: a host launch per kernel), fused
kernels, the fused GEMV, the skinny GEMM, the split12 decode grid and fused steps, and the batched
verify policies (cost/batched.py): prefix-first (batch.verify_prefix: pass 1 over P rows per request,
the expected pass 2 over Binomial(C, q) requests, each forward padded to the graphed engine's request
bucket) and adaptive verify (the verify length L among the block's quarters with the most tokens per
second under the geometric acceptance, which is what its step-wide choice picks once its pooled
per-position rates have converged: the engine's estimate is one survival curve for every request;
graphed as the engine runs it, with its probe step every BatchConfig.adaptive_probe_every steps mixed
in: the length chosen with every draft past L surely accepted; the estimate's few steps of learning
are not modelled). Given a workload (prompt and new tokens a request), a batched deployment runs a
closed loop (cost/batched.py closed_loop): some steps carry a prompt chunk of batch.prefill_chunk
rows, each with its own verify length. What it does not (`models()` is False, the search skips them
and says so): attention choices, PDL, early launch, step kernels, compile, page size, the prefill
chunk's size (at the ceilings small chunks win, filling the verify's rows under the ridge, while the
engine measured 2048 rows faster than 256 at C = 32 on an H100: a cost per chunk step that the
ceilings do not see), the graphs' kv span buckets (graph_kv_step: the components attend to the
exact context), draft_vocab (its tau cost is pair-specific: docs/two_level.md), tree_budget (its tau
gain is the pair's and falls as the chain's tau rises: docs/trees.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specpilot.cost.batched import CARDS, Acceptance, closed_loop_seconds, geometric_alpha, padded_requests
from specpilot.cost.ceilings import Ceilings
from specpilot.cost.gaps import ceiling_of, work
from specpilot.cost.shapes import step_components
from specpilot.cost.two_level import preset_shapes
from specpilot.engine.batch.config import BatchConfig

EAGER_LAUNCH_S = 4e-6        # host cost of one eager kernel launch (an assumption, not measured here)
FUSED_STEPS_HOST_S = 1e-4    # host glue between separate draft and verify calls (design.md: ~0.1 ms)
# Measured step ratios from EngineConfig's docstrings (the mechanism off / on):
FUSED_GEMV = 5.25 / 4.49     # AR step with cuBLAS vs our GEMV (Qwen3-8B shape, H200)
SKINNY_GEMM = 5.10 / 4.74    # verify with cuBLAS vs the skinny GEMM (Qwen3-8B shape, H200)
DECODE_GRID = 5.27 / 5.16    # split12 verify without / with the decode grid (H100)
UNFUSED_KERNELS = 2.0        # fused_kernels off: each fused norm / rope / gate is two or more kernels
TAU_AT_DRAFTER_BLOCK = 6.49  # DFlash's published tau for the Qwen3-8B pair at block 16 (docs/design.md)
FALLBACK_RATE = 1.0          # the certified head's measured fallback rate (docs/two_level.md)
SHIPPED_BATCH = BatchConfig()  # the batched engine's shipped defaults (adaptive verify, its probe rate)
MODELLED = {"engine.cuda_graphs", "engine.fused_kernels", "engine.fused_gemv", "engine.skinny_gemm",
            "engine.split12_decode_grid", "engine.fused_steps", "engine.two_level", "batch.ragged_verify",
            "batch.batched_draft", "batch.verify_prefix", "batch.adaptive_verify", "run.block_size", "run.weights"}


def geometric_tau(block: int, tau_ref: float, block_ref: int) -> float:
    """Tokens per verify step (bonus included) at `block`, with a per-position acceptance a fitted so
    that (1 - a^block_ref) / (1 - a) = tau_ref."""
    a = geometric_alpha(tau_ref, block_ref)
    return sum(a ** i for i in range(block))


@dataclass
class Estimate:
    tokens_per_s: float
    outputs: None = None          # nothing ran: there is nothing to token-force
    label: str = ""


class CostModelEvaluator:
    name = "cost-model"
    forced = False

    def __init__(self, drafter_layers: int = 5, drafter_block: int = 16, context: int = 1024,
                 tau: float = TAU_AT_DRAFTER_BLOCK, workload: tuple | None = None):
        """workload: (mean prompt tokens, new tokens) of a request in a closed loop: a batched
        deployment's steps then carry its prompt chunks of batch.prefill_chunk rows; None: decode steps
        alone. One request stays at its decode steps (its prompt is one forward either way)."""
        if workload is not None and (workload[0] < 0 or workload[1] < 1):
            raise ValueError(f"workload (prompt tokens, new tokens) needs prompt >= 0 and new >= 1, got {workload}")
        self.drafter_layers, self.drafter_block, self.context, self.tau = drafter_layers, drafter_block, context, tau
        self.workload = workload

    def models(self, mechanism) -> bool:
        return mechanism.name in MODELLED

    def allows(self, name: str, value) -> bool:
        """Block sizes below the drafter's (None, the drafter's own block, stands for it: one evaluation)."""
        return name != "run.block_size" or value is None or int(value) < self.drafter_block

    def _ceil(self, dep) -> Ceilings:
        if dep.card not in CARDS:
            raise ValueError(f"cost-model evaluator: no stated ceilings for card {dep.card!r}; known {sorted(CARDS)}")
        return CARDS[dep.card]

    def step_times(self, dep, a: dict, policy: tuple | None = None, prefill_rows: int = 0) -> dict:
        """{step: {family: seconds}} of one step at concurrency C under assignment `a` (verify: the
        expected seconds under the verify policy, prefix-first's pass 2 included; `policy` overrides
        the one `a` gives: ("len", L) is an eager verify of L rows per request). prefill_rows: a prompt
        chunk rides in the step's target forward (the first one, where each request has its own)."""
        ceil = self._ceil(dep)
        target, drafter = preset_shapes(dep.target, self.drafter_layers)
        spec = dep.drafter != "none"
        block = self._block(dep, a)
        weights = a.get("run.weights", dep.weights)
        certified = (target.hidden // 8, FALLBACK_RATE) if a.get("engine.two_level") == "certified-head" else None
        c = dep.concurrency
        per_request = {"verify": not a.get("batch.ragged_verify", True) and c > 1,
                       "draft": not a.get("batch.batched_draft", True) and c > 1}
        policy = policy or (self._verify_policy(dep, a, block, prefill_rows) if spec else ("full", block))
        out = {"decode": {}, "draft": {}, "verify": {}}

        def add(step_batch, rows, scale, keep, eager=False, prefill=0):
            comps = step_components(target, drafter if spec else None, self.drafter_layers, step_batch, rows,
                                    self.context, weights, 0, certified, prefill)
            self._accumulate(out, [comp for comp in comps if keep(comp)], ceil, target, drafter, step_batch,
                             weights, a, scale, eager)

        for one_per_request in (False, True):   # the batched pass, then the per-request forwards (x C)
            if one_per_request and not any(per_request.values()):
                continue
            keep = lambda comp: per_request.get(comp.step, False) == one_per_request and \
                (comp.step != "verify" or policy[0] == "full")  # noqa: E731
            _forwards(add, one_per_request, c, c, block, keep, False, prefill_rows)
        if policy[0] != "full":
            self._policy_verify(add, policy, c, block, per_request["verify"], a, dep, prefill_rows)
        if spec and not a.get("engine.fused_steps", True):
            out["verify"]["launches"] = out["verify"].get("launches", 0.0) + FUSED_STEPS_HOST_S
        return out

    def _block(self, dep, a: dict) -> int:
        return int(a.get("run.block_size") or self.drafter_block) if dep.drafter != "none" else 1

    def acceptance(self, block: int) -> Acceptance:
        """The acceptance law at `block`: geometric, fitted to the stated tau at the drafter's block."""
        return Acceptance.geometric(self.tau, block, self.drafter_block)

    def _verify_policy(self, dep, a: dict, block: int, prefill_rows: int = 0) -> tuple:
        """("full", block) | ("prefix", P) | ("len", L) | ("adaptive", L): how many rows a request
        verifies (adaptive: L, and _probe_len's on the probe steps)."""
        prefix = int(a.get("batch.verify_prefix", 0))
        adaptive = bool(a.get("batch.adaptive_verify", SHIPPED_BATCH.adaptive_verify))    # prefix-first replaces it
        if prefix and prefix >= block:
            raise ValueError(f"batch.verify_prefix={prefix} must be below the block size {block} (the batched "
                             f"engine refuses it)")
        if prefix:
            return ("prefix", prefix)
        if adaptive:      # a step with a chunk chooses its own length (BatchEngine._verify_lengths)
            return ("adaptive", self._adaptive_len(dep, a, block, prefill_rows))
        return ("full", block)

    def _adaptive_len(self, dep, a: dict, block: int, prefill_rows: int = 0) -> int:
        """The verify length among the engine's choices (the block's quarters) with the most tokens per
        step per second (the full block wins ties)."""
        from specpilot.engine.batch.adaptive import verify_row_choices

        acc = self.acceptance(block)
        rate = {}
        for n in verify_row_choices(block):
            t = self.step_times(dep, a, policy=("len", n), prefill_rows=prefill_rows)
            rate[n] = acc.mean(n) / (sum(t["draft"].values()) + sum(t["verify"].values()))
        return max(rate, key=lambda n: (rate[n], n))

    def _probe_len(self, dep, a: dict, block: int, length: int, prefill_rows: int = 0) -> int:
        """Adaptive verify's probe-step length: its choice again with every draft past the first
        length - 1 surely accepted (tokens past `length`: one each with the chance P(a >= length))."""
        from specpilot.engine.batch.adaptive import verify_row_choices

        acc = self.acceptance(block)
        rate = {}
        for n in verify_row_choices(block):
            tokens = acc.mean(n) if n <= length else acc.mean(length) + (n - length) * acc.survival(length)
            t = self.step_times(dep, a, policy=("len", n), prefill_rows=prefill_rows)
            rate[n] = tokens / (sum(t["draft"].values()) + sum(t["verify"].values()))
        return max(rate, key=lambda n: (rate[n], n))

    def _policy_verify(self, add, policy: tuple, c: int, block: int, per_request: bool, a: dict, dep,
                       prefill_rows: int = 0) -> None:
        """Adds the verify step's families under prefix-first or a verify length: one forward over every
        request (ragged, padded to the request bucket when graphed) or one per request (ragged off);
        a chunk of prefill_rows rides in the first forward (prefix-first: pass 1)."""
        graphed = a.get("engine.cuda_graphs", True)
        verify = lambda comp: comp.step == "verify"  # noqa: E731
        kind, rows = policy
        if kind == "adaptive":    # L rows, the probe's length on a share 1 / probe_every of the steps
            share = _probe_share()
            self._policy_verify(_scaled(add, 1 - share), ("len", rows), c, block, per_request, a, dep, prefill_rows)
            if share:
                probe = self._probe_len(dep, a, block, rows, prefill_rows)
                self._policy_verify(_scaled(add, share), ("len", probe), c, block, per_request, a, dep, prefill_rows)
            return
        padded = padded_requests(c, graphed)
        if kind == "len":     # a verify length: the graphed forward of R x L rows (engine/batch/graphed.py)
            _forwards(add, per_request, c, padded, rows, verify, not graphed, prefill_rows)
            return
        rest = block - rows
        q = self.acceptance(block).survival(rows + 1)
        _forwards(add, per_request, c, padded, rows, verify, False, prefill_rows)
        if per_request:
            add(1, rest, c * q, verify)
            return
        for k in range(1, c + 1):        # pass 2 over the k requests that accepted all P, k ~ Binomial(c, q)
            weight = math.comb(c, k) * q ** k * (1 - q) ** (c - k)
            if weight > 0:
                add(padded_requests(k, graphed), rest, weight, verify)

    def _accumulate(self, out, comps, ceil, target, drafter, step_batch, weights, a, scale, eager) -> None:
        fused = a.get("engine.fused_kernels", True)
        for comp in comps:
            nbytes, flops = work(comp, ceil.device, target, drafter, step_batch, self.context, weights)
            fam = _family(comp)
            if comp.kind == "launches":
                kernels = comp.extra[0] * (1 if fused else UNFUSED_KERNELS)
                seconds = kernels * ceil.launch_s
            else:
                seconds = ceiling_of(nbytes, flops, ceil)[0] * _linear_factor(comp, a, fused, weights)
                kernels = 1
            if eager or not a.get("engine.cuda_graphs", True):
                out[comp.step]["launches"] = out[comp.step].get("launches", 0.0) + \
                    kernels * EAGER_LAUNCH_S * comp.count * scale
            out[comp.step][fam] = out[comp.step].get(fam, 0.0) + seconds * comp.count * scale

    def tokens_per_step(self, dep, a: dict, prefill_rows: int = 0) -> float:
        """Expected tokens a step commits over all C requests (prefix-first: as the full block)."""
        if dep.drafter == "none":
            return float(dep.concurrency)
        block = self._block(dep, a)
        kind, rows = self._verify_policy(dep, a, block, prefill_rows)
        acc = self.acceptance(block)
        if kind == "adaptive":
            share = _probe_share()
            probe = self._probe_len(dep, a, block, rows, prefill_rows) if share else rows
            return dep.concurrency * ((1 - share) * acc.mean(rows) + share * acc.mean(probe))
        return dep.concurrency * acc.mean(rows if kind == "len" else block)

    def seconds_per_token(self, dep, a: dict) -> float:
        if self.workload is None or dep.concurrency == 1:
            seconds, tokens = self._step(dep, a)
            return seconds / tokens
        prompt, new = self.workload
        chunk = int(a.get("batch.prefill_chunk", SHIPPED_BATCH.prefill_chunk))
        seconds, _ = closed_loop_seconds(dep.concurrency * new, dep.concurrency * prompt / chunk,
                                         self._step(dep, a), self._step(dep, a, chunk))
        return seconds / (dep.concurrency * new)

    def _step(self, dep, a: dict, prefill_rows: int = 0) -> tuple:
        """(seconds, tokens) of one step (AR: decode; spec: draft + verify), carrying a chunk of prefill_rows."""
        t = {step: sum(f.values()) for step, f in self.step_times(dep, a, prefill_rows=prefill_rows).items()}
        if dep.drafter == "none":
            return t["decode"], float(dep.concurrency)
        return t["draft"] + t["verify"], self.tokens_per_step(dep, a, prefill_rows)

    def __call__(self, dep, a: dict) -> Estimate:
        return Estimate(1.0 / self.seconds_per_token(dep, a), None,
                        f"cost-model estimate ({self._ceil(dep).device_name} ceilings, tau {self.tau} at block "
                        f"{self.drafter_block}, geometric)")

    def gaps(self, dep, a: dict) -> dict:
        """family -> seconds per token lost against the same steps with every mechanism at its best
        modelled value (the ceiling of this model), for ranking which family to try first. The verify
        policy (prefix-first, adaptive verify) changes the tokens per step too, so its gap is taken per
        token apart: what the best policy would save over the assignment's, as spec.linear."""
        best = {"engine.cuda_graphs": True, "engine.fused_kernels": True, "engine.fused_gemv": True,
                "engine.skinny_gemm": True, "engine.split12_decode_grid": True, "engine.fused_steps": True,
                "batch.ragged_verify": True, "batch.batched_draft": True,
                "run.weights": a.get("run.weights", dep.weights), "run.block_size": a.get("run.block_size"),
                "engine.two_level": "off", "batch.verify_prefix": a.get("batch.verify_prefix", 0),
                "batch.adaptive_verify": a.get("batch.adaptive_verify", SHIPPED_BATCH.adaptive_verify)}
        now, ceil = self.step_times(dep, a), self.step_times(dep, best)
        tokens = dep.concurrency * (1.0 if dep.drafter == "none" else self.tau)
        lost = {}
        for step in (("draft", "verify") if dep.drafter != "none" else ("decode",)):
            for fam, s in now[step].items():
                lost[fam] = lost.get(fam, 0.0) + max(0.0, s - ceil[step].get(fam, 0.0)) / tokens
        if dep.drafter != "none" and dep.concurrency > 1:
            lost["spec.linear"] = lost.get("spec.linear", 0.0) + self._verify_policy_gap(dep, a)
        if dep.weights == "split12":   # what split12 would save on top of the assignment as it is
            lost["weights"] = max(0.0, self.seconds_per_token(dep, a)
                                  - self.seconds_per_token(dep, {**a, "run.weights": "split12"}))
        return lost

    def _verify_policy_gap(self, dep, a: dict) -> float:
        """Seconds per token the best verify policy of the registry's candidates would save over a's."""
        from specpilot.agents.mechanisms import by_name

        block = self._block(dep, a)
        policies = [{"batch.verify_prefix": p, "batch.adaptive_verify": False}
                    for p in by_name()["batch.verify_prefix"].values if p < block]
        policies.append({"batch.verify_prefix": 0, "batch.adaptive_verify": True})
        now = self.seconds_per_token(dep, a)
        return max(0.0, now - min(self.seconds_per_token(dep, {**a, **p}) for p in policies))


def _forwards(add, per_request: bool, c: int, batch: int, rows: int, keep, eager: bool, prefill_rows: int) -> None:
    """One step's forwards of `rows` rows a request: one over `batch` requests, or one per request (x c);
    a chunk of prefill_rows rides in the first of them."""
    if per_request:
        add(1, rows, 1, keep, eager, prefill_rows)
        add(1, rows, c - 1, keep, eager)
    else:
        add(batch, rows, 1, keep, eager, prefill_rows)


def _scaled(add, factor: float):
    """step_times' `add` with every scale multiplied by `factor` (a share of the steps)."""
    def scaled(step_batch, rows, scale, keep, eager=False, prefill=0):
        add(step_batch, rows, scale * factor, keep, eager, prefill)
    return scaled


def _probe_share() -> float:
    """The share of adaptive verify's steps that verify whole blocks (BatchConfig.adaptive_probe_every)."""
    every = SHIPPED_BATCH.adaptive_probe_every
    return 1.0 / every if every else 0.0


def _family(comp) -> str:
    if comp.kind in ("launches", "recurrent"):     # a hybrid's GDN kernels are fused_kernels' (launches family)
        return "launches"
    if comp.kind == "attention":
        return "attention"
    if comp.kind == "linear" and comp.name in ("lm_head", "lm_head.level1", "lm_head.shortlist", "lm_head.fallback") \
            and comp.step == "verify":
        return "verify.lm_head"
    if comp.name == "draft.lm_head":
        return "draft.lm_head"
    if comp.kind == "linear":
        return "decode.linear" if comp.step == "decode" else "spec.linear"
    return "launches"   # accept scans: small, launch-bound


def _linear_factor(comp, a: dict, fused: bool, weights: str) -> float:
    if comp.kind != "linear":
        return 1.0
    f = 1.0
    if comp.m == 1 and not (fused and a.get("engine.fused_gemv", True)):
        f *= FUSED_GEMV
    if 2 <= comp.m <= 16 and not (fused and a.get("engine.skinny_gemm", True)):
        f *= SKINNY_GEMM
    if comp.step == "verify" and weights == "split12" and not a.get("engine.split12_decode_grid", True):
        f *= DECODE_GRID
    return f
