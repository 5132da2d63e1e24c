"""The agents' timer choice: the package's real timers (specpilot.timing) or, for CPU tests and
demos, a fake one with injected times. Labels say what was measured: "cuda-events", "cpu-wall" or
"fake" (injected; the loop's report says so)."""
import importlib
import math
import random

from specpilot.timing import NO_HOOKS, CpuTimer, CudaTimer, Timing

SYNTHETIC_BANDWIDTH = 1e12         # the fake device of synthetic_gemv_time: 1 TB/s


class FakeTimer:
    """Injected timings: `model(candidate, shape) -> seconds`, times (1 + noise * N(0, 1)) per
    sample. The run is still executed for every sample, staged by the hooks, so every per-call
    check (inputs, guards, tamper, stream order) still runs. `bandwidth` is the fake device's
    roofline (bytes/s) the gate holds the fake times to."""
    label = "fake"

    def __init__(self, model, reps: int = 3, bandwidth: float = SYNTHETIC_BANDWIDTH, noise: float = 0.0,
                 seed: int = 0):
        self.model, self.reps, self.bandwidth, self.noise = model, reps, bandwidth, noise
        self.rng = random.Random(seed)

    def measure(self, run, hooks=None, candidate=None, shape=None) -> Timing:
        hooks = hooks or NO_HOOKS
        samples = []
        for _ in range(self.reps):
            hooks.stage()
            run()
            hooks.collect()
            samples.append(float(self.model(candidate, shape)) * (1 + self.noise * self.rng.gauss(0, 1)))
        return Timing(sorted(samples)[len(samples) // 2], self.label, self.reps, samples)


def synthetic_gemv_time(candidate, shape) -> float:
    """A made-up but deterministic time for a split12 GEMV variant (FakeTimer model for CPU runs):
    the byte roofline at 1 TB/s times a penalty that shrinks toward a sweet spot of the params."""
    n, k = shape
    floor = (n * k * 1.5 + 2 * k + 2 * n) / SYNTHETIC_BANDWIDTH
    p = (candidate.params if candidate is not None else {}) or {}
    if not p.get("threads_per_row"):
        return floor * 12.0                                   # the naive kernel
    penalty = 1.0
    penalty += 0.15 * abs(_log2(p["threads_per_row"]) - 6)    # best: 64 threads per row
    penalty += 0.10 * abs(_log2(p["rows_per_block"]) - 1)     # best: 2 rows per block
    penalty += 0.20 * abs(_log2(p.get("vec_groups", 1)) - 1)  # best: 2 groups per load
    penalty += 0.05 * abs(_log2(p.get("unroll", 1)) - 1)      # best: unroll 2 (not in the start design)
    return floor * penalty


def _log2(v) -> float:
    return math.log2(max(float(v), 1.0))


def make_timer(spec: dict):
    """{'kind': 'cpu'|'cuda'|'fake', 'model': 'module:function', 'reps': n, 'noise': x} -> a timer."""
    kind = spec.get("kind", "cpu")
    if kind == "cuda":
        return CudaTimer(reps=spec.get("reps", 30))
    if kind == "cpu":
        return CpuTimer(reps=spec.get("reps", 5))
    if kind == "fake":
        module, _, name = spec.get("model", "specpilot.agents.timing:synthetic_gemv_time").partition(":")
        return FakeTimer(getattr(importlib.import_module(module), name), reps=spec.get("reps", 3),
                         noise=spec.get("noise", 0.0), seed=spec.get("seed", 0))
    raise ValueError(f"unknown timer kind {kind!r} (cpu, cuda, fake)")
