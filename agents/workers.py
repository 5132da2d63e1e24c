"""Where candidates run: never in the controller. One worker process per GPU (or a few on CPU);
each candidate is a request with a deadline, and a worker that misses it is killed (a hung kernel
dies with its process) and replaced. A worker is also replaced after a candidate that left state
behind (threads, patched clocks, a faulted CUDA context). Ray (RayPool) is the backend for
many GPUs or hosts; it is an optional extra, and asking for it without it installed is an error.
"""
import multiprocessing as mp
import os
import time
from multiprocessing.connection import wait

_TIMERS = {}


def _timer(spec: dict):
    """One timer per spec per worker, made before any candidate code of the task is imported."""
    import json

    from specpilot.agents.timing import make_timer

    key = json.dumps(spec, sort_keys=True)
    if key not in _TIMERS:
        _TIMERS[key] = make_timer(spec)
    return _TIMERS[key]


def evaluate_task(task: dict) -> dict:
    """Runs inside a worker: build the candidate, gate it, time it. Returns plain data.
    A task with "pair" re-times two gated candidates side by side (see time_pair)."""
    from specpilot.agents.candidates import Candidate, build_callable

    if "pair" in task:
        return time_pair(task)
    cand = Candidate.from_dict(task["candidate"])
    device = task["device"]
    if cand.op == "chain_accept":
        from specpilot.agents.gate_accept import check_chain_accept

        try:
            fn = build_callable(cand)
        except Exception as e:
            return _fail("build", f"{type(e).__name__}: {str(e)[:2000]}")
        r = check_chain_accept(fn, device=device)
        return {"verdicts": [vars(v) for v in r.verdicts], "time_s": None}
    if cand.op != "split12_gemv":
        return _fail("build", f"no worker evaluation for op {cand.op!r}")
    if cand.kind == "cuda" and device != "cuda":
        return _fail("build", "a CUDA candidate needs a GPU (this run is on the CPU)")
    timer = _timer(task["timer"])
    try:
        fn = build_callable(cand)
    except Exception as e:  # compile errors are verdicts
        return _fail("build", f"{type(e).__name__}: {str(e)[:2000]}")
    from specpilot.agents.gate import Split12GemvGate

    bandwidth = task.get("copy_bandwidth") or getattr(timer, "bandwidth", None)
    gate = Split12GemvGate(device, timer, copy_bandwidth=bandwidth)
    r = gate.run(fn, tuple(cand.shape), cand)
    out = {"verdicts": [vars(v) for v in r.verdicts], "restart": r.restart_worker, "time_s": None}
    if r.passed and r.timing is not None:
        out.update(time_s=r.timing.seconds, timing_label=r.timing.label, timing_extra=r.timing.extra)
    compiled = getattr(fn, "compiled", None)
    if compiled is not None:
        out["cubin_key"] = compiled.key
    return out


def time_pair(task: dict) -> dict:
    """Incumbent and candidate (both already gated) re-timed in one worker, interleaved, `repeats`
    times (the order alternates), each timing on fresh inputs with every per-call check on.
    -> {"incumbent_s": [...], "candidate_s": [...]} or a failed verdict."""
    from specpilot.agents.candidates import Candidate, build_callable
    from specpilot.agents.gate import Rejected, Split12GemvGate

    timer = _timer(task["timer"])
    cands = [Candidate.from_dict(d) for d in task["pair"]]
    try:
        fns = [build_callable(c) for c in cands]
    except Exception as e:
        return _fail("build", f"{type(e).__name__}: {str(e)[:2000]}")
    gate = Split12GemvGate(task["device"], timer)
    times = [[], []]
    try:
        for r in range(int(task.get("repeats", 5))):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[i].append(gate.time_once(fns[i], tuple(cands[i].shape), cands[i]).seconds)
    except Rejected as e:
        return {**_fail(e.check, f"{e.reason} (during the paired re-timing)"), "restart": True}
    return {"verdicts": [], "incumbent_s": times[0], "candidate_s": times[1]}


def _fail(check: str, reason: str) -> dict:
    return {"verdicts": [{"check": check, "passed": False, "reason": reason}], "time_s": None}


def _worker_main(conn, gpu_index):
    if gpu_index is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_index)  # before CUDA is initialised here
    import specpilot.agents.gate  # noqa: F401  (the heavy imports, before the first deadline starts)

    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            result = evaluate_task(task)
        except BaseException as e:  # never let one candidate take the worker loop down silently
            result = _fail("crash", f"{type(e).__name__}: {e}")
            result["restart"] = True
        conn.send(result)


