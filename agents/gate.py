"""The gates every candidate must pass before its time counts. Same code on CPU and GPU.

split12 GEMV cascade (stops at the first failure, every check that ran is recorded):
  decode         one-hot inputs: y must equal the chosen weight columns exactly (bit-exact decode)
  exact_arith    small-integer weights and inputs: every fp32 partial sum is exact, so y must equal
                 bf16_rne(exact sum) bit for bit (catches products or sums kept in lower precision)
  tolerance      realistic weights (escapes included), several fresh inputs on the same weights
                 (catches caching across calls), fp64 reference with the fp32-accumulation bound
  held_out       random shapes the candidate never saw, tails not multiples of 8 or 32
  determinism    a second run on the same inputs must agree bit for bit
  side_effects   inputs unmodified, no thread left running, clocks and sync functions not patched
  timing         rotating fresh inputs; what the caller's stream read from the timed runs is rechecked
  roofline       implied bandwidth above the measured copy bandwidth (x1.3) is rejected as suspect;
                 a timer that reports device-idle time (synced_s) also rejects time seen only there
  stream_order   (inside every call above, recorded under that step's name) the input is queued on
                 the caller's stream behind a device-side hold and the output is read back by that
                 stream: work launched on a side stream or finished by a thread reads NaN or is
                 not there yet (agents/stream_order.py). No check ever syncs the whole device
                 before reading an output it judges.
Inputs come from a secret per-gate seed (os.urandom); outputs are poisoned with NaN before every
call; the reference is computed after the candidate ran, never before.
"""
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from specpilot.agents.stream_order import OrderedCall, StreamOrderError, TimingHooks, settled_mismatch
from specpilot.formats.split12.reference import Split12Tensor
from specpilot.kernels.variants.split12_args import contract_args, pack

BF16_NAN_BITS = 0x7FC0
ROOFLINE_SLACK = 1.3  # reads-only kernels can beat copy bandwidth a little; not by 30%


def _protected():
    pairs = [(time, "perf_counter"), (time, "time"), (time, "monotonic"), (time, "process_time"),
             (torch, "equal"), (torch, "allclose")]
    if hasattr(torch, "cuda"):
        pairs += [(torch.cuda, "synchronize"), (torch.cuda.Event, "elapsed_time"),
                  (torch.cuda.Event, "record"), (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "query")]
    return [(owner, name, getattr(owner, name)) for owner, name in pairs]


_ORIGINALS = _protected()  # captured when the harness is imported, before any candidate
_cuda_sync = torch.cuda.synchronize


@dataclass
class Verdict:
    check: str
    passed: bool
    reason: str = ""


@dataclass
class GateResult:
    passed: bool
    verdicts: list = field(default_factory=list)
    timing: object = None          # agents.timing.Timing of a passing candidate
    restart_worker: bool = False   # the candidate left state behind (threads, patches)

    @property
    def reason(self) -> str:
        failed = [v for v in self.verdicts if not v.passed]
        return f"{failed[0].check}: {failed[0].reason}" if failed else "passed"


class Rejected(Exception):
    def __init__(self, check: str, reason: str):
        super().__init__(f"{check}: {reason}")
        self.check, self.reason = check, reason


def tamper_check() -> list:
    """Names of protected functions a candidate replaced; they are restored on the spot."""
    changed = []
    for owner, name, original in _ORIGINALS:
        if getattr(owner, name) is not original:
            changed.append(f"{getattr(owner, '__name__', owner)}.{name}")
            setattr(owner, name, original)
    return changed


