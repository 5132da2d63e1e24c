"""tau and draft-step time against the draft vocabulary size N (EngineConfig.draft_vocab) on one pair.

  python -m specpilot.bench.draft_vocab_tau --target T --drafter D --ranking R.json \\
      --prompts A.jsonl --prompts B.jsonl --limit 20 --sizes 0,256,512,1024,2048,4096 --device cpu --dtype fp32

For every N (0: the full head) each prompt is decoded greedily by our engine; the outputs must be
token for token the full head's (the run exits 1 otherwise, after every size: a reduced head may only
move tau). tau = mean over prompts of the mean acceptance length (bonus included; shared/zoo/README.md's
definition).
Draft step: the median of `--reps` draft steps at a fixed position (graphed on CUDA), every size timed
round-robin after the decoding (the device's own timing: CPU numbers are CPU numbers). Prints a markdown table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def draft_step_seconds(engines, block: int, reps: int) -> list:
    """Median seconds of one full-block draft step (context of `block` rows at a mid position) per
    engine, timed round-robin so that a busy host's noise falls on every size alike."""
    calls = []
    for engine in engines:
        runner, device = engine.runner, engine.device
        width = len(runner.feature_layers) * engine.target.config.hidden_size
        ctx = torch.zeros(1, block, width, device=device, dtype=engine.target.dtype)
        ids = torch.full((1, block), engine.drafter.mask_token_id, dtype=torch.long, device=device)
        calls.append(lambda r=runner, c=ctx, i=ids: r.draft_step(c, block, i, 2 * block, block))
    times = [[] for _ in engines]
    with torch.inference_mode():
        for rep in range(reps + 2):
            for engine, call, out in zip(engines, calls, times):
                t0 = engine.clock()
                call()
                out.append(engine.clock() - t0)
    return [statistics.median(t[2:]) for t in times]


def main(argv=None) -> int:
    from specpilot.config import EngineConfig
    from specpilot.engine.cli_support import engine_for
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import load_pair
    from specpilot.models.prompts import encode_prompt, read_prompts

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--ranking", required=True, help="token ranking JSON (specpilot draft-vocab)")
    p.add_argument("--prompts", required=True, action="append")
    p.add_argument("--limit", type=int, default=20, help="first N prompts of each file")
    p.add_argument("--sizes", default="0,256,512,1024,2048,4096")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes[0] != 0:
        raise SystemExit("--sizes must start with 0 (the full head: the reference every size is held to)")
    torch.set_num_threads(1) if args.device == "cpu" else None
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, dtype)
    prompts = [encode_prompt(tok, r) for path in args.prompts for r in read_prompts(path, args.limit)]
    stop = stop_ids_for(target, tok)
    block = drafter.block_size
    rows, reference, engines = [], None, []
    for n in sizes:
        config = EngineConfig(draft_vocab=n, draft_vocab_ranking=args.ranking)
        engine = engine_for(target, drafter, [(None, ids) for ids in prompts], args.max_new_tokens, config)
        engine.warmup(block)
        t0 = time.perf_counter()
        results = [engine.generate_spec(ids, args.max_new_tokens, stop) for ids in prompts]
        wall = time.perf_counter() - t0
        outputs = [r.tokens for r in results]
        if reference is None:
            reference = outputs
        identical = sum(a == b for a, b in zip(outputs, reference))
        taus = [r.tau for r in results if r.acceptance_lengths]
        row = {"draft_vocab": n, "prompts": len(prompts), "identical_to_full": identical,
               "tau": sum(taus) / len(taus),
               "decode_tokens_per_s": sum(len(o) for o in outputs) / sum(r.decode_s for r in results),
               "wall_s": wall}
        rows.append(row)
        engines.append(engine)
        print(json.dumps(row), flush=True)
    for row, seconds in zip(rows, draft_step_seconds(engines, block, args.reps)):
        row["draft_step_s"] = seconds
    full = rows[0]
    print("\n| N | tau | tau / full | draft step (ms) | draft / full | decode tok/s | identical |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['draft_vocab'] or 'full'} | {r['tau']:.3f} | {r['tau'] / full['tau']:.3f} | "
              f"{r['draft_step_s'] * 1e3:.3f} | {r['draft_step_s'] / full['draft_step_s']:.2f} | "
              f"{r['decode_tokens_per_s']:.1f} | {r['identical_to_full']}/{r['prompts']} |")
    print(json.dumps({"device": args.device, "dtype": args.dtype, "rows": rows}))
    differ = [r for r in rows if r["identical_to_full"] != r["prompts"]]
    for r in differ:
        print(f"draft_vocab={r['draft_vocab']}: {r['prompts'] - r['identical_to_full']} outputs differ from the full "
              f"head's" + (" (bf16: a near-tie decided at another row of a verify block can flip; judge it with "
                           "specpilot verify --draft-vocab N, which forces against the target's own greedy output "
                           "under the referee)" if args.dtype == "bf16" else ""), file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
