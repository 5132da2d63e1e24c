"""The one timer of the package: the clock, the device-side stream hold, and the CPU and CUDA
timers that the agents' gate, the cost model and the benchmarks share.

The clocks are bound when this module is imported, before any candidate code is: a candidate that
patches `time.perf_counter` or `torch.cuda.Event` later cannot change a measurement made here (and
the agents' gate also detects and reverts such a patch, agents/gate_call.py). Timers capture their
clock again at construction, so replacing a name in this module does not reach a timer either.

Timer protocol (`measure(run, hooks=None, candidate=None, shape=None) -> Timing`): each call is
hooks.stage(); run(); hooks.collect(); stage and collect are never timed. The gate's hooks stage a
fresh input for every call (agents/gate_call.TimingHooks); without hooks the same run() repeats.
"""
import statistics
import time
from dataclasses import dataclass, field

import torch

perf_counter = time.perf_counter          # bound before any candidate code is imported
cuda_sync = torch.cuda.synchronize
_sleep = getattr(torch.cuda, "_sleep", None)
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_query = torch.cuda.Event.query
_event_elapsed = torch.cuda.Event.elapsed_time
_cycles_per_s = []                         # measured once per process (a list: no rebinding of a global)
HOLD_MAX_S = 2.0                           # a launch that blocks the host longer than this is refused


def cycles_per_second() -> float:
    """GPU clock cycles per second, measured once with events around torch's sleep kernel."""
    if not _cycles_per_s:
        if _sleep is None:
            raise RuntimeError("torch.cuda._sleep is missing in this torch: the stream hold needs it")
        cycles = 4_000_000
        _sleep(1000)  # warm the kernel up
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _event_record(start)
        _sleep(cycles)
        _event_record(end)
        cuda_sync()
        _cycles_per_s.append(cycles / max(_event_elapsed(start, end) * 1e-3, 1e-6))
    return _cycles_per_s[0]


def hold_stream(seconds: float):
    """Keep the current stream busy for about `seconds` (device-side sleep); returns an event that
    completes when the hold ends (query it after queueing work: was the stream still held?)."""
    _sleep(int(seconds * cycles_per_second()))
    released = _Event()
    _event_record(released)
    return released


def still_held(released) -> bool:
    return not _event_query(released)


class _NoHooks:
    def stage(self) -> None:
        pass

    def collect(self) -> None:
        pass


NO_HOOKS = _NoHooks()


@dataclass
class Timing:
    seconds: float                    # the number callers rank by (median)
    label: str                        # cuda-events | cpu-wall | fake
    reps: int
    samples: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # e.g. min_s / hold_s of the CUDA timer


class CpuTimer:
    """perf_counter around each call (host wall time: on the CPU that is the work itself)."""
    label = "cpu-wall"

    def __init__(self, reps: int = 5, warmup: int = 1):
        self.reps, self.warmup = reps, warmup
        self.clock = perf_counter

    def sample(self, run, hooks=NO_HOOKS) -> float:
        hooks.stage()
        t0 = self.clock()
        run()
        t = self.clock() - t0
        hooks.collect()
        return t

    def measure(self, run, hooks=None, candidate=None, shape=None) -> Timing:
        hooks = hooks or NO_HOOKS
        for _ in range(self.warmup):
            self.sample(run, hooks)
        samples = [self.sample(run, hooks) for _ in range(self.reps)]
        return Timing(statistics.median(samples), self.label, self.reps, samples)


class CudaTimer:
    """CUDA events around one launch, pure device time: the stream is held busy (device-side sleep)
    while the host queues the L2 flush, the hooks' staging, the start event, the launch and the end
    event, so the host's launch overhead never lands between the events. The hold grows until it
    outlasts the host's queueing (checked per sample; a sample whose hold ran out is redone, on a
    fresh input when the hooks stage one). `bandwidth` is the measured copy bandwidth (bytes/s)."""
    label = "cuda-events"

    def __init__(self, reps: int = 30, warmup: int = 5, flush_bytes: int = 256 << 20):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        self.event, self.record, self.synchronize, self.elapsed = _Event, _event_record, cuda_sync, _event_elapsed
        self.hold, self.held = hold_stream, still_held
        self.hold_s = 1e-3
        self.bandwidth = self._copy_bandwidth()

    def _copy_bandwidth(self) -> float:
        dst = torch.empty_like(self.flush)
        samples = []
        for _ in range(4):
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            self.record(start)
            dst.copy_(self.flush)
            self.record(end)
            self.synchronize()
            samples.append(self.elapsed(start, end) * 1e-3)
        return 2 * self.flush.numel() / min(samples[1:])   # read + write

    def sample(self, run, hooks=NO_HOOKS) -> float:
        while True:  # grow the hold until it covers the host's queueing
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            self.synchronize()
            released = self.hold(self.hold_s)
            self.flush.zero_()                  # cold L2: the decode regime streams weights once
            hooks.stage()
            self.record(start)
            run()
            self.record(end)
            held = self.held(released)
            hooks.collect()
            self.synchronize()
            if held:
                return self.elapsed(start, end) * 1e-3
            if self.hold_s >= HOLD_MAX_S:  # e.g. a launcher that synchronizes the host
                raise RuntimeError(f"the launch kept the host busy past a {self.hold_s:.1f} s stream hold: "
                                   "a launch must return at once")
            self.hold_s = min(HOLD_MAX_S, self.hold_s * 4)

    def measure(self, run, hooks=None, candidate=None, shape=None) -> Timing:
        hooks = hooks or NO_HOOKS
        for _ in range(self.warmup):
            self.sample(run, hooks)
        self.synchronize()
        samples = [self.sample(run, hooks) for _ in range(self.reps)]
        return Timing(statistics.median(samples), self.label, self.reps, samples,
                      {"min_s": min(samples), "hold_s": self.hold_s})
