"""The cost-model evaluator: tokens per second of a mechanism assignment on a deployment's shapes,
from cost/'s components at stated ceilings plus the measured effect sizes of the mechanisms the
components cannot see. It needs no device and no checkpoint, so the search and the transfer study
run on the CPU; its numbers are ESTIMATES (verdict "estimate": nothing is token-forced, nothing it
picks is integrated). Every stated number below names where it comes from.

What it models: the weight format (bytes per weight), the block size (components at the block, tau
from a geometric acceptance fitted to the stated tau at the drafter's block), the certified head
(two_level, at the measured fallback rate), ragged verify and batched draft (off: one forward per
request, so the weights are read C times), CUDA graphs (off: a host launch per kernel), fused
kernels, the fused GEMV, the skinny GEMM, the split12 decode grid and fused steps. What it does not
(`models()` is False, the search skips them and says so): attention choices, PDL, early launch,
step kernels, compile, adaptive verify, page size, prefill chunk, draft_vocab (its tau cost is
pair-specific: docs/two_level.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from specpilot.cost.ceilings import Ceilings
from specpilot.cost.gaps import ceiling_of, work
from specpilot.cost.shapes import step_components
from specpilot.cost.two_level import preset_shapes

# Measured copy bandwidths (docs/design.md: H200 4.17 TB/s, H100 3.03 TB/s), dense bf16 nominal rate,
# the 1.04 us graph launch floor (docs/design.md section 3's timings).
CARDS = {"H100": Ceilings("cuda", "H100 (stated)", 3.03e12, 9.89e14, 1.04e-6, "bfloat16"),
         "H200": Ceilings("cuda", "H200 (stated)", 4.17e12, 9.89e14, 1.04e-6, "bfloat16")}
EAGER_LAUNCH_S = 4e-6        # host cost of one eager kernel launch (an assumption, not measured here)
FUSED_STEPS_HOST_S = 1e-4    # host glue between separate draft and verify calls (design.md: ~0.1 ms)
# Measured step ratios from EngineConfig's docstrings (the mechanism off / on):
FUSED_GEMV = 5.25 / 4.49     # AR step with cuBLAS vs our GEMV (Qwen3-8B shape, H200)
SKINNY_GEMM = 5.10 / 4.74    # verify with cuBLAS vs the skinny GEMM (Qwen3-8B shape, H200)
DECODE_GRID = 5.27 / 5.16    # split12 verify without / with the decode grid (H100)
UNFUSED_KERNELS = 2.0        # fused_kernels off: each fused norm / rope / gate is two or more kernels
TAU_AT_DRAFTER_BLOCK = 6.49  # DFlash's published tau for the Qwen3-8B pair at block 16 (docs/design.md)
FALLBACK_RATE = 1.0          # the certified head's measured fallback rate (docs/two_level.md)
MODELLED = {"engine.cuda_graphs", "engine.fused_kernels", "engine.fused_gemv", "engine.skinny_gemm",
            "engine.split12_decode_grid", "engine.fused_steps", "engine.two_level", "batch.ragged_verify",
            "batch.batched_draft", "run.block_size", "run.weights"}


def geometric_tau(block: int, tau_ref: float, block_ref: int) -> float:
    """Tokens per verify step (bonus included) at `block`, with a per-position acceptance a fitted so
    that (1 - a^block_ref) / (1 - a) = tau_ref."""
    if not 1.0 <= tau_ref <= block_ref:
        raise ValueError(f"tau {tau_ref} must lie in [1, {block_ref}]")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        a = (lo + hi) / 2
        t = sum(a ** i for i in range(block_ref))
        lo, hi = (a, hi) if t < tau_ref else (lo, a)
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
                 tau: float = TAU_AT_DRAFTER_BLOCK):
        self.drafter_layers, self.drafter_block, self.context, self.tau = drafter_layers, drafter_block, context, tau

    def models(self, mechanism) -> bool:
        return mechanism.name in MODELLED

    def allows(self, name: str, value) -> bool:
        """Block sizes below the drafter's (None, the drafter's own block, stands for it: one evaluation)."""
        return name != "run.block_size" or value is None or int(value) < self.drafter_block

    def _ceil(self, dep) -> Ceilings:
        if dep.card not in CARDS:
            raise ValueError(f"cost-model evaluator: no stated ceilings for card {dep.card!r}; known {sorted(CARDS)}")
        return CARDS[dep.card]

    def step_times(self, dep, a: dict) -> dict:
        """{step: {family: seconds}} of one step at concurrency C under assignment `a`."""
        ceil = self._ceil(dep)
        target, drafter = preset_shapes(dep.target, self.drafter_layers)
        spec = dep.drafter != "none"
        block = int(a.get("run.block_size") or self.drafter_block) if spec else 1
        weights = a.get("run.weights", dep.weights)
        fused = a.get("engine.fused_kernels", True)
        certified = (target.hidden // 8, FALLBACK_RATE) if a.get("engine.two_level") == "certified-head" else None
        c = dep.concurrency
        per_request = {"verify": not a.get("batch.ragged_verify", True) and c > 1,
                       "draft": not a.get("batch.batched_draft", True) and c > 1}
        out = {"decode": {}, "draft": {}, "verify": {}}
        for one_per_request in (False, True):   # the batched pass, then the per-request forwards (x C)
            if one_per_request and not any(per_request.values()):
                continue
            step_batch, repeat = (1, c) if one_per_request else (c, 1)
            comps = step_components(target, drafter if spec else None, self.drafter_layers, step_batch, block,
                                    self.context, weights, 0, certified)
            for comp in comps:
                if per_request.get(comp.step, False) != one_per_request:
                    continue
                nbytes, flops = work(comp, ceil.device, target, drafter, step_batch, self.context, weights)
                fam = _family(comp)
                if comp.kind == "launches":
                    kernels = comp.extra[0] * (1 if fused else UNFUSED_KERNELS)
                    seconds = kernels * ceil.launch_s
                else:
                    seconds = ceiling_of(nbytes, flops, ceil)[0] * _linear_factor(comp, a, fused, weights)
                    kernels = 1
                if not a.get("engine.cuda_graphs", True):
                    out[comp.step]["launches"] = out[comp.step].get("launches", 0.0) + \
                        kernels * EAGER_LAUNCH_S * comp.count * repeat
                out[comp.step][fam] = out[comp.step].get(fam, 0.0) + seconds * comp.count * repeat
        if spec and not a.get("engine.fused_steps", True):
            out["verify"]["launches"] = out["verify"].get("launches", 0.0) + FUSED_STEPS_HOST_S
        return out

    def seconds_per_token(self, dep, a: dict) -> float:
        t = {step: sum(f.values()) for step, f in self.step_times(dep, a).items()}
        if dep.drafter == "none":
            return t["decode"] / dep.concurrency
        block = int(a.get("run.block_size") or self.drafter_block)
        tau = geometric_tau(block, self.tau, self.drafter_block)
        return (t["draft"] + t["verify"]) / (dep.concurrency * tau)

    def __call__(self, dep, a: dict) -> Estimate:
        return Estimate(1.0 / self.seconds_per_token(dep, a), None,
                        f"cost-model estimate ({self._ceil(dep).device_name} ceilings, tau {self.tau} at block "
                        f"{self.drafter_block}, geometric)")

    def gaps(self, dep, a: dict) -> dict:
        """family -> seconds per token lost against the same steps with every mechanism at its best
        modelled value (the ceiling of this model), for ranking which family to try first."""
        best = {"engine.cuda_graphs": True, "engine.fused_kernels": True, "engine.fused_gemv": True,
                "engine.skinny_gemm": True, "engine.split12_decode_grid": True, "engine.fused_steps": True,
                "batch.ragged_verify": True, "batch.batched_draft": True,
                "run.weights": a.get("run.weights", dep.weights), "run.block_size": a.get("run.block_size"),
                "engine.two_level": "off"}
        now, ceil = self.step_times(dep, a), self.step_times(dep, best)
        tokens = dep.concurrency * (1.0 if dep.drafter == "none" else self.tau)
        lost = {}
        for step in (("draft", "verify") if dep.drafter != "none" else ("decode",)):
            for fam, s in now[step].items():
                lost[fam] = lost.get(fam, 0.0) + max(0.0, s - ceil[step].get(fam, 0.0)) / tokens
        if dep.weights == "split12":   # what split12 would save on top of the assignment as it is
            lost["weights"] = max(0.0, self.seconds_per_token(dep, a)
                                  - self.seconds_per_token(dep, {**a, "run.weights": "split12"}))
        return lost


def _family(comp) -> str:
    if comp.kind == "launches":
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
