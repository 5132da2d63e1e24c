"""A/B of one engine knob in one process (H200): step times with the knob off and on, alternated
(off, on, off, on, ...) on one random-weight target, so that drift on a shared machine hits both
sides alike. Everything else is engine_ab's config 8 (fused elementwise kernels, our attention,
fused one-token GEMVs, skinny GEMM for verify and draft), bf16, or split12 weights with --split12
(engine_ab's config 11: the T = 1 linears on split12_linear after their own norm / gate kernels;
the fused_split12_gemv knob turns on config 13's split12_gemv_m1).

    python -m specpilot.bench.knob_ab --knob fused_rope [--preset qwen3-8b] [--context 512] [--reps 2]

Knobs (KNOBS): fused_rope (a one-token step's rope / cache write inside the attention kernel),
attention_pdl (programmatic dependent launch through the attention path), cluster_merge (the
attention's key splits merged inside a thread-block cluster, at most 16 splits, instead of by the
combine kernel, in every call; cluster_merge_multi_token: only in the verify / draft blocks), gemv_pdl (the same for
the one-token GEMVs), fused_split12_gemv (with --split12: the norm / SwiGLU gate inside the one-token
split12 GEMVs instead of their own kernels), split12_decode_grid (with --split12: the split12 skinny GEMM
and its bf16 twin on every SM where the planner's grid idles half of them, formats/split12/ops.py).
Prints a markdown table last; --out writes every number as JSON.
"""
import argparse
import importlib
import json


# name -> (module, setter, off value, on value): each setter takes a value and returns the previous
# one. Imported only when used (the setters of CUDA-only ops need a CUDA build to run).
KNOBS = {"fused_rope": ("specpilot.kernels.decode_attention", "set_fused_rope", False, True),
         "attention_pdl": ("specpilot.kernels.decode_attention", "set_pdl", False, True),
         "cluster_merge": ("specpilot.kernels.decode_attention", "set_cluster_merge", "none", "all"),
         "cluster_merge_multi_token": ("specpilot.kernels.decode_attention", "set_cluster_merge", "none",
                                       "multi_token"),
         "gemv_pdl": ("specpilot.models.gemv_fusion", "set_pdl", False, True),
         "fused_split12_gemv": ("specpilot.models.gemv_fusion", "set_fused_split12_gemv", False, True),
         "split12_decode_grid": ("specpilot.formats.split12.ops", "set_decode_bound_grid", False, True)}


def knob_setter(name: str):
    module, setter = KNOBS[name][:2]
    return getattr(importlib.import_module(module), setter)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.knob_ab", description=__doc__.split("\n")[0])
    p.add_argument("--knob", required=True, choices=sorted(KNOBS))
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache when the steps are timed")
    p.add_argument("--reps", type=int, default=2, help="off / on pairs")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--split12", action="store_true", help="split12 weights (converted at load)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    from .gpu_engine import HBM_BYTES_PER_S, fresh_engine_steps, scale_pair, use_best_kernels, weight_bytes

    if not torch.cuda.is_available():
        raise SystemExit("knob_ab: needs a CUDA GPU")
    setter = knob_setter(args.knob)
    target, drafter = scale_pair(args.preset)
    if args.split12:
        from .gpu_engine_split12 import shared_plane_split12

        print("split12 bits/weight", shared_plane_split12(target), flush=True)
    floor = weight_bytes(target) / HBM_BYTES_PER_S * 1e3
    use_best_kernels()
    rows = []
    off, on = KNOBS[args.knob][2:]
    previous = setter(off)
    try:
        for _ in range(args.reps):
            for value in (off, on):
                setter(value)
                steps = fresh_engine_steps(target, drafter, args.iters, context=args.context)
                rows.append({"knob": args.knob, "on": value == on, **steps})
                print(args.knob, value, json.dumps({k: round(v, 4) for k, v in steps.items()}), flush=True)
    finally:
        setter(previous)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"preset": args.preset, "context": args.context, "split12": args.split12,
                       "floor_ms": floor, "rows": rows}, f, indent=1)
    print(f"\n{args.preset}, random weights, {'split12' if args.split12 else 'bf16'}, {args.context} tokens of "
          f"context, CUDA graphs, off / on alternated in one process; weight floor {floor:.3f} ms")
    print(f"| {args.knob} | AR ms | verify16 ms | draft ms | AR/floor |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['on'] else 'off'} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | {r['draft_ms']:.3f} | "
              f"{r['ar_ms'] / floor:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
