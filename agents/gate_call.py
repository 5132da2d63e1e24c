"""What the gate checks around every single call of a candidate, in correctness and in timing:
  inputs   the weight planes and the staged input x are bit-identical after the call
  guard    nothing was written into the guard elements around the staged input and the output
  tamper   no protected function was replaced: the clocks and sync functions of `time` and
           `torch.cuda`, and every function or class bound in the gate's and timers' own modules
           (a module-bound clock such as specpilot.agents.timing._perf_counter included)
The originals are captured when the gate is imported, before any candidate code is; a replaced
function is put back on the spot.

`TimingHooks` stage each timed call on an input never used before (not in warm-up, not in an
earlier rep) into an output buffer picked at random from a pool, so a cache keyed on pointers or
input bytes never hits; every output the caller's stream read back is rechecked afterwards.
"""
import inspect
import time

import torch

from specpilot.agents.stream_order import BF16_NAN, GUARD, guard_written, guarded, settled_mismatch

_MISSING = object()


def _base_pairs():
    pairs = [(time, "perf_counter"), (time, "perf_counter_ns"), (time, "time"), (time, "monotonic"),
             (time, "process_time"), (torch, "equal"), (torch, "allclose")]
    if hasattr(torch, "cuda"):
        pairs += [(torch.cuda, "synchronize"), (torch.cuda.Event, "elapsed_time"),
                  (torch.cuda.Event, "record"), (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "query")]
    return pairs


# (owner, name, original, own): `own` entries are read from the owner's own __dict__ (a
# staticmethod stays itself), the others through getattr (inherited names of torch's classes)
_ORIGINALS = [(owner, name, getattr(owner, name), False) for owner, name in _base_pairs()]


def protect_module(module) -> None:
    """Guard every function and class bound in `module`, and the methods of its classes."""
    for name, value in list(vars(module).items()):
        if name.startswith("__") or not (callable(value) or inspect.ismodule(value)):
            continue
        _ORIGINALS.append((module, name, value, True))
        if inspect.isclass(value) and value.__module__ == module.__name__:
            for attr, member in list(vars(value).items()):
                if not attr.startswith("__") and (callable(member) or isinstance(member, (staticmethod, classmethod))):
                    _ORIGINALS.append((value, attr, member, True))


def protect_object(obj) -> list:
    """Guard an object's callable attributes (a timer's captured clock); -> the entries added."""
    known = {(id(o), n) for o, n, _, _ in _ORIGINALS}
    added = [(obj, k, v, True) for k, v in list(vars(obj).items()) if callable(v) and (id(obj), k) not in known]
    _ORIGINALS.extend(added)
    return added


def tamper_check() -> list:
    """Names of protected functions a candidate replaced; they are restored on the spot."""
    changed = []
    for owner, name, original, own in _ORIGINALS:
        now = vars(owner).get(name, _MISSING) if own else getattr(owner, name, _MISSING)
        if now is not original:
            changed.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{name}")
            setattr(owner, name, original)
    return changed


class CallProblem(Exception):
    def __init__(self, check: str, reason: str):
        super().__init__(f"{check}: {reason}")
        self.check, self.reason = check, reason


class InputWatch:
    """Copies of the weight planes; `changed(planes)` names those that differ (device-side compare)."""

    def __init__(self, planes):
        self.copies = [p.clone() for p in planes]

    def changed_count(self, planes) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.int64, device=self.copies[0].device)
        for before, now in zip(self.copies, planes):
            total += (before.view(torch.uint8) != now.contiguous().view(torch.uint8)).sum()
        return total

    def check(self, planes, names) -> None:
        for before, now, name in zip(self.copies, planes, names):
            if not torch.equal(before.view(torch.uint8), now.contiguous().view(torch.uint8)):
                raise CallProblem("inputs", f"the candidate modified its input plane {name!r}")


def check_after_call(watch: InputWatch, planes, names, x, x_buf, y_buf) -> None:
    """Every per-call check; raises CallProblem naming the first that fails."""
    patched = tamper_check()
    if patched:
        raise CallProblem("tamper", f"replaced protected functions: {', '.join(patched)} (restored)")
    watch.check(planes, names)
    x_in = x_buf[GUARD:GUARD + x.numel()]
    if not torch.equal(x_in.view(torch.int16), x.view(torch.int16)):
        raise CallProblem("inputs", f"the candidate wrote into its input x "
                                    f"({int((x_in.view(torch.int16) != x.view(torch.int16)).sum())} of {x.numel()} elements)")
    for what, buf in (("output y", y_buf), ("input x", x_buf)):
        hit = int(guard_written(buf))
        if hit:
            raise CallProblem("guard", f"out-of-bounds write: {hit} guard element(s) around the {what} were written")


class TimingHooks:
    """Stream-order staging for timed runs, on fresh inputs. The timer calls stage() just before its
    start event and collect() just after its end event (neither is timed); run() launches on
    `x_in` into `y`. Checks that need the host are done in collect(); device-side ones accumulate
    and are read once by `problems()` after the timer returned."""

    def __init__(self, fresh_x, n: int, planes, device: str, host_gen, pool: int = 4):
        self.fresh_x, self.n, self.planes, self.device, self.host_gen = fresh_x, n, planes, device, host_gen
        self.xs, self.seen, self.settled = [], [], []
        self.x_buf, self.x_in = guarded(fresh_x().numel(), BF16_NAN, device)
        self.pool = [guarded(n, BF16_NAN, device)[0] for _ in range(pool)]
        self.watch = InputWatch(planes)
        self.bad_inputs = torch.zeros((), dtype=torch.int64, device=device)
        self.bad_guards = torch.zeros((), dtype=torch.int64, device=device)
        self.patched = []
        self.y_buf = self.pool[0]
        self.y = self.y_buf[GUARD:GUARD + n]

    def stage(self) -> None:
        x = self.fresh_x()                                  # never seen by the candidate before
        self.xs.append(x)
        pick = int(torch.randint(0, len(self.pool), (1,), generator=self.host_gen))
        self.y_buf = self.pool[pick]
        self.y = self.y_buf[GUARD:GUARD + self.n]
        self.y.fill_(BF16_NAN)
        self.x_in.copy_(x)

    def collect(self) -> None:
        self.seen.append(self.y.clone())                   # what the caller's stream reads next
        self.settled.append(self.y)                        # the same buffer, read after the sync
        self.patched += tamper_check()
        self.bad_inputs += self.watch.changed_count(self.planes)
        self.bad_inputs += (self.x_in.view(torch.int16) != self.xs[-1].view(torch.int16)).sum()
        self.bad_guards += guard_written(self.y_buf) + guard_written(self.x_buf)
        self.x_in.fill_(BF16_NAN)                          # the next run's early reader gets NaN

    def problems(self) -> CallProblem | None:
        if self.patched:
            return CallProblem("tamper", f"replaced protected functions while timed: {', '.join(sorted(set(self.patched)))} (restored)")
        if int(self.bad_inputs):
            return CallProblem("inputs", f"the candidate modified its inputs while timed ({int(self.bad_inputs)} elements)")
        if int(self.bad_guards):
            return CallProblem("guard", f"out-of-bounds write while timed: {int(self.bad_guards)} guard element(s) written")
        return None

    def stream_mismatch(self) -> str | None:
        """Only the last use of each pooled buffer can be compared with its settled contents."""
        last = {}
        for i, y in enumerate(self.settled):
            last[y.data_ptr()] = i
        for i in sorted(last.values()):
            moved = settled_mismatch(self.seen[i], self.settled[i])
            if moved:
                return moved
        return None
