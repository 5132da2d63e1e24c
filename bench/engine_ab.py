"""Side-by-side step times of the engine's kernel choices on one random-weight target (H200):

    python -m specpilot.bench.engine_ab --preset qwen3-8b [--out FILE.json]

Builds the target + 5-layer drafter once, then for each configuration captures fresh CUDA graphs and
times the AR step, the 16-token verify step and the draft step (bench.gpu_engine.time_steps, 512
tokens of context). Configurations: the unfused eager elementwise path with SDPA (cuDNN), fused
elementwise kernels with SDPA, fused kernels with our decode-attention kernel for every call, and
fused kernels with "auto" attention (the default: our kernel where it was measured faster), and the
same with torch's linears routed to cuBLASLt instead of cuBLAS; last, "auto" with the fused one-token
GEMVs (models/gemv_fusion.py: norm / SwiGLU gate fused into the AR step's linears; late because a
new kernel that faults must not cost the other rows), then also the skinny tensor-core GEMM for the
verify and draft linears (models/skinny_linear.py); last, the same with split12 weights (every
layer's linears and the LM head swapped for Split12Linear, bench.gpu_engine_split12's shared
planes: the fused split12 GEMV at T = 1, or split12_linear after separate norm / gate kernels;
the mma.sync tensor-core kernel or the split12 skinny GEMM for verify; row 12 with the T = 1
linears on split12 kernel variant 5, the register-fed kernel the streamed one replaced; row 13 row 11
with the norm / gate prologue fused into the streamed GEMV, split12_gemv_m1 (measured slower than
row 11, so off by default: gemv_fusion.set_fused_split12_gemv); rows 14 and 15 are 11 and 13 on kernel
variant 6, the streamed kernel's 4-stage ring (its depth before 2 won); row 16 is 11 with the drafter's
linears on split12 as well. The swaps cannot be undone, so they run last (e.g. --configs 8,11,13,11,13,16).
All in one process, so the ratios are side by side. Prints a markdown table last.
"""
import argparse
import json

import torch

# (name, fused elementwise kernels, attention backend, cuBLAS library for the linears, fused GEMVs,
#  skinny GEMM for the verify / draft linears, weights[:split12 kernel variant, default the shipped one])
CONFIGS = (("unfused + SDPA cudnn", False, "cudnn", "cublas", False, False, "bf16"),
           ("fused + SDPA cudnn", True, "cudnn", "cublas", False, False, "bf16"),
           ("fused + specpilot attention", True, "specpilot", "cublas", False, False, "bf16"),
           ("fused + auto attention", True, "auto", "cublas", False, False, "bf16"),
           ("fused + auto attention, cuBLASLt", True, "auto", "cublaslt", False, False, "bf16"),
           ("fused + auto attention + fused GEMV (AR)", True, "auto", "cublas", True, False, "bf16"),
           ("fused + specpilot attention + fused GEMV (AR)", True, "specpilot", "cublas", True, False, "bf16"),
           ("fused + specpilot attention + fused GEMV (AR) + skinny GEMM (verify, draft)", True, "specpilot",
            "cublas", True, True, "bf16"),
           ("fused + auto attention + fused GEMV (AR), split12 weights", True, "auto", "cublas", True, False,
            "split12"),
           ("fused + auto attention, split12 weights (split12_linear at T = 1)", True, "auto", "cublas", False,
            False, "split12"),
           ("fused + specpilot attention + skinny GEMM (verify, draft), split12 weights (split12_linear at T = 1)",
            True, "specpilot", "cublas", False, True, "split12"),
           ("the same, split12 kernel variant 5 (T = 1 register-fed, without the streamed kernel)",
            True, "specpilot", "cublas", False, True, "split12:5"),
           ("fused + specpilot attention + fused GEMV (AR) + skinny GEMM (verify, draft), split12 weights",
            True, "specpilot", "cublas", True, True, "split12"),
           ("11 with split12 kernel variant 6 (the streamed T = 1 kernel's 4-stage ring)",
            True, "specpilot", "cublas", False, True, "split12:6"),
           ("13 with split12 kernel variant 6 (the streamed T = 1 kernel's 4-stage ring)",
            True, "specpilot", "cublas", True, True, "split12:6"),
           ("11 with the drafter's linears on split12 too (its layers and fc)",
            True, "specpilot", "cublas", False, True, "split12+drafter"))


