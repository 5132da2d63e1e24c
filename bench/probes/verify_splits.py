"""How many key splits the multi-row attention (verify / draft blocks) should use: the engine's
graphed steps with the split count of calls over more than 16 query rows per KV head forced to each
value (one-token steps keep the default: their AR column is the drift control), alternated in one
process at each context. One-off experiment, not part of the package:

    python bench/probes/verify_splits.py [--contexts 512,2048] [--splits 0,12,8,4] [--reps 2]

0 = the default rule (kernels/decode_attention.default_splits). Prints one markdown table.
"""
import argparse
import contextlib
import gc
import json

import torch

from specpilot.kernels import decode_attention


@contextlib.contextmanager
def forced_splits(n):
    real = decode_attention.default_splits
    if n > 0:
        decode_attention.default_splits = lambda b, hkv, rows, span, sms: n if rows > 16 else real(b, hkv, rows, span, sms)
    try:
        yield
    finally:
        decode_attention.default_splits = real


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="512,2048")
    p.add_argument("--splits", default="0,12,8,4")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()

    from specpilot.bench.gpu_engine import time_steps
    from specpilot.engine import Engine
    from specpilot.models import fused_ops, gemv_fusion, skinny_linear
    from specpilot.models.attention_backend import set_attention_backend
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    cfg = TARGET_PRESETS["qwen3-8b"]
    target = random_target(cfg, "cuda", torch.bfloat16, seed=0)
    drafter = random_drafter(drafter_config_for(cfg, num_layers=5, block_size=16), target, seed=1)
    fused_ops.set_fused_kernels(True)
    set_attention_backend("specpilot")
    gemv_fusion.set_fused_gemv(True)
    skinny_linear.set_skinny_gemm(True)
    rows = []
    for context in map(int, args.contexts.split(",")):
        max_seq_len = max(1024, 1 << (context + 64).bit_length())
        for _ in range(args.reps):
            for n in map(int, args.splits.split(",")):
                with forced_splits(n):
                    engine = Engine(target, drafter, max_seq_len=max_seq_len)
                    steps = time_steps(engine, 16, args.iters, context=context)
                rows.append({"context": context, "splits": n, **{k: steps[k] for k in ("ar_ms", "verify_ms", "draft_ms")}})
                print(json.dumps(rows[-1]), flush=True)
                del engine
                gc.collect()
                torch.cuda.empty_cache()
    print("\nqwen3-8b, random weights, bf16, config 8; splits of the multi-row attention calls (0 = default)")
    print("| context | splits | AR ms | verify16 ms | draft ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['splits']} | {r['ar_ms']:.3f} | {r['verify_ms']:.3f} | {r['draft_ms']:.3f} |")


if __name__ == "__main__":
    main()
