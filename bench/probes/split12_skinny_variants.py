"""Variants of the split12 skinny GEMM (csrc/cuda/split12_skinny.cu: raw TMA ring, decoder warps,
decoded ring, the bf16 kernel's wgmmas) at M = 16 on the Qwen3-8B shapes, beside the shipped bf16
skinny GEMM and torch bf16, timed as bench/skinny_kernels.py times (one CUDA graph over weight
copies > 256 MB, replayed; PDL on). Each variant is the shipped source with its ring constants
replaced, compiled by nvcc into a shared library and first checked bit for bit against the
package's skinny_gemm on the unpacked weights (M = 16, 5, 1; escapes included). Needs the package
built with CUDA and nvcc. One-off experiment, not part of the package:

    python bench/probes/split12_skinny_variants.py NAME=RAW:DEC:DECODERS ... [--grids 132]

RAW / DEC = raw / decoded ring stages (32 KB / 40 KB each, at most 227 KB in all), DECODERS =
decoder threads (a multiple of 128, 8 or 16 rows per warp). --grids also times each variant on
those grid sizes (NAME@CTAS; the planner's grid is the bf16 kernel's, one CTA per row block where it
can: a decode-bound kernel may want every SM). Prints us per call per shape, then ratios to the
bf16 kernel.
"""
import argparse
import ctypes
import math
import pathlib
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from skinny_tma_variants import REPS, SHAPES, set_constant
from specpilot.bench.timing import time_graph
from specpilot.formats.split12 import ops as split12_ops

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPES = {**SHAPES, "lm_head": (151936, 4096)}
CHECK_SHAPES = ((1000, 72), (136, 4104), (6144, 4096), (300, 200))


def build(name: str, raw: int, dec: int, decoders: int, workdir: str):
    d = pathlib.Path(workdir) / name
    d.mkdir(parents=True, exist_ok=True)
    src = (ROOT / "csrc/cuda/split12_skinny.cu").read_text()
    for constant, value in (("kRawStages", raw), ("kDecStages", dec), ("kDecoders", decoders)):
        src = set_constant(src, constant, value)
    (d / "split12_skinny.cu").write_text(src)
    (d / "probe.cu").write_text((ROOT / "bench/probes/split12_skinny_variants.cu").read_text())
    cmd = ["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-shared", "-Xcompiler", "-fPIC",
           "-I", str(d), "-I", str(ROOT / "csrc/include"), "-I", str(ROOT / "csrc/cuda"), str(d / "probe.cu"),
           str(ROOT / "csrc/cuda/skinny_gemm.cu"),  # skinny_ctas (the grid planner)
           "-o", str(d / "probe.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"variant {name} does not compile:\n{done.stderr[-3000:]}")
    return ctypes.CDLL(str(d / "probe.so"))


def launcher(lib, planes, n: int, k: int, x, y, ctas: int = 0):
    """A launch of one variant on `ctas` CTAs (0: the planner's grid), with its own workspace."""
    ptrs = (ctypes.c_void_p * 6)(*[t.data_ptr() for t in planes])
    ops = torch.ops.specpilot
    partials = torch.empty(ops.skinny_partials_count(ctas or ops.skinny_plan_ctas(n, k), n), device=x.device)
    counters = torch.zeros(ops.skinny_counter_count(n), dtype=torch.int32, device=x.device)

    def call():
        err = lib.probe_gemm(ptrs, n, k, ctypes.c_void_p(x.data_ptr()), x.shape[0], ctypes.c_void_p(y.data_ptr()),
                             ctypes.c_void_p(partials.data_ptr()), ctypes.c_void_p(counters.data_ptr()), ctas, 1,
                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"launch failed: cudaError {err}")
    return call


def check_weights(n: int, k: int):
    """(generator, bf16 [n, k]) for a bit-equality check: seeded by the shape, ~1% of the weights
    1e-30 (outside split12's fast path: escapes)."""
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    w[torch.rand(n, k, generator=g, device="cuda") < 0.01] = 1e-30
    return g, w


def check(lib, n: int, k: int) -> bool:
    g, w = check_weights(n, k)
    planes = list(split12_ops.pack(w).planes().values())
    x16 = torch.randn(16, k, generator=g, device="cuda").to(torch.bfloat16)
    for m in (16, 5, 1):
        x = x16[:m].clone()
        y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launcher(lib, planes, n, k, x, y)()
        if not torch.equal(y, split12_ops.bf16_linear(x, w, kernel="skinny")):
            return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+", help="NAME=RAW:DEC:DECODERS")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--grids", default="", help="grid sizes timed besides the planner's, e.g. 132")
    args = p.parse_args()
    grids = [int(g) for g in args.grids.split(",") if g]
    specs = [(v.split("=")[0], *map(int, v.split("=")[1].split(":"))) for v in args.variants]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(8) as pool:
        libs = dict(zip((s[0] for s in specs), pool.map(lambda s: build(*s, workdir), specs)))
        bad = [name for name, lib in libs.items() if not all(check(lib, n, k) for n, k in CHECK_SHAPES)]
        print("bit-identical to skinny_gemm:", "all" if not bad else f"NOT {bad}", flush=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        rows = []
        for shape in args.shapes.split(","):
            n, k = SHAPES[shape]
            copies = max(1, math.ceil(256e6 / (2 * n * k)))
            ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
            packed = [list(split12_ops.pack(w).planes().values()) for w in ws]
            x = torch.randn(16, k, generator=g, device="cuda").to(torch.bfloat16)
            y = torch.empty(16, n, device="cuda", dtype=torch.bfloat16)
            t = {"torch": 1e6 * time_graph([lambda w=w: F.linear(x, w) for w in ws], REPS),
                 "bf16": 1e6 * time_graph([lambda w=w: split12_ops.bf16_linear(x, w, y, "skinny") for w in ws], REPS)}
            for name, lib in libs.items():
                for ctas in [0] + grids:
                    key = f"{name}@{ctas}" if ctas else name
                    t[key] = 1e6 * time_graph([launcher(lib, planes, n, k, x, y, ctas) for planes in packed], REPS)
            print(shape, " ".join(f"{key}={us:.1f}" for key, us in t.items()), flush=True)
            rows.append((shape, t))
            del ws, packed
            torch.cuda.empty_cache()
        for shape, t in rows:
            print(f"{shape} / bf16 skinny: " + " ".join(f"{key}={us / t['bf16']:.2f}" for key, us in t.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