def main(argv=None) -> int:
    from specpilot.formats.split12 import ops as split12_ops
    from specpilot.models import fused_ops, gemv_fusion, skinny_linear
    from specpilot.models.attention_backend import set_attention_backend
    from specpilot.models.random_ckpt import TARGET_PRESETS

    from .gpu_engine import HBM_BYTES_PER_S, fresh_engine_steps, scale_pair, weight_bytes

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.engine_ab", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b", choices=sorted(TARGET_PRESETS))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--configs", default="", help="1-based indices into CONFIGS to run, e.g. 4,6 (default: all)")
    args = p.parse_args(argv)
    chosen = [CONFIGS[int(i) - 1] for i in args.configs.split(",") if i.strip()] or list(CONFIGS)
    kinds = [c[6].partition(":")[0] for c in chosen]   # bf16, split12 or split12+drafter
    swapped = [i for i, kind in enumerate(kinds) if kind != "bf16"]
    if swapped and "bf16" in kinds[swapped[0]:]:
        raise SystemExit("engine_ab: the split12 configurations swap the target's weights for good; run them last")
    if "split12+drafter" in kinds and "split12" in kinds[kinds.index("split12+drafter"):]:
        raise SystemExit("engine_ab: the split12 drafter configuration swaps the drafter's weights for good; run it last")
    target, drafter = scale_pair(args.preset)
    floor = weight_bytes(target) / HBM_BYTES_PER_S * 1e3
    rows, failed, split12_done, drafter_done = [], [], False, False
    for name, fused, attention, blas, gemv, skinny, weights in chosen:
        weights, _, variant = weights.partition(":")
        weights, _, drafter_too = weights.partition("+")
        if weights == "split12" and not split12_done:
            split12_done = True
            from .gpu_engine_split12 import shared_plane_split12

            print("split12 bits/weight", shared_plane_split12(target), flush=True)
        if drafter_too and not drafter_done:
            drafter_done = True
            from .gpu_engine_split12 import split12_drafter

            print("split12 drafter bits/weight", split12_drafter(drafter), flush=True)
        previous = fused_ops.set_fused_kernels(fused), set_attention_backend(attention)
        previous_gemv = gemv_fusion.set_fused_gemv(gemv)
        previous_split12_gemv = gemv_fusion.set_fused_split12_gemv(gemv and weights == "split12")
        previous_skinny = skinny_linear.set_skinny_gemm(skinny)
        previous_variant = split12_ops.kernel_variant(int(variant) if variant else split12_ops.SHIPPED_VARIANT)
        previous_blas = torch.backends.cuda.preferred_blas_library()    # (called with a name it returns the new one)
        torch.backends.cuda.preferred_blas_library(blas)
        try:
            steps = fresh_engine_steps(target, drafter, args.iters)
        except RuntimeError as e:                 # recorded, and the table still prints
            print(f"{name}: FAILED {str(e)[:300]}", flush=True)
            failed.append(name)
            break                                 # a CUDA fault poisons the context for later configs
        rows.append({"config": name, **steps})
        print(name, json.dumps({k: round(v, 4) for k, v in steps.items()}), flush=True)
        fused_ops.set_fused_kernels(previous[0])
        set_attention_backend(previous[1])
        torch.backends.cuda.preferred_blas_library(previous_blas)
        gemv_fusion.set_fused_gemv(previous_gemv)
        gemv_fusion.set_fused_split12_gemv(previous_split12_gemv)
        skinny_linear.set_skinny_gemm(previous_skinny)
        split12_ops.kernel_variant(previous_variant)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"preset": args.preset, "floor_ms": floor, "rows": rows, "failed": failed}, f, indent=1)
    if not rows:
        print("every configuration failed")
        return 1
    base = rows[0]
    print(f"\n{args.preset}, random weights, bf16, 512 tokens of context, CUDA graphs, {torch.cuda.get_device_name()}; "
          f"weight floor {floor:.3f} ms at the H200's {HBM_BYTES_PER_S / 1e12:.1f} TB/s (AR/floor is the H200's only)")
    print("| config | AR ms | verify16 ms | draft ms | verify/AR | draft/verify | AR/floor | AR vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | {r['draft_ms']:.3f} | "
              f"{r['verify_ms'] / r['ar_ms']:.2f} | {r['draft_ms'] / r['verify_ms']:.2f} | {r['ar_ms'] / floor:.2f} | "
              f"{base['ar_ms'] / r['ar_ms']:.2f}x |")
    for name in failed:
        print(f"| {name} | FAILED | | | | | | |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
