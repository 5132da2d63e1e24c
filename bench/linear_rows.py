"""The target's linears by total token rows against their roofline: cuBLAS bf16 `F.linear` (what a
batched verify of R requests x T rows runs past 16 rows) at the Qwen3-8B shapes, inside one CUDA graph
over weight copies totalling > 256 MB (weights from HBM, as in a step), replayed.

    python -m specpilot.bench.linear_rows [--rows 16,64,128,192,256,384,512] [--blas cublas,cublaslt]
        [--out FILE.jsonl]

The roofline of a call is max(weight + activation bytes / copy bandwidth, 2 M N K / matmul rate), both
rates measured on this card (bench/device_rates.py); `over` = time / roofline. A row count whose `over`
jumps above its neighbours' is a tile-shape cliff of the library's kernel choice, which a batched
engine can avoid by padding or splitting its rows.

--blas names the libraries measured (torch.backends.cuda.preferred_blas_library), each over every
shape and row count: `cublas` (torch's default) and `cublaslt`. PyTorch's TunableOp lost to both
(docs/measured/h100_session36/) and was dropped.
"""
import argparse
import contextlib
import math

import torch
import torch.nn.functional as F

from .device_rates import copy_bandwidth, matmul_rate
from .gemv_kernels import REPS, ROTATE_BYTES, SHAPES
from .jsonl import write_rows
from .timing import time_graph

ROWS = "16,64,128,192,256,320,384,512"
BLAS = ("cublas", "cublaslt")


@contextlib.contextmanager
def blas_choice(name: str):
    """torch's GEMM library as --blas names it, restored after."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.linear_rows", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=ROWS, help="token rows M, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--blas", default="cublas", help=f"GEMM choices, comma-separated, of {','.join(BLAS)}")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    ms = [int(v) for v in args.rows.split(",")]
    blas = args.blas.split(",")
    if any(b not in BLAS for b in blas):
        raise SystemExit(f"--blas {args.blas}: each must be one of {', '.join(BLAS)}")
    bandwidth, rate = copy_bandwidth("cuda"), matmul_rate("cuda", torch.bfloat16)
    print(f"# measured: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = max(1, math.ceil(ROTATE_BYTES / (2 * n * k)))
        ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        for choice, m in ((b, m) for b in blas for m in ms):
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            with blas_choice(choice):
                us = 1e6 * time_graph([lambda w=w: F.linear(x, w) for w in ws], REPS)
            floor_us = 1e6 * max(2 * (n * k + m * k + m * n) / bandwidth, 2 * m * n * k / rate)
            rows.append({"shape": name, "blas": choice, "n": n, "k": k, "m": m, "us": us, "floor_us": floor_us,
                         "over": us / floor_us, "tbps": 2 * n * k / (us * 1e-6) / 1e12,
                         "tflops": 2 * m * n * k / (us * 1e-6) / 1e12})
        del ws
        torch.cuda.empty_cache()
    print("\n| shape | " + " | ".join(f"M={m}" for m in ms) + " |")
    print("|---|" + "---|" * len(ms))
    for name, choice in ((name, b) for name in args.shapes.split(",") for b in blas):
        cells = [r for r in rows if r["shape"] == name and r["blas"] == choice]
        print(f"| {name} {cells[0]['n']}x{cells[0]['k']} {choice} | "
              + " | ".join(f"{r['us']:.0f} us ({r['over']:.2f}x)" for r in cells) + " |")
    if args.out:
        write_rows(args.out, "linear_rows", rows, gpu=torch.cuda.get_device_name(0),
                   copy_bandwidth=bandwidth, matmul_rate=rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