class _Worker:
    STARTUP_S = 300.0  # importing torch on a busy machine; not charged to any candidate

    def __init__(self, ctx, gpu_index):
        self.gpu_index = gpu_index
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, gpu_index), daemon=True)
        self.proc.start()
        child.close()
        self.task_index = None
        self.deadline = None
        try:
            ready = self.conn.poll(self.STARTUP_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.stop(kill=True)
            raise RuntimeError(f"agent worker (gpu {gpu_index}) did not start within {self.STARTUP_S:.0f} s "
                               f"(exit code {self.proc.exitcode})")

    def stop(self, kill: bool = False):
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class WorkerPool:
    """run(tasks, on_result) evaluates tasks on n workers and calls on_result(i, result) as each
    finishes (the loop records it at once), returning the results in task order."""

    def __init__(self, n_workers: int, device: str, timeout_s: float = 120.0):
        if n_workers < 1:
            raise ValueError(f"need at least one worker, got {n_workers}")
        self.device, self.timeout_s = device, timeout_s
        # spawn, never fork: CUDA cannot be re-initialised in a forked child, and a fork taken after
        # torch's CPU thread pool ran can deadlock in the child (seen here: every task timed out)
        self.ctx = mp.get_context("spawn")
        self.gpus = list(range(n_workers)) if device == "cuda" else [None] * n_workers
        self.workers = [_Worker(self.ctx, g) for g in self.gpus]

    def run(self, tasks: list, on_result=None) -> list:
        results = [None] * len(tasks)
        pending = list(range(len(tasks)))
        while pending or any(w.task_index is not None for w in self.workers):
            for w in self.workers:
                if w.task_index is None and pending:
                    i = pending.pop(0)
                    try:
                        w.conn.send(tasks[i])
                    except (BrokenPipeError, OSError):  # the worker died while idle: replace, retry once
                        w = self._replace(w, kill=True)
                        w.conn.send(tasks[i])
                    w.task_index, w.deadline = i, time.monotonic() + self.timeout_s
            busy = [w for w in self.workers if w.task_index is not None]
            next_deadline = min(w.deadline for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for w in busy:
                if w.conn in ready:
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):
                        result = _fail("crash", f"worker process died (exit code {w.proc.exitcode})")
                        result["restart"] = True
                elif time.monotonic() >= w.deadline:
                    result = _fail("timeout", f"no result within {self.timeout_s:.0f} s: worker killed")
                    result["restart"] = "kill"
                else:
                    continue
                i, w.task_index = w.task_index, None
                results[i] = result
                if result.get("restart"):
                    self._replace(w, kill=result["restart"] == "kill" or not w.proc.is_alive())
                if on_result is not None:
                    on_result(i, result)
        return results

    def _replace(self, w: _Worker, kill: bool) -> _Worker:
        w.stop(kill=kill)
        fresh = _Worker(self.ctx, w.gpu_index)
        self.workers[self.workers.index(w)] = fresh
        return fresh

    def close(self):
        for w in self.workers:
            w.stop()


class RayPool:
    """The same interface on Ray, for workers across GPUs and hosts: one task per candidate (num_gpus=1
    pins a GPU through CUDA_VISIBLE_DEVICES; on the CPU num_cpus=1), at most n_workers in flight,
    max_retries=0 (a benchmark is not idempotent), a fresh worker process per task (max_calls=1: a
    faulted CUDA context or a patched clock dies with it), ray.cancel(force=True) kills a hung one.
    Joins a running cluster when ray.init finds one (RAY_ADDRESS), else starts a local instance and
    shuts it down on close. Ray is an optional extra (`pip install specpilot[ray]`)."""

    def __init__(self, n_workers: int, device: str, timeout_s: float = 120.0):
        if n_workers < 1:
            raise ValueError(f"need at least one worker, got {n_workers}")
        try:
            import ray
        except ImportError as e:
            raise RuntimeError("--backend ray needs the ray package (pip install 'ray>=2.9', or the "
                               "specpilot[ray] extra); use --backend process on one host") from e
        self.owns = not ray.is_initialized()
        if self.owns:
            kw = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": max(n_workers, 1)}
            ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, **kw)
        self.ray, self.n, self.device, self.timeout_s = ray, n_workers, device, timeout_s
        resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
        self.remote = ray.remote(max_retries=0, max_calls=1, **resources)(evaluate_task)

    def run(self, tasks: list, on_result=None) -> list:
        ray = self.ray
        results = [None] * len(tasks)
        pending, refs, started = list(range(len(tasks))), {}, {}

        def finish(i, result):
            results[i] = result
            if on_result:
                on_result(i, result)

        while pending or refs:
            while pending and len(refs) < self.n:
                i = pending.pop(0)
                ref = self.remote.remote(tasks[i])
                refs[ref], started[ref] = i, time.monotonic()
            done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in done:
                i = refs.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:   # the task's process died or raised: a verdict, not a crash
                    result = _fail("crash", f"{type(e).__name__}: {str(e)[:2000]}")
                finish(i, result)
            for ref in [r for r in refs if time.monotonic() - started[r] > self.timeout_s]:
                ray.cancel(ref, force=True)
                finish(refs.pop(ref), _fail("timeout", f"no result within {self.timeout_s:.0f} s: task cancelled"))
        return results

    def close(self):
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()


def make_pool(n_workers: int, device: str, timeout_s: float, backend: str = "process"):
    """backend "process": worker processes on this host; "ray": Ray tasks (an error if Ray is missing,
    never a silent switch to the process pool)."""
    if backend == "ray":
        return RayPool(n_workers, device, timeout_s)
    if backend != "process":
        raise ValueError(f"unknown worker backend {backend!r}: process or ray")
    return WorkerPool(n_workers, device, timeout_s)
