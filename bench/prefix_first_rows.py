"""Verified rows of prefix-first verification (BatchConfig.verify_prefix) on a real pair, from the
batched engine's own counters, with every run's outputs checked against one-pass verification:

    python -m specpilot.bench.prefix_first_rows --target shared/zoo/code-tiny \\
        --drafter shared/zoo/code-tiny-dflash-b16 --prompts-dir shared/zoo/prompts \\
        --benchmarks humaneval,pystdlib --limit 20 --prefixes 1,2,3,4,6,8 --concurrency 8

Prints one JSON line per prefix (off first): verified / drafted rows, request steps and batch steps
that ran pass 2, tau. Exits 1 if any output or acceptance length differs from one-pass verification."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def run(target, drafter, prompts, max_new_tokens: int, concurrency: int, stop_ids, prefix: int):
    from specpilot.engine.batch import BatchConfig, BatchEngine, Request
    from specpilot.engine.batch.run import pool_pages

    engine = BatchEngine(target, drafter, BatchConfig(verify_prefix=prefix), max_batch=concurrency,
                         kv_pages=pool_pages(prompts, max_new_tokens, concurrency, 16))
    ids = [engine.submit(Request(tuple(p), max_new_tokens, stop_ids=tuple(stop_ids))) for p in prompts]
    results = {r.request_id: r for r in engine.run_until_done()}
    return [results[i] for i in ids], engine


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    from specpilot.bench import datasets, e2e
    from specpilot.models import load_drafter, load_target

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts-dir", required=True, help="a folder of <benchmark>.jsonl")
    p.add_argument("--benchmarks", default="humaneval,pystdlib")
    p.add_argument("--limit", type=int, default=20, help="prompts per benchmark (bench's selection)")
    p.add_argument("--prefixes", default="1,2,3,4,6,8")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.target)
    prompts = [datasets.encode(tok, [{"role": "user", "content": s.turns[0]}])
               for n in args.benchmarks.split(",") for s in datasets.load_benchmark(Path(args.prompts_dir), n, args.limit)]
    target = load_target(args.target, device=args.device, dtype=torch.float32 if args.dtype == "fp32" else torch.bfloat16)
    drafter = load_drafter(args.drafter, target)
    stop = e2e.stop_ids_for(args.target, tok)
    reference, same_everywhere = None, True
    for prefix in [0] + [int(x) for x in args.prefixes.split(",")]:
        results, engine = run(target, drafter, prompts, args.max_new_tokens, args.concurrency, stop, prefix)
        reference = reference or results
        same = sum(a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths
                   for a, b in zip(results, reference))
        same_everywhere &= same == len(results)
        steps = sum(len(r.acceptance_lengths) for r in results)
        print(json.dumps({"prefix": prefix, "concurrency": args.concurrency, "prompts": len(prompts),
                          "verified_over_drafted_rows": round(engine.verify_rows / engine.block_rows, 3),
                          "request_steps": steps, "pass2_request_steps": engine.second_pass_requests,
                          "batch_steps": engine.steps, "pass2_batch_steps": engine.second_passes,
                          "tau": round(sum(sum(r.acceptance_lengths) for r in results) / steps, 3),
                          "identical_to_one_pass": f"{same}/{len(results)}"}), flush=True)
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
