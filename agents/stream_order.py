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

from specpilot.timing import HOLD_MAX_S, cuda_sync, hold_stream, still_held  # noqa: F401 (one stream hold)

BF16_NAN = float("nan")
HOLD_START_S = 2e-3    # an honest launch from Python takes ~10-100 us of host time


class StreamOrderError(Exception):
    """Raised with a reason the gate turns into a verdict."""


GUARD = 64                # guard elements on each side of every staged input and output buffer
CANARY_BITS = 0x7FA5      # a NaN payload no kernel produces: a guard element holding anything else was written


def guarded(n: int, fill: float, device: str):
    """-> (buffer, view): a [n] bf16 view filled with `fill` inside a buffer whose GUARD elements on
    each side hold CANARY_BITS; `guard_written(buffer)` counts what anything wrote outside the view."""
    buf = torch.empty(n + 2 * GUARD, dtype=torch.bfloat16, device=device)
    buf.view(torch.int16).fill_(CANARY_BITS)
    view = buf[GUARD:GUARD + n]
    view.fill_(fill)
    return buf, view


def guard_written(buf: torch.Tensor) -> torch.Tensor:
    """Device-side count of guard elements that lost their canary (no host sync)."""
    bits = buf.view(torch.int16)
    return (bits[:GUARD] != CANARY_BITS).sum() + (bits[-GUARD:] != CANARY_BITS).sum()


class OrderedCall:
    """One gate call of fn(*planes, x, y, N, K, kpad) with the input staged on the caller's stream
    and the output read back by the caller's stream. `hold_s` is remembered across calls."""

    def __init__(self, device: str):
        self.device = device
        self.hold_s = HOLD_START_S
        # a high-priority stream as the caller's: when the input lands, the consumer read is
        # scheduled ahead of side-stream work that waited for the same input
        self.stream = torch.cuda.Stream(priority=-1) if device == "cuda" else None

    def __call__(self, fn, planes, x, N: int, K: int, kpad: int, y_buf=None):
        """-> (y_seen, y_buf, x_buf): what the caller's stream read right after the call, the guarded
        output buffer after a device-wide sync (view [GUARD:GUARD+N]) and the guarded staged input.
        `y_buf` reuses an output buffer (same pointer as an earlier call). Raises StreamOrderError
        when the hold could not cover the call."""
        if self.device != "cuda":
            return self._attempt(fn, planes, x, N, K, kpad, y_buf)
        cuda_sync()  # inputs made on other streams are complete before the gate's stream uses them
        with torch.cuda.stream(self.stream):
            return self._attempt(fn, planes, x, N, K, kpad, y_buf)

    def _attempt(self, fn, planes, x, N, K, kpad, y_buf):
        cuda = self.device == "cuda"
        x_buf, x_in = guarded(K, BF16_NAN, self.device)                                        # [K] poison
        if y_buf is None:
            y_buf, _ = guarded(N, BF16_NAN, self.device)
        y = y_buf[GUARD:GUARD + N]                                                             # [N]
        while True:
            y.fill_(BF16_NAN)
            if cuda:
                cuda_sync()
            released = hold_stream(self.hold_s) if cuda else None
            x_in.copy_(x)                 # the producer: lands only when the hold ends
            fn(*planes, x_in, y, N, K, kpad)
            held = still_held(released) if cuda else True
            y_seen = y.clone()            # the consumer: the next op on the caller's stream
            if cuda:
                cuda_sync()
            if held:
                return y_seen, y_buf, x_buf
            if self.hold_s >= HOLD_MAX_S:
                raise StreamOrderError(f"the call kept the host busy past a {self.hold_s:.1f} s hold of the "
                                       "stream: a launch must return at once (stream order cannot be checked)")
            self.hold_s = min(HOLD_MAX_S, self.hold_s * 4)
            x_in.fill_(BF16_NAN)


def settled_mismatch(y_seen: torch.Tensor, y: torch.Tensor) -> str | None:
    """A reason when the output changed after the caller's stream read it, else None."""
    changed = y_seen.view(torch.int16) != y.view(torch.int16)
    if not changed.any():
        return None
    rows = changed.nonzero().flatten()[:5].tolist()
    return (f"output changed after the caller's stream read it ({int(changed.sum())} of {y.numel()} rows, "
            f"first {rows}): the work finishes off the caller's stream (side stream or thread, not joined back)")
