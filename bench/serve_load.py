"""Throughput through HTTP vs in process, in one call: the batched engine under C closed-loop clients,
first in process (bench --concurrency's closed_loop), then behind `specpilot serve` with C `openai`
clients in a separate process (so the clients do not share the server's interpreter), on the same
models, prompts and step-cost table.

    python -m specpilot.bench.serve_load --target random:qwen3-8b --concurrency 32 --limit 8 \
        --max-new-tokens 256 --out serve_load_out

Prompts: the first turns of the benchmarks (--benchmarks, --limit each), dealt round robin, sent as
token ids so both paths see the same prompt. Greedy; a random target has no stop token (every request
runs to --max-new-tokens) and accepts ~no drafts on both paths (no replay over HTTP). Prints and writes
serve_load.json: tokens/s of each path, their ratio, HTTP latency p50 / p99, and how many answers are
identical (in bf16 on a GPU the batch composition may move an argmax; in fp32 on the CPU all must be).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _args(argv):
    from specpilot import settings

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.serve_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="checkpoint folder or random:<preset> (e.g. random:qwen3-8b)")
    p.add_argument("--drafter", default=None, help="drafter folder (not with random:)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--datasets", default=str(settings.get().datasets))
    p.add_argument("--benchmarks", default="gsm8k,humaneval,mtbench,math500")
    p.add_argument("--limit", type=int, default=8, help="prompts per benchmark")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--out", default="serve_load_out")
    args = p.parse_args(argv)
    for name in ("concurrency", "limit", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def _prompts(args, tokenizer) -> list:
    from specpilot.bench import datasets

    names = [datasets.canonical_name(n) for n in args.benchmarks.split(",") if n.strip()]
    per_bench = [[datasets.encode(tokenizer, [{"role": "user", "content": s.turns[0]}])
                  for s in datasets.load_benchmark(Path(args.datasets), n, args.limit)] for n in names]
    return [p for group in zip(*per_bench) for p in group]


def _tokenizer(target: str):
    from specpilot.bench import random_pair
    from specpilot.models.loading import load_tokenizer

    return random_pair.ByteTokenizer() if random_pair.is_random(target) else load_tokenizer(target)


def run(argv=None) -> dict:
    from specpilot.bench.concurrency import closed_loop, load_models
    from specpilot.bench.report import device_name
    from specpilot.engine.batch import BatchConfig
    from specpilot.engine.batch.run import pool_pages
    from specpilot.serve import BackgroundServer, make_served

    args = _args(argv)
    tokenizer = _tokenizer(args.target)
    prompts = _prompts(args, tokenizer)
    target, drafter, stop_ids = load_models(args, tokenizer)
    c, new = args.concurrency, args.max_new_tokens
    closed_loop(target, drafter, BatchConfig(), 1, prompts[:1], min(8, new), stop_ids)   # warm-up
    inproc, results = closed_loop(target, drafter, BatchConfig(), c, prompts, new, stop_ids)
    print(f"in process: {inproc['tokens_per_s']:.1f} tokens/s, tau {inproc['tau']}", file=sys.stderr, flush=True)

    longest = max(len(p) for p in prompts) + new
    served = make_served(target, drafter, tokenizer, "bench", stop_ids, max_batch=c, max_model_len=longest,
                         kv_pages=pool_pages(prompts, new, c, BatchConfig().page_size),
                         block_size=args.block_size)
    with BackgroundServer(served, log_level="warning") as server, tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "load.json"
        spec.write_text(json.dumps({"url": server.url, "concurrency": c, "max_tokens": new, "prompts": prompts}))
        _client_process(spec, warm=True)
        http = _client_process(spec, warm=False)
    identical = sum(text == tokenizer.decode(r.tokens, skip_special_tokens=True)
                    for text, r in zip(http.pop("texts"), results))
    out = {"target": args.target, "device": device_name(target.device), "dtype": args.dtype, "concurrency": c,
           "prompts": len(prompts), "max_new_tokens": new,
           "in_process": inproc, "http": http, "http_over_in_process": http["tokens_per_s"] / inproc["tokens_per_s"],
           "identical_answers": identical}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "serve_load.json").write_text(json.dumps(out, indent=2))
    print(f"C={c}: in process {inproc['tokens_per_s']:.1f} tokens/s, HTTP {http['tokens_per_s']:.1f} tokens/s "
          f"({out['http_over_in_process']:.3f}x); HTTP latency p50 {http['latency_p50_ms']:.0f} ms, "
          f"p99 {http['latency_p99_ms']:.0f} ms; identical answers {identical}/{len(prompts)}")
    print(json.dumps({k: v for k, v in out.items() if k not in ("in_process", "http")}))
    return out


def _client_process(spec: Path, warm: bool) -> dict:
    cmd = [sys.executable, "-m", "specpilot.bench.serve_load", "--clients", str(spec)] + (["--warm"] if warm else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the load clients failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def _clients(spec: dict, warm: bool) -> dict:
    """C closed-loop `openai` clients, each with its own stream of prompts (as closed_loop deals them)."""
    import openai

    prompts, c = spec["prompts"], spec["concurrency"]
    if warm:
        prompts = prompts[:1]
    api = openai.AsyncOpenAI(base_url=spec["url"], api_key="unused", max_retries=0, timeout=3600)
    texts, latencies, tokens = [None] * len(prompts), [], []

    async def client(stream: list):
        for i in stream:
            t0 = time.perf_counter()
            r = await api.completions.create(model="bench", prompt=prompts[i], max_tokens=spec["max_tokens"],
                                             temperature=0)
            latencies.append(time.perf_counter() - t0)
            texts[i] = r.choices[0].text
            tokens.append(r.usage.completion_tokens)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(list(range(k, len(prompts), c))) for k in range(min(c, len(prompts)))))
    wall = time.perf_counter() - t0
    await api.close()
    return {"tokens": sum(tokens), "seconds": wall, "tokens_per_s": sum(tokens) / wall,
            "latency_p50_ms": float(np.percentile(latencies, 50) * 1e3),
            "latency_p99_ms": float(np.percentile(latencies, 99) * 1e3), "texts": texts}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--clients":
        print(json.dumps(asyncio.run(_clients(json.loads(Path(argv[1]).read_text()), "--warm" in argv))))
        return 0
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
