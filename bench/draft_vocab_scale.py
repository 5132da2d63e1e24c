"""Draft and verify step times against the draft vocabulary size on a preset's shapes (scale tier: random
weights, so no tau): the measured counterpart of cost/two_level.py's break-even.

  python -m specpilot.bench.draft_vocab_scale --preset qwen3-8b --sizes 0,8192,16384,32768,65536 --device cuda

For each N (0: the full head) an Engine with EngineConfig(draft_vocab=N) over one random target and
5-layer drafter (a random ranking: which N rows are kept does not change the time) captures its graphs
and times the full-block draft step and the verify step (median of --reps, graphed on CUDA). N wins
end to end iff tau_N / tau_full > (draft_N + verify) / (draft_full + verify): printed per N.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch


def median_seconds(engine, fn, reps: int) -> float:
    times = []
    for _ in range(reps + 3):
        t0 = engine.clock()
        fn()
        times.append(engine.clock() - t0)
    return statistics.median(times[3:])


def main(argv=None) -> int:
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models.draft_vocab import TokenRanking
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--sizes", default="0,8192,16384,32768,65536")
    p.add_argument("--context", type=int, default=1024, help="position of the timed steps")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if args.preset not in TARGET_PRESETS:
        raise SystemExit(f"unknown preset {args.preset!r}; choose from {sorted(TARGET_PRESETS)}")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cfg = TARGET_PRESETS[args.preset]
    target = random_target(cfg, args.device, dtype, seed=0)
    drafter = random_drafter(drafter_config_for(cfg, args.draft_layers, args.block_size), target, seed=1)
    order = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(0))
    ranking = Path(tempfile.mkdtemp()) / "ranking.json"
    TokenRanking(tuple(order.tolist()), cfg.vocab_size, "random (timing only)").save(ranking)
    b, start = args.block_size, args.context
    ids = torch.zeros(1, b, dtype=torch.long, device=args.device)
    rows, full = [], None
    for n in (int(s) for s in args.sizes.split(",")):
        engine = Engine(target, drafter, max_seq_len=start + 4 * b,
                        config=EngineConfig(draft_vocab=n, draft_vocab_ranking=str(ranking)))
        engine.warmup(b)
        runner = engine.runner
        ctx = torch.zeros(1, b, len(runner.feature_layers) * cfg.hidden_size, device=args.device, dtype=dtype)
        with torch.inference_mode():
            draft = median_seconds(engine, lambda: runner.draft_step(ctx, start - b, ids, start, b), args.reps)
            verify = median_seconds(engine, lambda: runner.target_step(ids, start, with_features=True), args.reps)
        row = {"draft_vocab": n, "draft_s": draft, "verify_s": verify}
        full = full or row
        row.update(draft_over_full=draft / full["draft_s"],
                   break_even_tau_ratio=(draft + full["verify_s"]) / (full["draft_s"] + full["verify_s"]))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del engine
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"\n{args.preset}, {args.draft_layers}-layer drafter, block {b}, position {start}, {device}")
    print("| N | draft step (ms) | draft / full | verify (ms) | N wins iff tau_N / tau_full > |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['draft_vocab'] or 'full'} | {r['draft_s'] * 1e3:.3f} | {r['draft_over_full']:.3f} | "
              f"{r['verify_s'] * 1e3:.3f} | {r['break_even_tau_ratio']:.3f} |")
    print(json.dumps({"preset": args.preset, "device": device, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
