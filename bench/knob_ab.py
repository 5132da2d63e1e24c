"""A/B of one engine knob in one process (H200): step times with the knob off and on, alternated
(off, on, off, on, ...) on one random-weight target, so that drift on a shared machine hits both
sides alike. A knob is a True / False field of EngineConfig (specpilot/config.py); everything else
is gpu_engine.BEST (the defaults, our attention kernel required), bf16, or split12 weights with
--split12.

    python -m specpilot.bench.knob_ab --knob attention_fused_rope [--preset qwen3-8b] [--context 512] [--reps 2]

Prints a markdown table last; --out writes every number as JSON.
"""
import argparse
import dataclasses
import json

from specpilot.config import EngineConfig

# The EngineConfig fields the timed steps read (the loop fields, fused_steps / early_launch /
# cuda_graphs, change no single step's time; compile_layers is its own experiment).
KNOBS = ("attention_fused_rope", "attention_pdl", "fused_gemv", "fused_kernels", "gemv_pdl", "skinny_gemm",
         "split12_decode_grid", "step_kernels")
assert all(isinstance(getattr(EngineConfig(), name), bool) for name in KNOBS)


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

    from .gpu_engine import BEST, HBM_BYTES_PER_S, fresh_engine_steps, scale_pair, weight_bytes

    if not torch.cuda.is_available():
        raise SystemExit("knob_ab: needs a CUDA GPU")
    target, drafter = scale_pair(args.preset)
    if args.split12:
        from .gpu_engine_split12 import shared_plane_split12

        print("split12 bits/weight", shared_plane_split12(target), flush=True)
    floor = weight_bytes(target) / HBM_BYTES_PER_S * 1e3
    rows = []
    for _ in range(args.reps):
        for value in (False, True):
            config = dataclasses.replace(BEST, **{args.knob: value})
            steps = fresh_engine_steps(target, drafter, args.iters, context=args.context, config=config)
            rows.append({"knob": args.knob, "on": value, **steps})
            print(args.knob, value, json.dumps({k: round(v, 4) for k, v in steps.items()}), flush=True)
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
