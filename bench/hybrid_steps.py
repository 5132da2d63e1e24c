"""Step times of a hybrid recurrent target at a scale shape (GPU), against the memory floor:

    python -m specpilot.bench.hybrid_steps --preset qwen3.5-9b [--context 512] [--block 16] [--out F.json]

Random bf16 weights (models/random_hybrid.py), our engine's eager step loop. Reports ms per AR step
(T = 1) and per verify step (T = block, keeping the per-position recurrent states), the commit
(copying the accepted snapshot and conv window into the committed state), and the floor of a step:
the bytes it must move (every weight once, the fp32 recurrent states read and written, plus for a
verify block its T snapshots; conv states; the KV of the attention layers over the context) over
the card's measured device-to-device copy bandwidth. Issue 33's targets: AR within 12% of the floor,
verify16 at most 1.15x AR, state handling at most 5% of a verify step.
"""
from __future__ import annotations

import argparse
import json


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    from specpilot.bench.step_times import _event_ms

    ms = _event_ms(lambda: dst.copy_(src), iters)
    return 2 * nbytes / (ms * 1e-3)


def floor_bytes(target, cache, context: int, t: int) -> dict:
    cfg = target.config
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    state = sum(s.numel() * s.element_size() for s in cache.state)
    conv = sum(c.numel() * c.element_size() for c in cache.conv)
    kv = sum(k[:, :, :context + t].numel() * k.element_size() for k in cache.k) * 2
    snapshots = state * t                                  # the per-position states a step writes
    return {"weights": weights, "state_read": state, "state_written": snapshots, "conv": 2 * conv, "kv": kv,
            "layers_gdn": len(cfg.gdn_layers), "layers_attention": len(cfg.attention_layers)}


def main(argv=None) -> int:
    import torch

    from specpilot.bench.step_times import _event_ms
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target
    from specpilot.models.random_hybrid import HYBRID_PRESETS

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.hybrid_steps", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3.5-9b", choices=sorted(HYBRID_PRESETS))
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("hybrid_steps times GPU steps: no CUDA device here")
    target = random_target(TARGET_PRESETS[args.preset], "cuda", torch.bfloat16, seed=0)
    engine = Engine(target, None, max_seq_len=args.context + 2 * args.block + 64)
    runner, cache = engine.runner, engine.cache
    with torch.inference_mode():
        prompt = torch.randint(0, target.config.vocab_size - 2, (1, args.context), device=target.device)
        runner.prefill(prompt, with_features=False)
        one, block = prompt[:, -1:], prompt[:, -args.block:].clone()
        ar_ms = _event_ms(lambda: runner.target_step(one, args.context, with_features=False), args.iters)
        verify_ms = _event_ms(lambda: runner.target_step(block, args.context, with_features=False), args.iters)

        def verify_then_commit():
            runner.target_step(block, args.context, with_features=False)
            cache.commit(args.context + args.block // 2)        # a mid-block acceptance
            cache.committed_len = args.context                   # rewind the position (same state size)
        commit_ms = _event_ms(verify_then_commit, args.iters) - verify_ms
    bandwidth = copy_bandwidth()
    out = {"device": torch.cuda.get_device_name(), "preset": args.preset, "context": args.context,
           "block": args.block, "ar_ms": ar_ms, "verify_ms": verify_ms, "commit_ms": commit_ms,
           "copy_GBps": bandwidth / 1e9}
    for name, t in (("ar", 1), ("verify", args.block)):
        moved = floor_bytes(target, cache, args.context, t)
        floor = sum(v for k, v in moved.items() if not k.startswith("layers")) / bandwidth * 1e3
        out[f"{name}_floor_ms"], out[f"{name}_bytes"] = floor, moved
        out[f"{name}_over_floor"] = out[f"{name}_ms"] / floor
    out["verify_over_ar"] = verify_ms / ar_ms
    out["commit_share_of_verify"] = commit_ms / verify_ms
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