class Split12GemvGate:
    def __init__(self, device: str = "cpu", timer=None, copy_bandwidth: float | None = None,
                 held_out: int = 2, timing_inputs: int = 4):
        self.device, self.timer, self.copy_bandwidth = device, timer, copy_bandwidth
        self.held_out, self.timing_inputs = held_out, timing_inputs
        secret = int.from_bytes(os.urandom(8), "little") >> 1
        self.gen = torch.Generator(device=device).manual_seed(secret)
        self.host_gen = torch.Generator().manual_seed(secret ^ 0x5EED)
        self._ordered = OrderedCall(device)

    # ---- inputs -------------------------------------------------------------------------------
    def _randn(self, *shape):
        return torch.randn(*shape, generator=self.gen, device=self.device)

    def realistic_weight(self, n: int, k: int) -> torch.Tensor:
        """Per-row scales over 12 octaves, ~0.5% zeros (±0) and ~0.2% far outliers (escapes)."""
        scale = torch.exp2(torch.rand(n, 1, generator=self.gen, device=self.device) * 12 - 8)
        w = self._randn(n, k) * scale
        u = torch.rand(n, k, generator=self.gen, device=self.device)
        w = torch.where(u < 0.0025, torch.zeros_like(w), w)
        w = torch.where((u >= 0.0025) & (u < 0.005), -torch.zeros_like(w), w)
        w = torch.where((u >= 0.005) & (u < 0.007), w * 2.0 ** 20, w)
        return w.to(torch.bfloat16)

    def _randint(self, m: int, *shape):
        return torch.randint(-m, m + 1, shape, generator=self.gen, device=self.device).to(torch.bfloat16)

    def _held_out_shape(self):
        n = int(torch.randint(1, 200, (1,), generator=self.host_gen))
        k = int(torch.randint(1, 600, (1,), generator=self.host_gen))
        return n, k

    # ---- one call -----------------------------------------------------------------------------
    def _call(self, fn, a: Split12Tensor, x: torch.Tensor) -> torch.Tensor:
        """One call with the input staged on, and the output read back by, the caller's stream
        (agents/stream_order.py); returns what the caller's stream saw."""
        try:
            y_seen, y = self._ordered(fn, contract_args(a), x, a.N, a.K, a.kpad)
        except StreamOrderError as e:
            raise Rejected("stream_order", str(e)) from None
        except Exception as e:  # a crash is a verdict, not a harness error
            raise Rejected("crash", f"{type(e).__name__}: {e}") from None
        moved = settled_mismatch(y_seen, y)
        if moved:
            raise Rejected("stream_order", moved)
        if not torch.isfinite(y_seen.float()).all() and self._finite_when_synced(fn, a, x):
            raise Rejected("stream_order", "NaN output with the input queued on the caller's stream, finite "
                                           "with a device-wide sync first: the work reads its input before the "
                                           "caller's stream produced it (launched off the caller's stream)")
        return y_seen

    def _finite_when_synced(self, fn, a: Split12Tensor, x: torch.Tensor) -> bool:
        """Diagnosis only (an output already failed): the same call on a settled input, device synced."""
        y = torch.full((a.N,), float("nan"), dtype=torch.bfloat16, device=self.device)
        try:
            if self.device == "cuda":
                _cuda_sync()
            fn(*contract_args(a), x, y, a.N, a.K, a.kpad)
            if self.device == "cuda":
                _cuda_sync()
        except Exception:
            return False
        return bool(torch.isfinite(y.float()).all())

    def _check_written(self, check: str, y: torch.Tensor) -> None:
        poison = y.view(torch.int16) == BF16_NAN_BITS
        if poison.any():
            rows = poison.nonzero().flatten()[:5].tolist()
            raise Rejected(check, f"output not written: NaN poison left in {int(poison.sum())} of "
                                  f"{y.numel()} rows (first {rows})")

    def _check_finite(self, check: str, y: torch.Tensor) -> None:
        bad = ~torch.isfinite(y.float())
        if bad.any():
            rows = bad.nonzero().flatten()[:5].tolist()
            raise Rejected(check, f"non-finite output (NaN/inf) at rows {rows} where the reference is finite")

    def _check_bound(self, check: str, y, w, x) -> None:
        """|y - ref| <= gamma_K * S + 2^-8 (|ref| + gamma_K * S), S = |W| @ |x| (fp32 accumulation
        of exact products, then one bf16 rounding); NaN/inf anywhere the reference is finite fails."""
        self._check_written(check, y)
        wd, xd = w.double(), x.double()
        ref = wd @ xd
        s = wd.abs() @ xd.abs()
        k = w.shape[1]
        gamma = k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
        bound = gamma * s + 2.0 ** -8 * (ref.abs() + gamma * s) + 1e-37
        self._check_finite(check, y)
        yd = y.double()
        err = (yd - ref).abs()
        bad = err > bound
        if bad.any():
            r = int(bad.nonzero()[0])
            raise Rejected(check, f"{int(bad.sum())} of {y.numel()} rows beyond the fp32 bound at shape "
                                  f"{tuple(w.shape)} (row {r}: got {float(yd[r]):.6g}, fp64 {float(ref[r]):.6g}, "
                                  f"bound {float(bound[r]):.3g})")

    # ---- the cascade --------------------------------------------------------------------------
    def run(self, fn, shape, candidate=None) -> GateResult:
        result = GateResult(passed=False)
        threads_before = threading.active_count()
        steps = [("decode", lambda: self._decode(fn, shape)),
                 ("exact_arith", lambda: self._exact(fn, shape)),
                 ("tolerance", lambda: self._tolerance(fn, shape, fresh_inputs=3)),
                 ("held_out", lambda: [self._held_out(fn) for _ in range(self.held_out)]),
                 ("determinism", lambda: self._determinism(fn, shape)),
                 ("side_effects", lambda: self._side_effects(threads_before))]
        if self.timer is not None:
            steps.append(("timing", lambda: self._timing(fn, shape, candidate, result)))
            steps.append(("side_effects_after_timing", lambda: self._side_effects(threads_before)))
            steps.append(("roofline", lambda: self._roofline(shape, result.timing)))
        for name, step in steps:
            try:
                step()
            except Rejected as r:
                result.verdicts.append(Verdict(name, False, r.reason if r.check == name else f"{r.check}: {r.reason}"))
                result.restart_worker = (bool(tamper_check()) or threading.active_count() > threads_before
                                         or name.startswith("side_effects") or (r.check == "crash" and self.device == "cuda"))  # a faulted context
                return result
            result.verdicts.append(Verdict(name, True))
        result.passed = True
        return result

    def _decode(self, fn, shape):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        cols = {k - 1, int(torch.randint(0, k, (1,), generator=self.host_gen))}
        if a.esc_col.numel():  # a column holding an escape, so substitution is exercised
            pick = int(torch.randint(0, a.esc_col.numel(), (1,), generator=self.host_gen))
            cols.add(int(a.esc_col[pick]))
        for c in sorted(cols):
            x = torch.zeros(k, dtype=torch.bfloat16, device=self.device)
            x[c] = 1.0
            y = self._call(fn, a, x)
            self._check_written("decode", y)
            self._check_finite("decode", y)
            want = w[:, c].float()
            bad = y.float() != want  # -0 and +0 compare equal: 0 + (-0) is +0 in any sum
            if bad.any():
                r = int(bad.nonzero()[0])
                raise Rejected("decode", f"output is not the stored weights (lossy decode or garbage): column {c}, {int(bad.sum())} of {n} rows differ "
                                         f"(row {r}: got {float(y[r])!r}, weight {float(want[r])!r})")

    def _exact(self, fn, shape):
        n, k = shape
        m = max(1, min(31, int((2 ** 24 / max(k, 1)) ** 0.5)))  # |partial sums| < 2^24: exact in fp32
        w, x = self._randint(m, n, k), self._randint(m, k)
        a = pack(w)
        y = self._call(fn, a, x)
        self._check_written("exact_arith", y)
        self._check_finite("exact_arith", y)
        want = (w.double() @ x.double()).float().to(torch.bfloat16).float()
        bad = y.float() != want
        if bad.any():
            r = int(bad.nonzero()[0])
            raise Rejected("exact_arith", f"{int(bad.sum())} of {n} rows differ from the exact integer "
                                          f"result (row {r}: got {float(y[r])}, exact {float(want[r])}): "
                                          "precision dropped somewhere")

    def _tolerance(self, fn, shape, fresh_inputs: int):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        for _ in range(fresh_inputs):
            x = self._randn(k).to(torch.bfloat16)
            y = self._call(fn, a, x)
            self._check_bound("tolerance", y, w, x)

    def _held_out(self, fn):
        n, k = self._held_out_shape()
        w = self.realistic_weight(n, k)
        a = pack(w)
        x = self._randn(k).to(torch.bfloat16)
        self._check_bound("held_out", self._call(fn, a, x), w, x)

    def _determinism(self, fn, shape):
        n, k = shape
        a = pack(self.realistic_weight(n, k))
        x = self._randn(k).to(torch.bfloat16)
        y1, y2 = self._call(fn, a, x), self._call(fn, a, x)
        differ = y1.view(torch.int16) != y2.view(torch.int16)
        if differ.any():
            raise Rejected("determinism", f"two runs on the same inputs differ in {int(differ.sum())} rows")

    def _side_effects(self, threads_before: int):
        patched = tamper_check()
        if patched:
            raise Rejected("side_effects", f"patched timing/sync functions: {', '.join(patched)} (restored)")
        extra = threading.active_count() - threads_before
        if extra > 0:
            raise Rejected("side_effects", f"left {extra} thread(s) running after returning")

    def _timing(self, fn, shape, candidate, result):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        xs = [self._randn(k).to(torch.bfloat16) for _ in range(self.timing_inputs)]
        a_clone = [t.clone() for t in contract_args(a)]
        hooks = TimingHooks(xs, n, self.device)  # stream order holds for the timed runs too

        def run(i):
            fn(*contract_args(a), hooks.x_in, hooks.ys[i], n, k, a.kpad)

        try:
            result.timing = self.timer.measure(run, len(xs), candidate, shape, hooks=hooks)
            if self.device == "cuda":
                _cuda_sync()
        except Exception as e:
            raise Rejected("timing", f"crash while timing: {type(e).__name__}: {e}") from None
        moved = hooks.mismatches()
        if moved:
            raise Rejected("timing", f"stream order broken in the timed runs: {moved[0]}")
        for i, x in enumerate(xs):  # recheck what the caller's stream read from the timed runs
            self._check_bound("timing", hooks.seen[i], w, x)
        for before, after in zip(a_clone, contract_args(a)):
            if not torch.equal(before, after):
                raise Rejected("timing", "the candidate modified its weight inputs")

    def _roofline(self, shape, timing):
        n, k = shape
        nbytes = n * round_up32(k) * 1.5 + n + 2 * k + 2 * n
        seconds = timing.seconds
        if seconds <= 0:
            raise Rejected("roofline", f"non-positive time {seconds}")
        extra = timing.extra or {}
        if "synced_s" in extra:
            hidden = extra["synced_s"] - extra.get("sync_overhead_s", 0.0)
            if hidden > 1.5 * seconds + 10e-6:  # 10 us: the jitter of a device sync
                raise Rejected("roofline", f"work outside the timed stream: {seconds * 1e6:.1f} us on the "
                                           f"stream but {hidden * 1e6:.1f} us until the device is idle")
        if self.copy_bandwidth:
            implied = nbytes / seconds
            if implied > ROOFLINE_SLACK * self.copy_bandwidth:
                raise Rejected("roofline", f"suspect: implied {implied / 1e9:.0f} GB/s exceeds the measured "
                                           f"copy bandwidth {self.copy_bandwidth / 1e9:.0f} GB/s x{ROOFLINE_SLACK}")


def round_up32(k: int) -> int:
    return (k + 31) // 32 * 32
