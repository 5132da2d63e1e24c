"""The gates every candidate must pass before its time counts. Same code on CPU and GPU.

split12 GEMV cascade (stops at the first failure, every check that ran is recorded):
  decode         one-hot inputs: y must equal the chosen weight columns exactly (bit-exact decode)
  exact_arith    small-integer weights and inputs: every fp32 partial sum is exact, so y must equal
                 bf16_rne(exact sum) bit for bit (catches products or sums kept in lower precision)
  tolerance      realistic weights (escapes included), several fresh inputs on the same weights,
                 fp64 reference with the fp32-accumulation bound
  held_out       shapes the candidate never saw: small random ones (tails not multiples of 8 or
                 32) and one 2-4x larger than the suite shape in both N and K
  exact_large_k  exact_arith again at a few rows and a K of 4-8x the suite's (at least 4096): a
                 precision drop kept for large K only
  determinism    a second run on the same inputs must agree bit for bit
  stateless      the weights are rewritten in place (same pointers), then the same input into the
                 same output buffer: y must follow the new weights (catches caches keyed on
                 pointers or input bytes)
  graph_capture  (CUDA) one call captured in a CUDA graph on the caller's stream, then replayed on a
                 fresh input: the engine runs every kernel inside graphs, and work forked to a side
                 stream and never joined back fails the capture (a race the stream hold can lose)
  side_effects   no thread left running
  timing         every call on an input never used before, into an output buffer picked at random
                 from a pool; every output read back is rechecked against its own input
  roofline       implied bandwidth above the measured copy bandwidth (x1.3) is rejected as suspect
Around every call of every step (agents/gate_call.py; the verdict names the check that fired):
  stream_order   the input is queued on the caller's stream behind a device-side hold and the output
                 is read back by that stream (agents/stream_order.py)
  inputs         weight planes and x bit-identical after the call
  guard          no write into the guard elements around x and y
  tamper         no protected clock, sync function, or gate/timer function replaced
Inputs come from a secret per-gate seed (os.urandom); outputs are poisoned with NaN before every
call; the reference is computed after the candidate ran, never before.
"""
import os
import sys
import threading
from dataclasses import dataclass, field

import torch

from specpilot.agents import gate_call, stream_order, timing as agents_timing
from specpilot.agents.gate_call import CallProblem, InputWatch, TimingHooks, check_after_call, protect_object, tamper_check
from specpilot.agents.stream_order import GUARD, OrderedCall, StreamOrderError, cuda_sync, settled_mismatch
from specpilot.formats.split12.reference import Split12Tensor
from specpilot.kernels.variants.split12_args import contract_args, pack
import specpilot.timing as package_timing

BF16_NAN_BITS = 0x7FC0
ROOFLINE_SLACK = 1.3  # reads-only kernels can beat copy bandwidth a little; not by 30%


@dataclass
class Verdict:
    check: str
    passed: bool
    reason: str = ""


@dataclass
class GateResult:
    passed: bool
    verdicts: list = field(default_factory=list)
    timing: object = None          # specpilot.timing.Timing of a passing candidate
    restart_worker: bool = False   # the candidate left state behind (threads, patches)

    @property
    def reason(self) -> str:
        failed = [v for v in self.verdicts if not v.passed]
        return f"{failed[0].check}: {failed[0].reason}" if failed else "passed"


class Rejected(Exception):
    def __init__(self, check: str, reason: str):
        super().__init__(f"{check}: {reason}")
        self.check, self.reason = check, reason


