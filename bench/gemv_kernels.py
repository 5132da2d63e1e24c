"""One-token GEMV on the H200: gemv_m1 (csrc/cuda/gemv_m1.cu) vs torch bf16 `F.linear` (cuBLAS),
Qwen3-8B shapes, inside one CUDA graph over weight copies totalling > 256 MB (so weights come from
HBM, as in a decode step), replayed; us per call = replay time / calls.

    python -m specpilot.bench.gemv_kernels [--out FILE.jsonl]

Columns: torch, gemv_m1 launched plainly, and with PDL (each launch may start its weight loads while
the previous one finishes, as in the engine's chain of GEMVs); GB/s counts weight bytes only.
Correctness first: each gemv_m1 output against torch's within bf16 output rounding (exit 1 if not).
"""
import argparse
import math

import torch
import torch.nn.functional as F

from .jsonl import write_rows
from .timing import time_graph

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
ROTATE_BYTES = 256e6
REPS = 20


def main(argv=None) -> int:
    from specpilot import config
    from specpilot.config import EngineConfig
    from specpilot.ops import linear as ops_linear

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.gemv_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and ops_linear.gemv_available()):
        print("needs a CUDA GPU and specpilot._C built with CUDA kernels")
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, ok = [], True
    for name, (n, k) in SHAPES.items():
        copies = max(1, math.ceil(ROTATE_BYTES / (2 * n * k)))
        ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, generator=g, device="cuda").to(torch.bfloat16)
        want = F.linear(x, ws[0]).float()
        got = ops_linear.gemv(x, ws[0]).float()
        close = bool(((got - want).abs() <= 2 ** -7 * want.abs() + 1e-2 * want.abs().max()).all())
        ok &= close
        us = {"torch": 1e6 * time_graph([lambda w=w: F.linear(x, w) for w in ws], REPS)}
        for pdl in (False, True):
            with config.use(EngineConfig(gemv_pdl=pdl)):          # read at capture
                calls = [lambda w=w: ops_linear.gemv(x, w) for w in ws]
                us["gemv+pdl" if pdl else "gemv"] = 1e6 * time_graph(calls, REPS)
        row = {"shape": name, "n": n, "k": k, "copies": copies, "close_to_torch": close, "us": us,
               "gbps": {key: 2 * n * k / (t * 1e-6) / 1e9 for key, t in us.items()}}
        rows.append(row)
        print(f"# {name}: " + ", ".join(f"{key} {t:.1f} us" for key, t in us.items()) + f", close {close}", flush=True)
        del ws
        torch.cuda.empty_cache()
    print("\n| shape | torch us | gemv us | gemv+pdl us | best / torch | torch GB/s | best GB/s | close |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        us, best = r["us"], min(r["us"]["gemv"], r["us"]["gemv+pdl"])
        print(f"| {r['shape']} {r['n']}x{r['k']} | {us['torch']:.1f} | {us['gemv']:.1f} | {us['gemv+pdl']:.1f} | "
              f"{best / us['torch']:.2f} | {r['gbps']['torch']:.0f} | {2 * r['n'] * r['k'] / best / 1e3:.0f} | "
              f"{'yes' if r['close_to_torch'] else 'NO'} |")
    if args.out:
        write_rows(args.out, "gemv_kernels", rows, gpu=torch.cuda.get_device_name(0))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
