"""Timers the gate uses. The clock functions are bound at import, before any candidate runs, so a
candidate that patches `time.perf_counter` or `torch.cuda.Event` cannot change a measurement (the
gate also detects and reverts the patch).

Each timer's `measure(run, n_inputs, candidate, shape, hooks=None)` calls `run(i)` (one launch on input set i,
rotating over several distinct input sets so a cache keyed on inputs cannot help) and returns a
Timing. Labels say what was measured: "cuda-events", "cpu-wall" or "fake" (injected, CPU tests).
"""
import importlib
import statistics
import time
from dataclasses import dataclass, field

_perf_counter = time.perf_counter  # bound before any candidate code is imported
SYNTHETIC_BANDWIDTH = 1e12         # the fake device of synthetic_gemv_time: 1 TB/s


class _NoHooks:
    """Timers take optional hooks: stage(i) before the timed launch, collect(i) after it (untimed)."""

    def stage(self, i: int) -> None:
        pass

    def collect(self, i: int) -> None:
        pass


NO_HOOKS = _NoHooks()


def _staged(run, i: int, hooks) -> None:
    hooks.stage(i)
    run(i)
    hooks.collect(i)


@dataclass
class Timing:
    seconds: float                    # the number the loop ranks by (median)
    label: str                        # cuda-events | cpu-wall | fake
    reps: int
    extra: dict = field(default_factory=dict)  # e.g. min_s / hold_s of the CUDA timer


class CpuTimer:
    label = "cpu-wall"

    def __init__(self, reps: int = 5, warmup: int = 1):
        self.reps, self.warmup = reps, warmup

    def measure(self, run, n_inputs: int, candidate=None, shape=None, hooks=None) -> Timing:
        hooks = hooks or NO_HOOKS
        for i in range(max(self.warmup, n_inputs)):  # every input set runs (the gate rechecks them)
            _staged(run, i % n_inputs, hooks)
        samples = []
        for i in range(self.reps):
            hooks.stage(i % n_inputs)
            t0 = _perf_counter()
            run(i % n_inputs)
            samples.append(_perf_counter() - t0)
            hooks.collect(i % n_inputs)
        return Timing(statistics.median(samples), self.label, self.reps)


class CudaTimer:
    """CUDA events around one launch, pure device time: the stream is held busy (device-side sleep)
    while the host queues the L2 flush, the start event, the launch and the end event, so the
    host's launch overhead never lands between the events. The hold grows until it outlasts the
    host's queueing (checked per rep). `hooks` (agents/stream_order.TimingHooks) stage the input
    before the start event and read the output back after the end event, both untimed: work kept
    off the timed stream is caught there, not guessed from times. `bandwidth` is the device's
    measured copy bandwidth (bytes/s), the roofline the gate holds times to."""
    label = "cuda-events"

    def __init__(self, reps: int = 30, warmup: int = 5, flush_bytes: int = 256 << 20):
        import torch

        from specpilot.agents import stream_order

        self.torch, self.order = torch, stream_order
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        self._event = torch.cuda.Event            # bound now, not at measure time
        self._record = torch.cuda.Event.record
        self._synchronize = torch.cuda.synchronize
        self._elapsed = torch.cuda.Event.elapsed_time
        self.hold_s = 1e-3
        self.bandwidth = self._copy_bandwidth()

    def _copy_bandwidth(self) -> float:
        dst = self.torch.empty_like(self.flush)
        samples = []
        for _ in range(4):
            start, end = self._event(enable_timing=True), self._event(enable_timing=True)
            self._record(start)
            dst.copy_(self.flush)
            self._record(end)
            self._synchronize()
            samples.append(self._elapsed(start, end) * 1e-3)
        return 2 * self.flush.numel() / min(samples[1:])   # read + write

    def _one(self, run, i: int, hooks) -> float:
        while True:  # grow the hold until it covers the host's queueing
            start, end = self._event(enable_timing=True), self._event(enable_timing=True)
            self._synchronize()
            released = self.order.hold_stream(self.hold_s)
            self.flush.zero_()                  # cold L2: the decode regime streams weights once
            hooks.stage(i)
            self._record(start)
            run(i)
            self._record(end)
            held = self.order.still_held(released)
            hooks.collect(i)
            self._synchronize()
            if held:
                return self._elapsed(start, end) * 1e-3
            if self.hold_s >= self.order.HOLD_MAX_S:  # e.g. a launcher that synchronizes the host
                raise RuntimeError(f"the launch kept the host busy past a {self.hold_s:.1f} s stream hold: "
                                   "a launch must return at once")
            self.hold_s = min(self.order.HOLD_MAX_S, self.hold_s * 4)

    def measure(self, run, n_inputs: int, candidate=None, shape=None, hooks=None) -> Timing:
        hooks = hooks or NO_HOOKS
        for i in range(max(self.warmup, n_inputs)):  # every input set runs (the gate rechecks them)
            _staged(run, i % n_inputs, hooks)
        self._synchronize()
        samples = [self._one(run, i % n_inputs, hooks) for i in range(self.reps)]
        return Timing(statistics.median(samples), self.label, self.reps,
                      {"min_s": min(samples), "hold_s": self.hold_s})


class FakeTimer:
    """Injected timings for CPU tests and demos: `model(candidate, shape) -> seconds`. The run is
    still executed once per rep so side effects (patched clocks, threads) are still exercised.
    `bandwidth` is the fake device's roofline (bytes/s) the gate holds the fake times to."""
    label = "fake"

    def __init__(self, model, reps: int = 2, bandwidth: float = SYNTHETIC_BANDWIDTH):
        self.model, self.reps, self.bandwidth = model, reps, bandwidth

    def measure(self, run, n_inputs: int, candidate=None, shape=None, hooks=None) -> Timing:
        for i in range(max(self.reps, n_inputs)):
            _staged(run, i % n_inputs, hooks or NO_HOOKS)
        return Timing(float(self.model(candidate, shape)), self.label, self.reps)


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
    import math

    return math.log2(max(float(v), 1.0))


def make_timer(spec: dict):
    """{'kind': 'cpu'|'cuda'|'fake', 'model': 'module:function', 'reps': n} -> a timer."""
    kind = spec.get("kind", "cpu")
    if kind == "cuda":
        return CudaTimer(reps=spec.get("reps", 30))
    if kind == "cpu":
        return CpuTimer(reps=spec.get("reps", 5))
    if kind == "fake":
        module, _, name = spec.get("model", "specpilot.agents.timing:synthetic_gemv_time").partition(":")
        return FakeTimer(getattr(importlib.import_module(module), name), reps=spec.get("reps", 2))
    raise ValueError(f"unknown timer kind {kind!r} (cpu, cuda, fake)")
