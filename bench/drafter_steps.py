"""The drafter comparison bench: each drafter kind's draft step against its floor, the cost of the part
each kind adds (DFlash2's selector, DSpark's Markov head, PARD's padded pard rows), and end-to-end
speedup over our AR at one request and batched, on one random target (the scale tier).

    python -m specpilot.bench.drafter_steps --preset qwen3-8b --kinds dflash,dflash2,dspark,pard \\
        [--concurrency 1,16] [--tau 4.0] [--no-e2e] --out OUT/drafter_steps.json
    python -m specpilot.bench.drafter_steps --preset tiny-qwen3 --device cpu ...   (the code path only)

One bf16 random target of the preset serves every kind; each kind's drafter takes its published
scale shape on 8B presets (models/drafters/random_kinds.py SCALE_SHAPES; DFlash block 16, DFlash2
block 8, DSpark block 7 + anchor, PARD a Qwen3-0.6B-shaped model drafting 12).

Per kind, at --context tokens of context, after one committed step of round(tau) tokens:
  draft ms     the session's greedy propose, graphed as the engine runs it (bench/drafter_parts.py),
               back to back (CUDA events), median of --reps; floor ms and draft/floor (bench/drafter_floor.py)
  extra ms     the step minus the same step without the kind's extra part; share = extra / draft
  verify, AR   the target's graphed verify step (the kind's block) and AR step at that context
End to end (unless --no-e2e), whole greedy generations of --tokens new tokens from random prompts:
C = 1 on the single-request engine (our AR, then each kind's spec), C > 1 on the batched engine under
C closed-loop clients (batched AR, then spec where the batched engine runs the kind). Random weights
accept ~nothing, so every spec run replays the same --tau over the AR transcript of its prompt
(engine/replay.py): the table compares cost per step, not acceptance.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch

from .drafter_floor import draft_floor, drafter_shape, floor_ms
from .drafter_parts import EXTRA_PART, steady_draft, without_extra

ALL_KINDS = ("dflash", "dflash2", "dspark", "pard")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.drafter_steps", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--kinds", default=",".join(ALL_KINDS), help="comma list of drafter kinds")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp32"), help="default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--context", type=int, default=512, help="tokens in the caches when the steps are timed")
    p.add_argument("--iters", type=int, default=30, help="timed calls per step")
    p.add_argument("--reps", type=int, default=3, help="draft step timings (with and without the extra part "
                                                       "alternated); the medians count")
    p.add_argument("--tau", type=float, default=4.0, help="replayed tokens per spec step (the same for every kind)")
    p.add_argument("--concurrency", default="1,16", help="comma list; 1 = the single-request engine")
    p.add_argument("--prompts", type=int, default=2, help="C=1: prompts per run (C>1: C prompts, one per client)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256, help="new tokens per generation")
    p.add_argument("--no-e2e", action="store_true", help="step times only")
    p.add_argument("--out", default=None, help="JSON file with every number")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ALL_KINDS]
    if bad or not kinds:
        p.error(f"--kinds {args.kinds!r}: choose from {','.join(ALL_KINDS)}")
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        p.error(f"--concurrency {args.concurrency!r}: a comma list of ints >= 1, e.g. 1,16")
    for name in ("context", "iters", "reps", "prompts", "prompt_tokens", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    blocks = {k: block_size_of(args.preset, k) for k in kinds}
    if not 1 <= args.tau <= min(blocks.values()) or args.tau >= args.context:
        p.error(f"--tau {args.tau} must be in [1, {min(blocks.values())}] (the smallest block among {blocks})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here (use --device cpu with a tiny preset)")
    args.kinds, args.levels = kinds, levels
    args.torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[
        args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")]
    return args


def random_spec(preset: str, kind: str) -> str:
    return f"random:{preset}:{5 if '8b' in preset else 2}:{kind}"


def block_size_of(preset: str, kind: str) -> int:
    from .random_pair import default_block_size, parse

    try:
        parse(random_spec(preset, kind))
    except ValueError as e:
        raise SystemExit(f"drafter_steps: {e}") from None
    return default_block_size(random_spec(preset, kind))


def random_prompts(count: int, length: int, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (length,), generator=gen).tolist() for _ in range(count)]


# -- step times -----------------------------------------------------------------------------------
@torch.inference_mode()
def step_times(engine, kind: str, block: int, args, rates: dict) -> dict:
    """The steady draft step, its floor, its extra part, and the target's verify and AR steps."""
    from .device_rates import time_ms

    s = steady_draft(engine, block, args.context, min(block - 1, round(args.tau)))
    runner, dev = engine.runner, engine.device
    base = without_extra(s)
    with_part, without_part = [], []
    for _ in range(args.reps):                  # alternated, so drift hits both sides alike
        with_part.append(time_ms(s.step, args.iters, dev))
        if base is not None:
            without_part.append(time_ms(base, args.iters, dev))
    row = {"draft_ms": statistics.median(with_part)}
    if base is not None:
        row["without_extra_ms"] = statistics.median(without_part)
        row["extra_ms"] = row["draft_ms"] - row["without_extra_ms"]
        row["extra_share"] = row["extra_ms"] / row["draft_ms"]
    floor = draft_floor(engine.drafter, engine.target, block, args.context)
    row.update(floor, floor_ms=floor_ms(floor, rates["copy_bytes_per_s"], rates["matmul_flops_per_s"]))
    row["draft_over_floor"] = row["draft_ms"] / row["floor_ms"]
    ids = torch.randint(0, 256, (1, block), device=dev)
    features = s.session.uses_features
    row["verify_ms"] = time_ms(lambda: runner.target_step(ids, s.start, with_features=features), args.iters, dev)
    row["ar_ms"] = time_ms(lambda: runner.target_step(ids[:, :1], s.start, with_features=False), args.iters, dev)
    return row


