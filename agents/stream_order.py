"""Stream order: a candidate's work must run on the caller's current stream, ordered after what the
caller queued before it and before what the caller queues next.

Why it is checked: CUDA events on the current stream see only that stream, so work launched on a
side stream (or later, from a thread) looks free to the timer. And the engine depends on stream
order: a layer's input is produced by the previous op on the same stream, a CUDA graph captures
one stream. A device-wide synchronize before reading the output hides the cheat, so the gate
never relies on one to judge an output.

How (`OrderedCall`): hold the current stream busy with a device-side sleep, queue the real input
behind it into a NaN-poisoned staging buffer, call the candidate, queue a copy of the output (the
"consumer") behind it, then synchronize the device. Honest work reads the real input and the
consumer copies its result. Work off the stream runs while the stream still sleeps, so it reads
the NaN input; work that waits for the input but is not joined back lands after the consumer
copied (the copy still holds poison, or differs from the settled output). The hold is grown until
the stream is still held when the candidate's call returns, so the verdict does not depend on how
fast the host launches. On the CPU there are no streams: the same steps run without the hold and
catch work finished later by a thread.
"""
import torch

BF16_NAN = float("nan")
HOLD_START_S = 2e-3    # an honest launch from Python takes ~10-100 us of host time
HOLD_MAX_S = 2.0       # a GEMV launch that blocks the host longer than this is rejected

_cuda_sync = torch.cuda.synchronize      # bound at import, before any candidate runs
_sleep = getattr(torch.cuda, "_sleep", None)
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_query = torch.cuda.Event.query
_event_elapsed = torch.cuda.Event.elapsed_time
_cycles_per_s = None


class StreamOrderError(Exception):
    """Raised with a reason the gate turns into a verdict."""


def _cycles_per_second() -> float:
    """GPU clock cycles per second, measured once with events around torch's sleep kernel."""
    global _cycles_per_s
    if _cycles_per_s is None:
        if _sleep is None:
            raise RuntimeError("torch.cuda._sleep is missing in this torch: the stream-order check needs it")
        cycles = 4_000_000
        _sleep(1000)  # warm the kernel up
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _event_record(start)
        _sleep(cycles)
        _event_record(end)
        _cuda_sync()
        _cycles_per_s = cycles / max(_event_elapsed(start, end) * 1e-3, 1e-6)
    return _cycles_per_s


def hold_stream(seconds: float):
    """Keep the current stream busy for about `seconds`; returns an event that completes when the
    hold ends (query it after queueing work to learn whether the stream was still held)."""
    _sleep(int(seconds * _cycles_per_second()))
    released = _Event()
    _event_record(released)
    return released


def still_held(released) -> bool:
    return not _event_query(released)


class OrderedCall:
    """One gate call of fn(*planes, x, y, N, K, kpad) with the input staged on the caller's stream
    and the output read back by the caller's stream. `hold_s` is remembered across calls."""

    def __init__(self, device: str):
        self.device = device
        self.hold_s = HOLD_START_S
        # a high-priority stream as the caller's: when the input lands, the consumer read is
        # scheduled ahead of side-stream work that waited for the same input
        self.stream = torch.cuda.Stream(priority=-1) if device == "cuda" else None

    def __call__(self, fn, planes, x, N: int, K: int, kpad: int):
        """-> (y_seen, y_settled): what the caller's stream read right after the call, and the
        buffer after a device-wide sync. Raises StreamOrderError when the hold could not cover the call."""
        if self.device != "cuda":
            return self._attempt(fn, planes, x, N, K, kpad)
        _cuda_sync()  # inputs made on other streams are complete before the gate's stream uses them
        with torch.cuda.stream(self.stream):
            return self._attempt(fn, planes, x, N, K, kpad)

    def _attempt(self, fn, planes, x, N, K, kpad):
        cuda = self.device == "cuda"
        x_in = torch.full_like(x, BF16_NAN)                                                   # [K] poison
        y = torch.full((N,), BF16_NAN, dtype=torch.bfloat16, device=self.device)              # [N] poison
        while True:
            if cuda:
                _cuda_sync()
            released = hold_stream(self.hold_s) if cuda else None
            x_in.copy_(x)                 # the producer: lands only when the hold ends
            fn(*planes, x_in, y, N, K, kpad)
            held = still_held(released) if cuda else True
            y_seen = y.clone()            # the consumer: the next op on the caller's stream
            if cuda:
                _cuda_sync()
            if held:
                return y_seen, y
            if self.hold_s >= HOLD_MAX_S:
                raise StreamOrderError(f"the call kept the host busy past a {self.hold_s:.1f} s hold of the "
                                       "stream: a launch must return at once (stream order cannot be checked)")
            self.hold_s = min(HOLD_MAX_S, self.hold_s * 4)
            x_in.fill_(BF16_NAN)
            y.fill_(BF16_NAN)


def settled_mismatch(y_seen: torch.Tensor, y: torch.Tensor) -> str | None:
    """A reason when the output changed after the caller's stream read it, else None."""
    changed = y_seen.view(torch.int16) != y.view(torch.int16)
    if not changed.any():
        return None
    rows = changed.nonzero().flatten()[:5].tolist()
    return (f"output changed after the caller's stream read it ({int(changed.sum())} of {y.numel()} rows, "
            f"first {rows}): the work finishes off the caller's stream (side stream or thread, not joined back)")


class TimingHooks:
    """Stream-order staging for timed runs. The timer calls stage(i) just before its start event and
    collect(i) just after its end event (neither is timed); run(i) launches on the staged input.
    After the timer, `seen[i]` holds what the caller's stream read from input set i's last run."""

    def __init__(self, xs, n: int, device: str):
        self.xs = xs
        self.x_in = torch.full_like(xs[0], BF16_NAN)                                          # [K]
        self.ys = [torch.full((n,), BF16_NAN, dtype=torch.bfloat16, device=device) for _ in xs]
        self.seen = [torch.full_like(y, BF16_NAN) for y in self.ys]

    def stage(self, i: int) -> None:
        self.ys[i].fill_(BF16_NAN)     # a side stream that wrote during the hold is overwritten
        self.x_in.copy_(self.xs[i])

    def collect(self, i: int) -> None:
        self.seen[i].copy_(self.ys[i])
        self.x_in.fill_(BF16_NAN)      # the next run's early reader gets NaN

    def mismatches(self) -> list:
        return [m for m in (settled_mismatch(s, y) for s, y in zip(self.seen, self.ys)) if m]
