"""Engine-step A/B: the speculative loop's step times under several EngineConfigs, interleaved.

    python -m specpilot.bench.engine_ab --preset qwen3-8b --configs default,weights=split12 [--e2e]
    python -m specpilot.bench.engine_ab --configs default,early_launch=false --e2e --reps 3

A configuration is `default` or `field=value[+field=value...]` over EngineConfig's fields, plus the
weight format `weights=bf16|split12` (bench/ab_configs.py). The random-weight scale pair of the preset
is built once per weight format; each rep then runs every configuration in turn (A, B, A, B, ...) on a
fresh Engine, so drift on a shared machine hits all sides alike. Per configuration: the graphed AR,
verify16 and draft step times at --context tokens of context (bench/step_times.py) and, with --e2e,
whole greedy generations (AR, and spec replaying --tau over the AR transcript: host time included).
Writes one JSONL row per (rep, configuration) to --out; prints a markdown table (medians over reps).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
from contextlib import nullcontext

from .jsonl import row_writer

STEP_KEYS = ("ar_ms", "verify_ms", "draft_ms", "e2e_ar_ms_per_token", "e2e_spec_ms_per_step", "e2e_spec_tokens_per_s")


def engine_config_class():
    from specpilot.config import EngineConfig
    return EngineConfig


def summarize(rows: list[dict]) -> list[dict]:
    """Per configuration (in first-seen order): the median of each timed key over its reps."""
    order, by_config = [], {}
    for r in rows:
        if r["config"] not in by_config:
            order.append(r["config"])
            by_config[r["config"]] = []
        by_config[r["config"]].append(r)
    out = []
    for name in order:
        reps = by_config[name]
        s = {"config": name, "weights": reps[0]["weights"], "reps": len(reps), "floor_ms": reps[0]["floor_ms"]}
        for key in STEP_KEYS:
            values = [r[key] for r in reps if r.get(key) is not None]
            if values:
                s[key] = statistics.median(values)
        out.append(s)
    return out


def table(summary: list[dict]) -> str:
    """Markdown: step times, their ratios, AR over the weight floor and AR against the first row."""
    e2e = any("e2e_spec_tokens_per_s" in s for s in summary)
    head = ["config", "weights", "reps", "AR ms", "verify16 ms", "draft ms", "verify/AR", "draft/verify",
            "AR/floor", "AR vs first"] + (["e2e AR ms/token", "e2e spec ms/step", "e2e spec tok/s"] if e2e else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first_ar = summary[0]["ar_ms"] if summary else None
    for s in summary:
        ar, verify, draft = s["ar_ms"], s["verify_ms"], s.get("draft_ms")
        cells = [s["config"], s["weights"], str(s["reps"]), f"{ar:.3f}", f"{verify:.3f}",
                 f"{draft:.3f}" if draft else "–", f"{verify / ar:.3f}", f"{draft / verify:.3f}" if draft else "–",
                 f"{ar / s['floor_ms']:.3f}", f"{first_ar / ar:.3f}x"]
        if e2e:
            cells += [f"{s[k]:.3f}" if k in s else "–" for k in STEP_KEYS[3:5]]
            cells.append(f"{s['e2e_spec_tokens_per_s']:.1f}" if "e2e_spec_tokens_per_s" in s else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.engine_ab", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--configs", default="default", help="comma-separated: default or field=value[+field=value]")
    p.add_argument("--reps", type=int, default=2, help="rounds over all configurations")
    p.add_argument("--iters", type=int, default=30, help="graph replays per step time")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache when the steps are timed")
    p.add_argument("--e2e", action="store_true", help="also whole replayed generations (host time included)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="--e2e: prompt length (random ids)")
    p.add_argument("--tokens", type=int, default=512, help="--e2e: new tokens per generation")
    p.add_argument("--tau", type=float, default=6.49, help="--e2e: replayed tokens per spec step")
    p.add_argument("--out", default=None, help="JSONL file, one row per (rep, configuration)")
    args = p.parse_args(argv)
    from .ab_configs import parse_configs

    config_cls = engine_config_class()
    try:
        configs = parse_configs(args.configs, config_cls)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"engine_ab: --configs: {e}") from None
    if args.reps < 1:
        raise SystemExit(f"engine_ab: --reps={args.reps} must be >= 1")

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("engine_ab: needs a CUDA GPU")
    from specpilot.engine import Engine

    from .scale_models import HBM_BYTES_PER_S, scale_pair, to_split12, weight_bytes
    from .step_times import replayed_generation, step_times

    pairs = {}
    for weights in dict.fromkeys(c.weights for c in configs):
        pairs[weights] = scale_pair(args.preset)
        if weights == "split12":
            print("split12 bits/weight", to_split12(*pairs[weights]), flush=True)
    seq_len = 1 << (max(args.context, args.prompt_tokens + args.tokens) + 64).bit_length()
    prompt = torch.randint(0, 256, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    gpu = torch.cuda.get_device_name()
    writer = (row_writer(args.out, "engine_ab", preset=args.preset, gpu=gpu, context=args.context) if args.out
              else nullcontext(lambda row: None))
    rows, failed, first_tokens = [], None, {}
    with writer as write:
        for rep in range(args.reps):
            for c in configs:
                target, drafter = pairs[c.weights]
                row = {"config": c.name, "weights": c.weights, "rep": rep,
                       "overrides": {k: str(v) for k, v in c.overrides.items()},
                       "floor_ms": weight_bytes(target) / HBM_BYTES_PER_S * 1e3}
                engine = Engine(target, drafter, max_seq_len=seq_len, config=c.engine_config(config_cls))
                try:
                    row.update(step_times(engine, drafter.block_size, args.iters, args.context))
                    if args.e2e:
                        row.update(replayed_generation(engine, prompt, args.tokens, args.tau))
                        row.update(replay_tau=args.tau, new_tokens=args.tokens)
                except RuntimeError as e:            # recorded; a CUDA fault poisons the context, so stop
                    failed = f"{c.name}: {str(e)[:300]}"
                    break
                finally:
                    del engine
                    gc.collect()
                    torch.cuda.empty_cache()
                tokens = row.pop("e2e_tokens", None)
                if tokens is not None:                # same tokens as this weight format's first config?
                    row["e2e_same_tokens"] = first_tokens.setdefault(c.weights, tokens) == tokens
                rows.append(row)
                write(row)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            if failed:
                break
    if rows:
        print(f"\n{args.preset}, random weights, {args.context} tokens of context, CUDA graphs, {gpu}; "
              f"{args.reps} rep(s) interleaved, medians; floor = weights / {HBM_BYTES_PER_S / 1e12:.1f} TB/s")
        print(table(summarize(rows)))
    if failed:
        print(f"FAILED {failed}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
