"""Tree vs chain acceptance on one pair: tau per tree budget on the same prompts, each run checked
token for token against the target's own greedy AR output (a run that differs is an error).

    python -m specpilot.bench.tree_tau --target DIR --drafter DIR --prompts FILE.jsonl --limit 24 \
        --budgets 0,8,16,32 [--max-new-tokens 128] [--device cpu] [--dtype fp32] [--out FILE.json]

Budget 0 is the chain loop. Prints one line per prompt and a JSON summary (mean tau per budget,
its ratio to the chain's, decode tokens/s per budget: meaningful only on the device it ran on).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch


def measure(engine, prompts, max_new_tokens, stop, budgets) -> dict:
    """{budget: {"tau", "tokens_per_s", "steps", "tokens"}} over `prompts`; raises if any run's tokens
    differ from AR's."""
    acc = {b: {"accepted": 0, "steps": 0, "tokens": 0, "decode_s": 0.0} for b in budgets}
    base = engine.config
    for pid, ids in prompts:
        ar = engine.generate_ar(ids, max_new_tokens, stop).tokens
        line = []
        for b in budgets:
            engine.config = dataclasses.replace(base, tree_budget=b)
            r = engine.generate_spec(ids, max_new_tokens, stop)
            if r.tokens != ar:
                raise RuntimeError(f"{pid}: tree budget {b} produced tokens different from AR decoding")
            a = acc[b]
            a["accepted"] += sum(r.acceptance_lengths)
            a["steps"] += r.steps
            a["tokens"] += len(r.tokens)
            a["decode_s"] += r.decode_s
            line.append(f"{b}: tau {r.tau:.2f}")
        engine.config = base
        print(f"{pid} ({len(ids)} prompt tokens, {len(ar)} new): " + ", ".join(line), file=sys.stderr, flush=True)
    out = {}
    for b, a in acc.items():
        out[b] = {"tau": a["accepted"] / a["steps"] if a["steps"] else None, "steps": a["steps"],
                  "tokens": a["tokens"], "tokens_per_s": a["tokens"] / a["decode_s"] if a["decode_s"] else None}
    chain = out.get(0, {}).get("tau")
    for b in out:
        out[b]["tau_vs_chain"] = out[b]["tau"] / chain if chain and out[b]["tau"] else None
    return out


def main(argv=None) -> int:
    from specpilot.engine.cli_support import engine_for, load_pair, prompts_from_args
    from specpilot.config import EngineConfig
    from specpilot.models.loading import as_dtype

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--limit", type=int, default=24)
    p.add_argument("--budgets", default="0,8,16,32")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="fp32", choices=["bf16", "fp32"])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    if any(b < 0 for b in budgets):
        raise SystemExit(f"--budgets {args.budgets}: budgets must be >= 0")
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, as_dtype(args.dtype))
    prompts = prompts_from_args(args, tok)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens, EngineConfig(tree_budget=max(budgets)))
    stop = tuple(target.eos_token_ids)
    result = {"target": args.target, "drafter": args.drafter, "prompts": len(prompts), "device": str(engine.device),
              "card": torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
              "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
              "budgets": measure(engine, prompts, args.max_new_tokens, stop, budgets)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
