"""Certification rate of the certified LM head (EngineConfig.two_level = "certified-head") against the
bound's rank, on one pair: how often level 1 alone decides a verify row, and how often a whole step
needs no exact LM head (the rate that decides whether a fused kernel can win at batch 1).

  python -m specpilot.bench.certified_head_rate --target T --drafter D --prompts A.jsonl --limit 10 \\
      --ranks 0,32,64,128 --device cpu --dtype fp32

Every run's outputs must equal the single-level engine's (the run fails otherwise). Prints a markdown
table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> int:
    from specpilot.config import EngineConfig
    from specpilot.engine.certified_head import CertifiedHead
    from specpilot.engine.cli_support import engine_for
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import load_pair
    from specpilot.models.prompts import encode_prompt, read_prompts

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", required=True, action="append")
    p.add_argument("--limit", type=int, default=10, help="first N prompts of each file")
    p.add_argument("--ranks", default="0,32,64,128", help="ranks of the bound's subspace (0: row norms only)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("bf16", "fp32"))
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, dtype)
    prompts = [encode_prompt(tok, r) for path in args.prompts for r in read_prompts(path, args.limit)]
    stop = stop_ids_for(target, tok)
    single = engine_for(target, drafter, [(None, ids) for ids in prompts], args.max_new_tokens)
    reference = [single.generate_spec(ids, args.max_new_tokens, stop).tokens for ids in prompts]
    rows = []
    for rank in (int(r) for r in args.ranks.split(",")):
        engine = engine_for(target, drafter, [(None, ids) for ids in prompts], args.max_new_tokens,
                            EngineConfig(two_level="certified-head"))
        engine.certified_head = CertifiedHead(target, rank=rank)
        t0 = time.perf_counter()
        outputs = [engine.generate_spec(ids, args.max_new_tokens, stop).tokens for ids in prompts]
        different = sum(a != b for a, b in zip(outputs, reference))
        row = {"rank": rank, "prompts": len(prompts), **engine.certified_head.stats.summary(),
               "outputs_different": different, "wall_s": time.perf_counter() - t0}
        row.pop("per_step", None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if different:
            raise SystemExit(f"rank {rank}: {different} outputs differ from the single-level engine's")
    hidden = target.config.hidden_size
    print("\n| rank r (of H) | level-1 bytes / exact head | rows certified | steps without any exact head |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        share = (r["rank"] + 1) / hidden
        print(f"| {r['rank']} (of {hidden}) | {share:.3f} | {r['certified_rows']}/{r['rows']} ({100 * r['row_rate']:.1f}%) | "
              f"{r['steps_without_fallback']}/{r['steps']} ({100 * r['step_rate']:.1f}%) |")
    print(json.dumps({"device": args.device, "dtype": args.dtype, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
