"""Batched attention over a paged KV pool on the GPU, one layer: the paged split-KV kernel vs the batched
engine's gather + SDPA (engine/batch/forward.py Layout.attend).
`python -m specpilot.bench.paged_attention_kernels --out paged_attn.jsonl [--requests 1,8,16,32]`

Per (shape, R requests, T rows each, context, page size 16): R requests with `context` keys each on
pages shuffled across a pool, their T causal rows ending at context - 1. Each implementation is
captured in one CUDA graph over enough pool copies to exceed L2 (as 36 layers of K/V do) and
replayed; us per call = replay time / calls. Correctness first: the kernel against the fp64 reference
(kernels/paged_attention.py, tolerance 2^-8 (|ref| + sum p|v|) as tests/test_paged_attention_gpu.py);
exit status 1 if any case fails. Prints a markdown table, writes every number to --out.
"""
import argparse
import math

import torch

from .jsonl import write_rows
from .timing import time_graph

REPS = 20
SHAPES = {"qwen3-8b": (32, 8, 128), "zoo": (8, 2, 64)}
PAGE_SIZE = 16
ROTATE_BYTES = 256e6                       # > 5x the H100's L2


def make_case(r, t, d, hq, hkv, context, copies, g):
    """Pools (copies of one layer's K and V), q [R, Hq, T, D], the shuffled page table, causal last."""
    pages_each = -(-context // PAGE_SIZE)
    pages = r * pages_each
    table = torch.randperm(pages, generator=g, device="cuda").view(r, pages_each).to(torch.int32)
    bf = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)
    ks = [bf(1, hkv, pages * PAGE_SIZE, d) for _ in range(copies)]
    vs = [bf(1, hkv, pages * PAGE_SIZE, d) for _ in range(copies)]
    last = torch.arange(context - t, context, device="cuda").repeat(r, 1)
    return bf(r, hq, t, d), ks, vs, table, last


def fp64_check(out, q, k, v, table, last, scale) -> dict:
    from specpilot.kernels import paged_attention as pa

    dbl = lambda x: x.double()
    ref = pa.reference(dbl(q), dbl(k), dbl(v), table, PAGE_SIZE, last, scale)
    mag = pa.reference(dbl(q), dbl(k), dbl(v).abs(), table, PAGE_SIZE, last, scale)
    err = (out.double() - ref).abs()
    tol = 2.0 ** -8 * (ref.abs() + mag) + 1e-6
    return {"max_err": float(err.max()), "ok": bool((err <= tol).all()) and not bool(torch.isnan(out).any())}


def bench_case(shape, r, t, context, g) -> dict:
    from specpilot.engine.batch.forward import Layout, Segment, Staging
    from specpilot.kernels import paged_attention as pa

    hq, hkv, d = SHAPES[shape]
    scale = d ** -0.5
    pool_bytes = 2 * hkv * r * -(-context // PAGE_SIZE) * PAGE_SIZE * d * 2
    copies = max(2, min(256, math.ceil(ROTATE_BYTES / pool_bytes)))
    q, ks, vs, table, last = make_case(r, t, d, hq, hkv, context, copies, g)
    splits = pa.default_splits(q.shape, hkv, table.shape[1] * PAGE_SIZE, q.device)
    out = torch.empty(r, t, hq * d, dtype=torch.bfloat16, device="cuda")
    ws = pa.new_workspace(splits, q.shape, "cuda")
    row = {"shape": shape, "R": r, "T": t, "context": context, "page_size": PAGE_SIZE, "splits": splits,
           "copies": copies, "kv_bytes_visible": pool_bytes, "us": {}}
    pa.paged_decode_attention(q, ks[0], vs[0], table, PAGE_SIZE, last, scale, out, ws)
    row["check"] = fp64_check(out, q, ks[0], vs[0], table, last, scale)
    calls = [lambda k=k, v=v: pa.paged_decode_attention(q, k, v, table, PAGE_SIZE, last, scale, out, ws)
             for k, v in zip(ks, vs)]
    row["us"]["paged_kernel"] = 1e6 * time_graph(calls, REPS)

    # Today's batched path: the rows varlen [1, Hq, R*T, D], K/V gathered per request, one SDPA.
    pages = table.tolist()
    layout = Layout([Segment(pages[i], context - t, t) for i in range(r)], PAGE_SIZE, Staging(q.device))
    qv = q.transpose(0, 1).reshape(1, hq, r * t, d)
    mask = layout.mask(hq // hkv, torch.bfloat16)
    calls = [lambda k=k, v=v: layout.attend(qv, k, v, mask, scale) for k, v in zip(ks, vs)]
    row["us"]["gather_sdpa"] = 1e6 * time_graph(calls, REPS)
    us = row["us"]
    row["gbps_kernel"] = pool_bytes / (us["paged_kernel"] * 1e-6) / 1e9
    print(f"# {shape} R={r} T={t} ctx={context}: " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items())
          + f", check {row['check']}", flush=True)
    del ks, vs
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSONL file, one row per case")
    parser.add_argument("--shapes", default="qwen3-8b", help=f"subset of {','.join(SHAPES)}")
    parser.add_argument("--requests", default="1,8,16,32")
    parser.add_argument("--tokens", default="1,16", help="rows per request (T)")
    parser.add_argument("--contexts", default="512,2000")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from specpilot.kernels import paged_attention as pa

    if not torch.cuda.is_available() or not pa.available():
        print("needs a CUDA GPU and specpilot._C built with CUDA kernels")
        return 2
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = [bench_case(shape, r, t, ctx, g) for shape in args.shapes.split(",") for ctx in ints(args.contexts)
            for t in ints(args.tokens) for r in ints(args.requests)]
    print("\nus per call (one layer), CUDA graph over pool copies > L2; paged_kernel = "
          "specpilot::paged_decode_attention; gather_sdpa = engine/batch/forward.py Layout.attend; "
          "GB/s = visible K/V bytes / kernel time; ok = fp64 check passed")
    print("| shape | R | T | ctx | splits | ok | paged kernel | gather+SDPA | speedup | GB/s |")
    print("|" + "---|" * 10)
    for x in rows:
        us = x["us"]
        print(f"| {x['shape']} | {x['R']} | {x['T']} | {x['context']} | {x['splits']} "
              f"| {'yes' if x['check']['ok'] else 'NO'} | {us['paged_kernel']:.1f} | {us['gather_sdpa']:.1f} "
              f"| {us['gather_sdpa'] / us['paged_kernel']:.1f}x | {x['gbps_kernel']:.0f} |")
    write_rows(args.out, "paged_attention_kernels", rows, gpu=torch.cuda.get_device_name(0))
    return 0 if all(x["check"]["ok"] for x in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
