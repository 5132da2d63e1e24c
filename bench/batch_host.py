"""The batched engine's host work per decode step, without a GPU: the graphed path (engine/batch/
graphed.py) with every captured forward replaced by a free replay (its first call's outputs reused), so
a step's time is what the host does around the forwards: layouts, uploads, the accept loop, the
adaptive choice. A tiny random pair (block 16) at each concurrency; the tokens are meaningless.

    python -m specpilot.bench.batch_host [--concurrency 8,16,32] [--steps 200] [--profile N]

On a GPU these host seconds add to the device's in every spec step (the step reads its accepted
counts back before the next draft), so they bound what the batched engine can reach: docs/design.md
section 13 has the figures beside the device step times.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import torch

from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.engine.graphs import StaticShapeStep
from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target


class FreeReplay(StaticShapeStep):
    """A graph stand-in whose replays cost nothing: the first call runs the function, later calls only
    copy their inputs into the static buffers (as a replay's inputs) and return the first outputs."""

    def __call__(self, *inputs):
        for static, new in zip(self.inputs, inputs):
            static.copy_(new)
        if not getattr(self, "ran", False):
            self.outputs, self.ran = self.fn(*self.inputs), True
        return self.outputs


def host_ms_per_step(concurrency: int, steps: int, profile: int = 0) -> float:
    cfg = TARGET_PRESETS["tiny-llama"]
    target = random_target(cfg, seed=0)
    drafter = random_drafter(drafter_config_for(cfg, 2, block_size=16, layer_ids=[0, 2]), target, 1)
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=concurrency, kv_pages=32 * concurrency,
                         graph_step_factory=FreeReplay)
    engine.warmup(400)
    g = torch.Generator().manual_seed(0)
    for _ in range(concurrency):
        prompt = torch.randint(0, cfg.vocab_size, (40,), generator=g).tolist()
        engine.submit(Request(prompt_ids=prompt, max_new_tokens=10 * steps))
    while engine.queue or any(not s.decoding for s in engine.running):
        engine.step()                              # prefill first: decode steps only below
    first, t0 = engine.steps, time.perf_counter()
    for _ in range(steps):
        engine.step()
    ms = (time.perf_counter() - t0) / (engine.steps - first) * 1e3
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [engine.step() for _ in range(steps)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
    return ms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.batch_host", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="8,16,32")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--profile", type=int, default=0, help="print the N functions of most own time (cProfile)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [{"concurrency": int(c), "host_ms_per_step": host_ms_per_step(int(c), args.steps, args.profile)}
            for c in args.concurrency.split(",")]
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
