"""Variants of the skinny GEMM's kernel (bench/probes/skinny_variants.cu) against cuBLAS on the
Qwen3-8B layer shapes, timed the same way (CUDA events over 40 launches, weights rotated past L2,
no graph). Needs CuPy (NVRTC). One-off experiment, not part of the package:

    python bench/probes/skinny_variants.py [M]

Prints one line per shape: us per call for cuBLAS and each variant (nan: wrong output).
"""
import math
import pathlib
import sys

import cupy
import torch

SRC = (pathlib.Path(__file__).parent / "skinny_variants.cu").read_text()
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
VARIANTS = {"base": dict(WARPS=4, MINB=1, XPREFETCH=0, NOSTAGE=0),
            "nostage(diag)": dict(WARPS=4, MINB=1, XPREFETCH=0, NOSTAGE=1),
            "xprefetch": dict(WARPS=4, MINB=1, XPREFETCH=1, NOSTAGE=0),
            "minb4": dict(WARPS=4, MINB=4, XPREFETCH=0, NOSTAGE=0),
            "w8minb2": dict(WARPS=8, MINB=2, XPREFETCH=0, NOSTAGE=0),
            "w8minb2+xpf": dict(WARPS=8, MINB=2, XPREFETCH=1, NOSTAGE=0)}
SPLITS = {"qkv": (4, 8), "o": (6, 8), "gate_up": (1, 2), "down": (6, 12)}  # (4 warps, 8 warps)
X_ROW = 544  # kXRow


def time_us(fn, n=40) -> float:
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(n):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def main(m: int) -> None:
    torch.manual_seed(0)
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    modules = {name: cupy.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90a")
                                    + tuple(f"-D{k}={v}" for k, v in macros.items()))
               for name, macros in VARIANTS.items()}
    print(f"M={m}")
    for shape, (n, k) in SHAPES.items():
        copies = max(1, math.ceil(256e6 / (2 * n * k)))
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ ws[0].float().T
        row = {"cublas": time_us(lambda i: torch.nn.functional.linear(x, ws[i % copies]))}
        for name, macros in VARIANTS.items():
            blocks = (n + macros["WARPS"] * 16 - 1) // (macros["WARPS"] * 16)
            spans = (k + 127) // 128
            per = -(-spans // SPLITS[shape][macros["WARPS"] == 8])
            splits = -(-spans // per)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            partials = torch.empty(max(splits * m * n, 1), device="cuda")
            counters = torch.zeros(blocks, dtype=torch.int32, device="cuda")
            kernel = modules[name].get_function("sk2" if m > 8 else "sk1")
            smem = 2 * (2 if m > 8 else 1) * 8 * X_ROW * 2

            def run(i):
                with stream:
                    kernel((blocks, splits), (macros["WARPS"] * 32,),
                           (ws[i % copies].data_ptr(), cupy.int32(n), cupy.int32(k), x.data_ptr(), cupy.int32(m),
                            y.data_ptr(), partials.data_ptr(), counters.data_ptr(), cupy.int32(per * 128)),
                           shared_mem=smem)
            row[name] = time_us(run)
            run(0)
            torch.cuda.synchronize()
            wrong = ((y.float() - ref).abs().max() / ref.abs().max()).item() > 1e-2
            if wrong and not macros["NOSTAGE"]:
                row[name] = float("nan")
        print(shape, " ".join(f"{key}={us:.1f}" for key, us in row.items()), flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
