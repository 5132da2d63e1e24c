"""Skinny GEMM on the H200: skinny_gemm (csrc/cuda/skinny_gemm.cu) vs torch bf16 `F.linear` (cuBLAS)
at a few token rows, Qwen3-8B shapes, inside one CUDA graph over weight copies totalling > 256 MB (so
weights come from HBM, as in a verify step), replayed; us per call = replay time / calls.

    python -m specpilot.bench.skinny_kernels [--rows 16,8,2] [--sweep] [--split12] [--out FILE.jsonl]

GB/s counts bf16 weight bytes only. --sweep also times several grid sizes (persistent CTAs) at the
first row count. --split12 also times split12_skinny_gemm (csrc/cuda/split12_skinny.cu) on the same
weights packed to split12, and checks that its output equals the bf16 kernel's bit for bit; beside
it the older split12 tensor-core kernel (split12_linear_tc, mma.sync).
Correctness first: each output against torch's within bf16 output rounding plus fp32 summation
(exit 1 if not, or if a split12 output differs).
"""
import argparse
import math

import torch
import torch.nn.functional as F

from specpilot.kernels.variants.split12_args import contract_args, pack

from .gemv_kernels import REPS, ROTATE_BYTES, SHAPES  # the same shapes, measured the same way
from .jsonl import write_rows
from .timing import time_graph

SWEEP = (32, 64, 96, 128, 132)


def skinny_workspace(ops, n, k, ctas=0):
    """(partials, zeroed counters) for launches over an N x K weight on `ctas` CTAs (0: planned)."""
    partials = torch.empty(ops.skinny_partials_count(ctas or ops.skinny_plan_ctas(n, k), n), device="cuda")
    return partials, torch.zeros(ops.skinny_counter_count(n), dtype=torch.int32, device="cuda")


def skinny_calls(ops, ws, x, ctas):
    """Launches of skinny_gemm (with PDL, as the engine does) over the weight copies, and their y."""
    m, n, k = x.shape[0], ws[0].shape[0], ws[0].shape[1]
    partials, counters = skinny_workspace(ops, n, k, ctas)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return [lambda w=w: ops.skinny_gemm(w, x, ctas, True, y, partials, counters) for w in ws], y


def main(argv=None) -> int:
    from specpilot.ops import linear as ops_linear

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.skinny_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="16,8,2", help="token rows M, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sweep", action="store_true", help="also time several grid sizes at the first M")
    p.add_argument("--split12", action="store_true", help="also the split12 kernel on the packed weights")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and ops_linear.skinny_available()):
        print("needs a CUDA GPU and specpilot._C built with CUDA kernels")
        return 2
    ops = torch.ops.specpilot
    ms = [int(v) for v in args.rows.split(",")]
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, ok = [], True
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = max(1, math.ceil(ROTATE_BYTES / (2 * n * k)))
        ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        planned = ops.skinny_plan_ctas(n, k)
        packed = [contract_args(pack(w)) for w in ws] if args.split12 else []
        for i, m in enumerate(ms):
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            want = F.linear(x, ws[0]).float()
            calls, y = skinny_calls(ops, ws, x, 0)
            calls[0]()
            got = y.float()
            close = bool(((got - want).abs() <= 2 ** -7 * want.abs() + 1e-2 * want.abs().max()).all())
            ok &= close
            us = {"torch": 1e6 * time_graph([lambda w=w: F.linear(x, w) for w in ws], REPS),
                  "skinny": 1e6 * time_graph(calls, REPS)}
            identical = None
            if packed:
                y12 = torch.empty_like(y)
                partials, counters = skinny_workspace(ops, n, k)
                calls12 = [lambda planes=planes: ops.split12_skinny_gemm(x, *planes, k, 0, True, y12, partials,
                                                                         counters) for planes in packed]
                calls12[0]()
                identical = torch.equal(y12.float(), got)  # y now holds the last weight copy's output
                ok &= identical
                us["split12"] = 1e6 * time_graph(calls12, REPS)
                ytc = torch.empty_like(y)  # the split12 tensor-core kernel the engine used before (mma.sync)
                us["split12_tc"] = 1e6 * time_graph(
                    [lambda planes=planes: ops.split12_linear_tc(x, *planes, k, ytc) for planes in packed], REPS)
            sweep = {}
            if args.sweep and i == 0:
                for ctas in SWEEP:
                    sweep[ctas] = 1e6 * time_graph(skinny_calls(ops, ws, x, ctas)[0], REPS)
            row = {"shape": name, "n": n, "k": k, "m": m, "copies": copies, "ctas": planned, "close": close,
                   "split12_identical": identical,
                   "us": us, "sweep_us": sweep, "gbps": {key: 2 * n * k / (t * 1e-6) / 1e9 for key, t in us.items()}}
            rows.append(row)
            print(f"# {name} M={m}: torch {us['torch']:.1f} us, skinny {us['skinny']:.1f} us (ctas {planned})"
                  + (", sweep " + ", ".join(f"{s}:{t:.1f}" for s, t in sweep.items()) if sweep else "")
                  + (f", split12 {us['split12']:.1f} us, identical {identical}" if packed else "")
                  + f", close {close}", flush=True)
        del ws
        torch.cuda.empty_cache()
    extra = " split12 us | split12 / torch | split12 == skinny | split12_tc us |" if args.split12 else ""
    print("\n| shape | M | torch us | skinny us | skinny / torch | torch GB/s | skinny GB/s | ctas | close |" + extra)
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * (4 if args.split12 else 0))
    for r in rows:
        us, gb = r["us"], r["gbps"]
        s12 = (f" {us['split12']:.1f} | {us['split12'] / us['torch']:.2f} | "
               f"{'yes' if r['split12_identical'] else 'NO'} | {us['split12_tc']:.1f} |") if args.split12 else ""
        print(f"| {r['shape']} {r['n']}x{r['k']} | {r['m']} | {us['torch']:.1f} | {us['skinny']:.1f} | "
              f"{us['skinny'] / us['torch']:.2f} | {gb['torch']:.0f} | {gb['skinny']:.0f} | {r['ctas']} | "
              f"{'yes' if r['close'] else 'NO'} |" + s12)
    if args.out:
        write_rows(args.out, "skinny_kernels", rows, gpu=torch.cuda.get_device_name(0))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