def graphed_runner(engine):
    """The engine's runner on a GPU; on a CPU one that runs the graphed path with StaticShapeStep."""
    if engine.runner.use_graphs:
        return engine.runner
    from specpilot.engine.graphs import StaticShapeStep
    from specpilot.engine.steps import StepRunner

    return StepRunner(engine.target, engine.drafter, engine.cache, engine.draft_cache, True, StaticShapeStep,
                      config=engine.config)


# -- end to end -----------------------------------------------------------------------------------
def generations(engine, prompts, tokens: int, replays=None) -> dict:
    """Greedy generations (AR, or spec replaying `replays[i]` for prompt i) after an untimed short one."""
    run = (lambda p, r: engine.generate_ar(p, tokens)) if replays is None else (
        lambda p, r: engine.generate_spec(p, tokens, replay=r))
    engine.warmup()
    if replays is None:
        engine.generate_ar(prompts[0], min(8, tokens))
    else:
        from specpilot.engine.replay import AcceptanceReplay
        engine.generate_spec(prompts[0], min(8, tokens), replay=AcceptanceReplay([0] * 8, 1.0))
    results = [run(p, None if replays is None else replays[i]()) for i, p in enumerate(prompts)]
    steps = [a for r in results for a in r.acceptance_lengths]
    return {"tokens_per_s": sum(len(r.tokens) for r in results) / sum(r.decode_s for r in results),
            "tau": sum(steps) / len(steps) if steps and replays is not None else None,
            "replay_shortfalls": sum(r.replay_shortfalls for r in results), "tokens": [r.tokens for r in results]}


def batched(target, drafter, prompts, tokens: int, replays=None) -> tuple:
    """(metrics, results) of C = len(prompts) closed-loop clients on the batched engine, after an
    untimed one-request run (lazy inits)."""
    from specpilot.engine.batch import BatchConfig
    from specpilot.engine.replay import AcceptanceReplay

    from .concurrency import closed_loop

    warm = None if replays is None else [lambda: AcceptanceReplay([0] * 8, 1.0)]
    closed_loop(target, drafter, BatchConfig(), 1, prompts[:1], min(8, tokens), replays=warm)
    return closed_loop(target, drafter, BatchConfig(), len(prompts), prompts, tokens, replays=replays)


def replays_over(transcripts, tau: float):
    from specpilot.engine.replay import AcceptanceReplay

    return [(lambda t=t: AcceptanceReplay(t, tau)) for t in transcripts]


# -- the report -----------------------------------------------------------------------------------
def _f(value, fmt="{:.3f}"):
    return "–" if value is None else fmt.format(value)


