"""Where a batched step's time goes: the BatchEngine's AR and speculative steps at fixed concurrency,
every request past its prefill, against the step's memory floor.

    python -m specpilot.bench.batch_profile --preset qwen3-8b --concurrency 8,32 [--context 512] [--out DIR]

Per (mode, C): the median wall time of a step (synchronized), the phases of a spec step (draft,
verify + accept), the device time of its kernels (a step is host-bound when that is far below the wall
time), the floor (weights + KV read once over the card's copy bandwidth) and, under torch.profiler,
the top ops by device and by host time and the count of host-device synchronizations. Random weights
(scale tier): acceptance is ~nothing, so a spec step verifies full blocks and commits one token.
Per-kernel device times overlap under programmatic dependent launch (a kernel's wait for the one
before it counts as its own time): `--no-pdl` for an attribution, the default for the step times.
`--chunks` adds each mode with a prefill chunk in every step (`ar+chunk`, `spec+chunk`): a closed
loop's steps carry one while clients come and go, and those steps took most of its time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def build(preset: str, device, dtype, drafter_layers: int, block: int):
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    cfg = TARGET_PRESETS[preset]
    target = random_target(cfg, device, dtype, seed=0)
    drafter = random_drafter(drafter_config_for(cfg, drafter_layers, block), target, seed=1)
    return target, drafter


def engine_at(target, drafter, concurrency: int, context: int, steps: int, newcomers: bool = False,
              pdl: bool = True):
    """A BatchEngine with `concurrency` requests of `context` prompt tokens each, all past prefill;
    with `newcomers`, room for one more request (WithNewcomers); pdl=False: no programmatic dependent
    launch in its kernels."""
    import torch

    from specpilot.config import EngineConfig
    from specpilot.engine.batch import BatchConfig, BatchEngine, Request
    from specpilot.engine.batch.run import pool_pages

    max_new = 4 + steps * (drafter.block_size if drafter is not None else 1) + 64
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (context,), generator=gen).tolist() for _ in range(concurrency + newcomers)]
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=len(prompts),
                         kv_pages=pool_pages(prompts, max_new, len(prompts), BatchConfig().page_size),
                         engine_config=EngineConfig(attention_pdl=pdl, gemv_pdl=pdl))
    for p in prompts[:concurrency]:
        engine.submit(Request(tuple(p), max_new))
    while not all(s.decoding for s in engine.running) or len(engine.running) < concurrency:
        engine.step()
    return WithNewcomers(engine, context) if newcomers else engine


class WithNewcomers:
    """An engine whose every step carries a prefill chunk beside its decode rows, as a closed loop's
    steps do while clients come and go: whenever no request is queued or prefilling, a newcomer of
    `context` prompt tokens and one new token is submitted (it leaves after its prefill's token)."""

    def __init__(self, engine, context: int):
        import torch

        self.engine, self.context = engine, context
        self.gen = torch.Generator().manual_seed(1)

    def step(self):
        import torch

        from specpilot.engine.batch import Request

        engine = self.engine
        if not engine.queue and all(s.decoding for s in engine.running):
            engine.submit(Request(tuple(torch.randint(0, 256, (self.context,), generator=self.gen).tolist()), 1))
        return engine.step()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def time_steps(engine, steps: int, rounds: int = 3) -> list:
    """Seconds per step, each of `rounds` timings over `steps` back-to-back steps (the device synced
    only around each round: a step launched ahead of the host, as batched AR does, overlaps as in a
    run)."""
    out = []
    for _ in range(rounds):
        _sync(engine.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync(engine.device)
        out.append((time.perf_counter() - t0) / steps)
    return out


def phase_times(engine, steps: int) -> dict:
    """Median seconds of the draft half and the verify + accept half of a spec step."""
    from specpilot.engine.batch import step as step_module

    spent = {"draft": [], "verify_accept": []}
    originals = (step_module.draft_all, step_module.verify_and_accept)

    def timed(name, fn):
        def wrapper(*a, **k):
            _sync(engine.device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            _sync(engine.device)
            spent[name].append(time.perf_counter() - t0)
            return out
        return wrapper

    step_module.draft_all = timed("draft", originals[0])
    step_module.verify_and_accept = timed("verify_accept", originals[1])
    try:
        for _ in range(steps):
            engine.step()
    finally:
        step_module.draft_all, step_module.verify_and_accept = originals
    return {k: statistics.median(v) for k, v in spent.items() if v}


def profile(engine, steps: int, out: Path, tag: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    _sync(engine.device)
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        _sync(engine.device)
    events = prof.key_averages()
    device_key = "self_cuda_time_total" if engine.device.type == "cuda" else "self_cpu_time_total"
    (out / f"{tag}_by_device.txt").write_text(events.table(sort_by=device_key, row_limit=30))
    (out / f"{tag}_by_host.txt").write_text(events.table(sort_by="cpu_time_total", row_limit=40))
    device_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
                    for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    syncs = {e.key: e.count for e in events if e.key in SYNC_EVENTS}
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    return {"device_ms_per_step": device_us / 1e3 / steps, "syncs_per_step": {k: v / steps for k, v in syncs.items()},
            "launches_per_step": launches / steps}


def floor_ms(target, drafter, context: int, concurrency: int, bandwidth: float | None) -> dict:
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    c = target.config
    kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * context * concurrency * next(target.parameters()).element_size()
    out = {"weights_bytes": weights, "kv_bytes": kv}
    if bandwidth:
        out["floor_ar_ms"] = (weights + kv) / bandwidth * 1e3
    return out


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--concurrency", default="8,32")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--no-pdl", action="store_true",
                   help="kernels without programmatic dependent launch: under PDL a kernel starts before the one "
                        "it depends on ends, and the profiler counts its wait as its own time (the attention "
                        "combine kernel looked longer than the attention itself)")
    p.add_argument("--chunks", action="store_true",
                   help="also each mode with a prefill chunk in every step (a newcomer of --context tokens "
                        "always prefilling, chunks of the engine's default size)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="out/batch_profile")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, drafter = build(args.preset, device, dtype, args.drafter_layers, args.block)
    bandwidth = None
    if device.type == "cuda":
        from specpilot.bench.device_rates import copy_bandwidth

        bandwidth = copy_bandwidth("cuda")
    rows = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        for mode in ("ar", "spec", "ar+chunk", "spec+chunk")[:4 if args.chunks else 2]:
            engine = engine_at(target, drafter if mode.startswith("spec") else None, c, args.context, args.steps,
                               newcomers=mode.endswith("+chunk"), pdl=not args.no_pdl)
            time_steps(engine, 3, rounds=1)                              # warm-up
            wall = statistics.median(time_steps(engine, args.steps))
            row = {"mode": mode, "concurrency": c, "context": args.context, "step_ms": wall * 1e3,
                   **floor_ms(target, drafter, args.context, c, bandwidth)}
            if mode.startswith("spec"):
                row["phases_ms"] = {k: v * 1e3 for k, v in phase_times(engine, args.steps).items()}
            row.update(profile(engine, 3, out, f"{mode}_c{c}"))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()
    (out / "batch_profile.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"\n{'mode':10} {'C':>3} {'step ms':>8} {'device ms':>9} {'floor ms':>8} {'launches':>8} syncs")
    for r in rows:
        floor = f"{r['floor_ar_ms']:.2f}" if "floor_ar_ms" in r else "-"
        print(f"{r['mode']:10} {r['concurrency']:>3} {r['step_ms']:8.2f} {r['device_ms_per_step']:9.2f} {floor:>8} "
              f"{r['launches_per_step']:8.0f} {r['syncs_per_step']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