class Split12GemvGate:
    def __init__(self, device: str = "cpu", timer=None, copy_bandwidth: float | None = None,
                 held_out: int = 2, pool: int = 4):
        self.device, self.timer, self.copy_bandwidth = device, timer, copy_bandwidth
        self.held_out, self.pool = held_out, pool
        secret = int.from_bytes(os.urandom(8), "little") >> 1
        self.gen = torch.Generator(device=device).manual_seed(secret)
        self.host_gen = torch.Generator().manual_seed(secret ^ 0x5EED)
        self._ordered = OrderedCall(device)
        if timer is not None:
            protect_object(timer)  # its captured clock and sync functions

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

    def _pick(self, lo: int, hi: int) -> int:
        """A secret integer in [lo, hi)."""
        return int(torch.randint(lo, max(hi, lo + 1), (1,), generator=self.host_gen))

    def _held_out_shapes(self, shape):
        n, k = shape
        small = [(self._pick(1, 200), self._pick(1, 600)) for _ in range(self.held_out)]
        large = (self._pick(2 * n + 1, 4 * n), self._pick(2 * k + 1, 4 * k))  # past the suite shape
        return small + [large]

    def _large_k(self, shape) -> int:
        k = max(4 * shape[1], 4096)
        return self._pick(k, 2 * k)

    # ---- one call -----------------------------------------------------------------------------
    def _call(self, fn, a: Split12Tensor, x: torch.Tensor, y_buf=None) -> torch.Tensor:
        """One call with the input staged on, and the output read back by, the caller's stream
        (agents/stream_order.py), then every per-call check (agents/gate_call.py); returns what
        the caller's stream saw."""
        planes = contract_args(a)
        watch = InputWatch(planes)
        try:
            y_seen, y_buf, x_buf = self._ordered(fn, planes, x, a.N, a.K, a.kpad, y_buf)
        except StreamOrderError as e:
            raise Rejected("stream_order", str(e)) from None
        except Exception as e:  # a crash is a verdict, not a harness error
            raise Rejected("crash", f"{type(e).__name__}: {e}") from None
        try:
            check_after_call(watch, planes, list(a.planes()), x, x_buf, y_buf)
        except CallProblem as p:
            raise Rejected(p.check, p.reason) from None
        moved = settled_mismatch(y_seen, y_buf[GUARD:GUARD + a.N])
        if moved:
            raise Rejected("stream_order", moved)
        if self.device == "cuda" and not torch.isfinite(y_seen.float()).all() and self._finite_when_synced(fn, a, x):
            raise Rejected("stream_order", "NaN output with the input queued on the caller's stream, finite "
                                           "with a device-wide sync first: the work reads its input before the "
                                           "caller's stream produced it (launched off the caller's stream)")
        self._last_y_buf = y_buf
        return y_seen

    def _finite_when_synced(self, fn, a: Split12Tensor, x: torch.Tensor) -> bool:
        """Diagnosis only (an output already failed): the same call on a settled input, device synced."""
        y = torch.full((a.N,), float("nan"), dtype=torch.bfloat16, device=self.device)
        try:
            if self.device == "cuda":
                cuda_sync()
            fn(*contract_args(a), x.clone(), y, a.N, a.K, a.kpad)
            if self.device == "cuda":
                cuda_sync()
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
                 ("exact_arith", lambda: self._exact(fn, shape, "exact_arith")),
                 ("tolerance", lambda: self._tolerance(fn, shape, fresh_inputs=3)),
                 ("held_out", lambda: [self._held_out(fn, s) for s in self._held_out_shapes(shape)]),
                 ("exact_large_k", lambda: self._exact(fn, (self._pick(1, 33), self._large_k(shape)), "exact_large_k")),
                 ("determinism", lambda: self._determinism(fn, shape)),
                 ("stateless", lambda: self._stateless(fn, shape)),
                 ("side_effects", lambda: self._side_effects(threads_before))]
        if self.device == "cuda":
            steps.insert(-1, ("graph_capture", lambda: self._graph_capture(fn, shape)))
        if self.timer is not None:
            steps.append(("timing", lambda: self._timing(fn, shape, candidate, result)))
            steps.append(("side_effects_after_timing", lambda: self._side_effects(threads_before)))
            steps.append(("roofline", lambda: self._roofline(shape, result.timing)))
        for name, step in steps:
            try:
                step()
            except Rejected as r:
                # the verdict names the check that fired (a per-call check inside a step included)
                reason = r.reason if r.check == name else f"{r.reason} (during {name})"
                result.verdicts.append(Verdict(r.check, False, reason))
                result.restart_worker = (bool(tamper_check()) or threading.active_count() > threads_before
                                         or r.check in ("side_effects", "tamper", "guard")
                                         or (r.check == "crash" and self.device == "cuda"))  # a faulted context
                return result
            result.verdicts.append(Verdict(name, True))
        result.passed = True
        return result

    def _decode(self, fn, shape):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        cols = {k - 1, self._pick(0, k)}
        if a.esc_col.numel():  # a column holding an escape, so substitution is exercised
            cols.add(int(a.esc_col[self._pick(0, a.esc_col.numel())]))
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

    def _exact(self, fn, shape, check: str):
        n, k = shape
        m = max(1, min(31, int((2 ** 24 / max(k, 1)) ** 0.5)))  # |partial sums| < 2^24: exact in fp32
        w, x = self._randint(m, n, k), self._randint(m, k)
        y = self._call(fn, pack(w), x)
        self._check_written(check, y)
        self._check_finite(check, y)
        want = (w.double() @ x.double()).float().to(torch.bfloat16).float()
        bad = y.float() != want
        if bad.any():
            r = int(bad.nonzero()[0])
            raise Rejected(check, f"{int(bad.sum())} of {n} rows differ from the exact integer result at "
                                  f"K={k} (row {r}: got {float(y[r])}, exact {float(want[r])}): precision dropped somewhere")

    def _tolerance(self, fn, shape, fresh_inputs: int):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        for _ in range(fresh_inputs):
            x = self._randn(k).to(torch.bfloat16)
            y = self._call(fn, a, x)
            self._check_bound("tolerance", y, w, x)

    def _held_out(self, fn, shape):
        n, k = shape
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

    def _stateless(self, fn, shape):
        """Same pointers, same input bytes, same output buffer; only the weights' contents change."""
        n, k = shape
        w1 = self.realistic_weight(n, k)
        w2 = w1.roll(1, dims=1)  # same values per row: same base and escape counts, same plane sizes
        a1, a2 = pack(w1), pack(w2)
        x = self._randn(k).to(torch.bfloat16)
        self._call(fn, a1, x)
        y_buf = self._last_y_buf
        for dst, src in zip(contract_args(a1), contract_args(a2)):
            if dst.shape != src.shape:
                raise RuntimeError(f"stateless check: plane shapes differ {tuple(dst.shape)} vs {tuple(src.shape)}")
            dst.copy_(src)
        y = self._call(fn, a1, x, y_buf)
        try:
            self._check_bound("stateless", y, w2, x)
        except Rejected as r:
            raise Rejected("stateless", "after the weights were rewritten in place the output does not follow "
                                        f"them (state kept between calls, e.g. a cache): {r.reason}") from None

    def _graph_capture(self, fn, shape):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        planes = contract_args(a)
        x = torch.empty(k, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        graph = torch.cuda.CUDAGraph()
        cuda_sync()
        try:
            with torch.cuda.graph(graph, stream=self._ordered.stream):
                fn(*planes, x, y, n, k, a.kpad)
        except Exception as e:
            cuda_sync()
            raise Rejected("stream_order", f"the call cannot be captured in a CUDA graph on the caller's stream "
                                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): "
                                           "work forked off the stream and not joined back, or a host sync") from None
        fresh = self._randn(k).to(torch.bfloat16)
        x.copy_(fresh)
        y.fill_(float("nan"))
        graph.replay()
        cuda_sync()
        self._check_bound("graph_capture", y, w, fresh)

    def _side_effects(self, threads_before: int):
        patched = tamper_check()
        if patched:
            raise Rejected("tamper", f"replaced protected functions: {', '.join(patched)} (restored)")
        extra = threading.active_count() - threads_before
        if extra > 0:
            raise Rejected("side_effects", f"left {extra} thread(s) running after returning")

    def _timing(self, fn, shape, candidate, result):
        n, k = shape
        w = self.realistic_weight(n, k)
        a = pack(w)
        planes = contract_args(a)
        hooks = TimingHooks(lambda: self._randn(k).to(torch.bfloat16), n, planes, self.device, self.host_gen, self.pool)

        def run():
            fn(*planes, hooks.x_in, hooks.y, n, k, a.kpad)

        stream = self._ordered.stream
        try:
            if stream is not None:
                cuda_sync()
                with torch.cuda.stream(stream):
                    result.timing = self.timer.measure(run, hooks, candidate, shape)
                cuda_sync()
            else:
                result.timing = self.timer.measure(run, hooks, candidate, shape)
        except Exception as e:
            raise Rejected("timing", f"crash while timing: {type(e).__name__}: {e}") from None
        problem = hooks.problems()
        if problem is not None:
            raise Rejected(problem.check, problem.reason)
        moved = hooks.stream_mismatch()
        if moved:
            raise Rejected("stream_order", f"in the timed runs: {moved}")
        for x, seen in zip(hooks.xs, hooks.seen):  # every output read back, against its own input
            self._check_bound("timing", seen, w, x)

    def time_once(self, fn, shape, candidate=None):
        """One timing of an already gated fn, with every per-call and output check; -> Timing."""
        holder = GateResult(passed=False)
        self._timing(fn, shape, candidate, holder)
        return holder.timing

    def _roofline(self, shape, timing):
        n, k = shape
        nbytes = n * round_up32(k) * 1.5 + n + 2 * k + 2 * n
        seconds = timing.seconds
        if seconds <= 0:
            raise Rejected("roofline", f"non-positive time {seconds}")
        if self.copy_bandwidth:
            implied = nbytes / seconds
            if implied > ROOFLINE_SLACK * self.copy_bandwidth:
                raise Rejected("roofline", f"suspect: implied {implied / 1e9:.1f} GB/s exceeds the measured "
                                           f"copy bandwidth {self.copy_bandwidth / 1e9:.1f} GB/s x{ROOFLINE_SLACK}")


def round_up32(k: int) -> int:
    return (k + 31) // 32 * 32


def _protect_harness() -> None:
    """Everything the gate and the timers call is captured now, before any candidate code is imported."""
    for module in (sys.modules[__name__], gate_call, stream_order, agents_timing, package_timing):
        gate_call.protect_module(module)


_protect_harness()