def table(result: dict) -> str:
    levels = result["levels"] if result["e2e"] else []
    head = ["kind", "drafter", "block", "draft ms", "floor ms", "draft/floor", "extra part", "extra ms", "extra share",
            "verify ms", "AR ms"]
    for c in levels:
        head += [f"C={c} spec / AR tok/s", f"C={c} speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["kinds"]:
        cells = [r["kind"], r["shape"], str(r["block"]), _f(r["draft_ms"]), _f(r["floor_ms"]),
                 _f(r["draft_over_floor"], "{:.2f}"), EXTRA_PART.get(r["kind"], "–"), _f(r.get("extra_ms")),
                 _f(r.get("extra_share"), "{:.1%}"), _f(r["verify_ms"]), _f(r["ar_ms"])]
        for c in levels:
            e = r["e2e"][str(c)]
            if "skipped" in e:
                cells += ["not batched (see below)", "–"]
            else:
                cells += [f"{e['spec_tokens_per_s']:.1f} / {e['ar_tokens_per_s']:.1f}",
                          f"{e['speedup']:.2f}x at tau {e['tau']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    skipped = {e["skipped"] for r in result["kinds"] for e in r.get("e2e", {}).values() if "skipped" in e}
    return "\n".join(lines + [f"\nnot batched: {s}" for s in sorted(skipped)])


def summary_line(result: dict) -> str:
    keys = ("draft_ms", "floor_ms", "draft_over_floor", "extra_share", "verify_ms", "ar_ms")
    kinds = {}
    for r in result["kinds"]:
        k = {key: round(r[key], 4) for key in keys if r.get(key) is not None}
        k.update({f"speedup_c{c}": None if "skipped" in e else round(e["speedup"], 3)
                  for c, e in r.get("e2e", {}).items()})
        kinds[r["kind"]] = k
    return json.dumps({"bench": "drafter_steps", "preset": result["preset"], "device": result["device_name"],
                       "tau": result["tau"], "wall_s": round(result["wall_s"], 1), "kinds": kinds})


# -- main -----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.engine.batch.kind_drafting import supported as batched_kinds
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

    from .device_rates import copy_bandwidth, matmul_rate
    from .random_pair import random_drafter_of

    if args.device == "cpu":
        torch.set_num_threads(1)
    device = torch.device(args.device)
    rates = {"copy_bytes_per_s": copy_bandwidth(device), "matmul_flops_per_s": matmul_rate(device, args.torch_dtype)}
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{device_name}: copy {rates['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul "
          f"{rates['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s", file=sys.stderr, flush=True)
    target = random_target(TARGET_PRESETS[args.preset], device, args.torch_dtype, seed=0)
    blocks = {k: block_size_of(args.preset, k) for k in args.kinds}
    longest = max(args.context + 2 * max(blocks.values()), args.prompt_tokens + args.tokens + max(blocks.values()))
    seq_len = 1 << (longest + 64).bit_length()
    single = random_prompts(args.prompts, args.prompt_tokens, seed=1)
    wide = {c: random_prompts(c, args.prompt_tokens, seed=c + 1) for c in args.levels if c > 1}
    result = {"preset": args.preset, "device_name": device_name, "dtype": str(args.torch_dtype).replace("torch.", ""), "tau": args.tau,
              "context": args.context, "iters": args.iters, "levels": args.levels, "e2e": not args.no_e2e,
              "tokens": args.tokens, "prompt_tokens": args.prompt_tokens, **rates, "kinds": []}

    ar = {}                                     # per level: our AR's tok/s and the transcripts spec replays
    if not args.no_e2e:
        for c in args.levels:
            if c == 1:
                e = generations(Engine(target, None, max_seq_len=seq_len), single, args.tokens)
            else:
                metrics, results = batched(target, None, wide[c], args.tokens)
                e = {"tokens_per_s": metrics["tokens_per_s"], "tokens": [r.tokens for r in results]}
            ar[c] = e
            print(f"C={c} AR: {e['tokens_per_s']:.1f} tok/s", file=sys.stderr, flush=True)
            _release(device)

    for kind in args.kinds:
        block = blocks[kind]
        layers = 5 if "8b" in args.preset else 2
        drafter = random_drafter_of(kind, target, layers, block)
        engine = Engine(target, drafter, max_seq_len=seq_len, config=EngineConfig())
        saved, engine.runner = engine.runner, graphed_runner(engine)
        row = {"kind": kind, "block": block, "shape": drafter_shape(drafter)}
        row.update(step_times(engine, kind, block, args, rates))
        engine.runner = saved
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), file=sys.stderr,
              flush=True)
        if not args.no_e2e:
            row["e2e"] = {}
            for c in args.levels:
                replays = replays_over(ar[c]["tokens"], args.tau)
                if c == 1:
                    e = generations(engine, single, args.tokens, replays)
                elif kind not in batched_kinds():
                    row["e2e"][str(c)] = {"skipped": f"the batched engine drafts with {', '.join(batched_kinds())} "
                                                     f"drafters only (engine/batch/kind_drafting.py)"}
                    continue
                else:
                    metrics, results = batched(target, drafter, wide[c], args.tokens, replays)
                    e = {"tokens_per_s": metrics["tokens_per_s"], "tau": metrics["tau"],
                         "replay_shortfalls": metrics["replay_shortfalls"], "tokens": [r.tokens for r in results]}
                row["e2e"][str(c)] = {"spec_tokens_per_s": e["tokens_per_s"], "ar_tokens_per_s": ar[c]["tokens_per_s"],
                                      "speedup": e["tokens_per_s"] / ar[c]["tokens_per_s"], "tau": e["tau"],
                                      "replay_shortfalls": e["replay_shortfalls"],
                                      "same_tokens_as_ar": e["tokens"] == ar[c]["tokens"]}
                print(f"C={c} {kind}: {json.dumps(row['e2e'][str(c)])}", file=sys.stderr, flush=True)
        result["kinds"].append(row)
        del engine, drafter, saved
        _release(device)

    result["wall_s"] = time.perf_counter() - started
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    dtype = str(args.torch_dtype).replace("torch.", "")
    print(f"\n{args.preset}, random {dtype} weights, {device_name}, {args.context} tokens of context; "
          f"floor = max(weights + K/V bytes / {rates['copy_bytes_per_s'] / 1e12:.2f} TB/s copy, FLOPs / "
          f"{rates['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s matmul); issue 35's targets: draft/floor <= 1.15, "
          f"extra share <= 10%"
          + ("" if args.no_e2e else f"; end to end: {args.tokens} new tokens, replayed tau {args.tau} for every "
             f"kind (cost per step, not acceptance)"))
    print(table(result))
    print(summary_line(result))
    return 0


def _release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    raise SystemExit(main())
