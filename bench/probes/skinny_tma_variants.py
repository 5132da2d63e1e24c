"""Variants of the skinny GEMM (csrc/cuda/skinny_gemm.cu: TMA ring + wgmma) against torch bf16
(cuBLAS) at M = 16 on the Qwen3-8B layer shapes, timed as bench/skinny_kernels.py times (one CUDA
graph over weight copies > 256 MB, replayed; PDL on). Each variant is the shipped source with its
ring constants replaced, compiled by nvcc into a shared library (no torch build needed) and checked
against fp64 on odd shapes at M = 16, 5, 2, 1 (the same rows bit-equal across M, two runs equal,
counters left zero) before it is timed. Needs the package installed (its graph timer) and nvcc.
One-off experiment, not part of the package:

    python bench/probes/skinny_tma_variants.py NAME=STAGES:ROWS:BOXES ... [--grids 64,96,128,132]

ROWS = weight rows per CTA tile (64 or 128), BOXES = 64-column TMA boxes per stage. Prints one line
per shape: us per call for torch, each variant at the planner's grid [in brackets] and at every
--grids size (@N); then the same as ratios to torch.
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

from specpilot.bench.timing import time_graph  # the package's graph timer: s per call

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
REPS = 20
CHECK_SHAPES = ((1000, 72), (136, 4104), (6144, 4096), (4096, 12288), (300, 200))


def set_constant(text: str, name: str, value: int) -> str:
    """`name = <old>;` -> `name = value;` (ValueError if the source no longer has it)."""
    start = text.index(f"{name} = ") + len(name) + 3
    return text[:start] + str(value) + text[text.index(";", start):]


def build(name: str, stages: int, rows: int, boxes: int, workdir: str):
    """The probe library of one variant: the kernel's source with its constants replaced."""
    d = pathlib.Path(workdir) / name
    (d / "specpilot").mkdir(parents=True, exist_ok=True)
    src = (ROOT / "csrc/cuda/skinny_gemm.cu").read_text()
    (d / "skinny_gemm.cu").write_text(set_constant(set_constant(src, "kStages", stages), "kBoxes", boxes))
    hdr = (ROOT / "csrc/include/specpilot/skinny_gemm.h").read_text()
    (d / "specpilot/skinny_gemm.h").write_text(set_constant(hdr, "kRowsPerCta", rows))
    (d / "probe.cu").write_text((ROOT / "bench/probes/skinny_tma_variants.cu").read_text())
    cmd = ["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-shared", "-Xcompiler", "-fPIC",
           "-I", str(d), "-I", str(ROOT / "csrc/include"), "-I", str(ROOT / "csrc/cuda"), str(d / "probe.cu"),
           "-o", str(d / "probe.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"variant {name} does not compile:\n{done.stderr[-3000:]}")
    lib = ctypes.CDLL(str(d / "probe.so"))
    lib.probe_partials.restype = ctypes.c_longlong
    return lib


class Gemm:
    """One variant's launch for an N x K weight at a given grid (0: the planner's), with its workspace."""

    def __init__(self, lib, n: int, k: int, ctas: int = 0):
        self.lib, self.n, self.k = lib, n, k
        self.ctas = ctas or lib.probe_ctas(n, k)
        self.partials = torch.full((lib.probe_partials(self.ctas, n),), float("nan"), device="cuda")
        self.counters = torch.zeros(lib.probe_counters(n), dtype=torch.int32, device="cuda")

    def __call__(self, w, x, y, pdl=True):
        err = self.lib.probe_gemm(
            ctypes.c_void_p(w.data_ptr()), self.n, self.k, ctypes.c_void_p(x.data_ptr()), x.shape[0],
            ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(self.partials.data_ptr()),
            ctypes.c_void_p(self.counters.data_ptr()), self.ctas, int(pdl),
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"launch failed: cudaError {err}")


def check(lib, n: int, k: int) -> bool:
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    x16 = torch.randn(16, k, generator=g, device="cuda").to(torch.bfloat16)
    gemm, outs, ok = Gemm(lib, n, k), {}, True
    for m in (16, 5, 2, 1):
        x = x16[:m].clone()
        runs = []
        for _ in range(2):
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm(w, x, y)
            runs.append(y)
        want = x.double() @ w.double().T
        err = (runs[0].double() - want).abs()
        ok &= bool((err <= 2 ** -7 * want.abs() + 1e-2 * want.abs().max()).all()) and torch.equal(*runs)
        outs[m] = runs[0]
    return ok and all(torch.equal(outs[m], outs[16][:m]) for m in outs) and int(gemm.counters.abs().sum()) == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+", help="NAME=STAGES:ROWS:BOXES")
    p.add_argument("--grids", default="64,96,128,132", help="grid sizes timed besides the planner's")
    args = p.parse_args()
    specs = [(v.split("=")[0], *map(int, v.split("=")[1].split(":"))) for v in args.variants]
    grids = [int(g) for g in args.grids.split(",") if g]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(8) as pool:
        libs = dict(zip((s[0] for s in specs), pool.map(lambda s: build(*s, workdir), specs)))
        bad = [name for name, lib in libs.items() if not all(check(lib, n, k) for n, k in CHECK_SHAPES)]
        print("checks:", "all pass" if not bad else f"FAIL {bad}", flush=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        rows = []
        for shape, (n, k) in SHAPES.items():
            copies = max(1, math.ceil(256e6 / (2 * n * k)))
            ws = [(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
            x = torch.randn(16, k, generator=g, device="cuda").to(torch.bfloat16)
            y = torch.empty(16, n, device="cuda", dtype=torch.bfloat16)
            t = {"torch": 1e6 * time_graph([lambda w=w: F.linear(x, w) for w in ws], REPS)}
            for name, lib in libs.items():
                for ctas in [0] + grids:
                    gemm = Gemm(lib, n, k, ctas)
                    key = f"{name}@{ctas}" if ctas else f"{name}[{gemm.ctas}]"
                    t[key] = 1e6 * time_graph([lambda w=w: gemm(w, x, y) for w in ws], REPS)
            print(shape, " ".join(f"{key}={us:.1f}" for key, us in t.items()), flush=True)
            rows.append((shape, t))
            del ws
            torch.cuda.empty_cache()
        for shape, t in rows:
            print(f"{shape} / torch: " + " ".join(f"{key}={us / t['torch']:.2f}" for key, us in t.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
