"""Step times of a hybrid recurrent target at a scale shape (GPU), CUDA-graphed and eager, against
the memory floor:

    python -m specpilot.bench.hybrid_steps --preset qwen3.5-9b [--context 512] [--block 16]
        [--e2e TOKENS] [--profile FILE.txt] [--out FILE.json]

Random bf16 weights (models/random_hybrid.py). Reports ms per AR step (T = 1) and per verify step
(T = block, keeping the per-position recurrent states), the commit (copying the accepted snapshot
and conv window into the committed state), for the graphed steps (engine/hybrid_graphs.py: the
top-level keys) and the eager step loop (under "eager"), and the floor of a step: the bytes it
must move (every weight once, the fp32 recurrent states read and written, plus for a verify block
its T snapshots; conv states; the KV of the attention layers over the context) over the card's
measured device-to-device copy bandwidth. Issue 33's targets: AR within 12% of the floor, verify16
at most 1.15x AR, state handling at most 5% of a verify step.

--e2e TOKENS: also whole greedy generations of TOKENS tokens (decode time, host included) with a
random 5-layer DFlash drafter: AR, then spec replaying tau (--tau, DFlash's Qwen3-8B 6.49) over the
engine's own AR transcript (bench/step_times.replayed_generation), graphed and eager.
--profile FILE: torch.profiler's top ops (device and host time) of the graphed and eager AR and
verify steps (bench/profile_steps.py).
"""
from __future__ import annotations

import argparse
import json


def floor_bytes(target, cache, context: int, t: int) -> dict:
    cfg = target.config
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    state = sum(s.numel() * s.element_size() for s in cache.state)
    conv = sum(c.numel() * c.element_size() for c in cache.conv)
    kv = sum(k[:, :, :context + t].numel() * k.element_size() for k in cache.k) * 2
    snapshots = state * t                                  # the per-position states a step writes
    return {"weights": weights, "state_read": state, "state_written": snapshots, "conv": 2 * conv, "kv": kv,
            "layers_gdn": len(cfg.gdn_layers), "layers_attention": len(cfg.attention_layers)}


def step_fns(engine, context: int, block: int) -> dict:
    """Prefills `context` random tokens; -> {ar, verify, verify_commit}: functions of no arguments
    running one step at position `context` (verify_commit: a verify, then a mid-block acceptance
    committed, then the position rewound, so every call sees the same sizes)."""
    import torch

    runner, cache = engine.runner, engine.cache
    gen = torch.Generator(device=engine.device).manual_seed(0)
    prompt = torch.randint(0, engine.target.config.vocab_size - 2, (1, context), device=engine.device, generator=gen)
    runner.prefill(prompt, with_features=False)
    one, blk = prompt[:, -1:], prompt[:, -block:].clone()

    def verify_commit():
        runner.target_step(blk, context, with_features=False)
        cache.commit(context + block // 2)
        cache.committed_len = context

    return {"ar": lambda: runner.target_step(one, context, with_features=False),
            "verify": lambda: runner.target_step(blk, context, with_features=False),
            "verify_commit": verify_commit}


def time_steps(engine, context: int, block: int, iters: int) -> dict:
    from specpilot.bench.step_times import _event_ms

    fns = step_fns(engine, context, block)
    ms = {name: _event_ms(fn, iters) for name, fn in fns.items()}
    return {"ar_ms": ms["ar"], "verify_ms": ms["verify"], "commit_ms": ms["verify_commit"] - ms["verify"],
            "graphs": len(engine.runner.graphs)}


def e2e(engine, context: int, tokens: int, tau: float) -> dict:
    """replayed_generation's figures; spec_equals_ar: the replayed spec output is the AR transcript
    (both are `tokens` long: random targets have no stop token)."""
    import torch

    from specpilot.bench.step_times import replayed_generation

    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, engine.target.config.vocab_size - 2, (context,), generator=gen).tolist()
    out = replayed_generation(engine, prompt, tokens, tau)
    both = out.pop("e2e_tokens")
    ar, spec = both[:len(both) // 2], both[len(both) // 2:]
    out["e2e_spec_equals_ar"] = ar == spec
    if ar != spec:
        out["e2e_first_divergence"] = divergence(engine, prompt, ar, spec)
    return out


def divergence(engine, prompt: list, ar: list, spec: list) -> dict:
    """Where the spec transcript first leaves AR's, and how near a tie the target's logits are there
    (a prefill over the prompt and AR's tokens before it, this engine's dtype): a gap of a few ulps
    of the logit is the bf16 caveat of two summation shapes (decode vs verify); a wide one is a bug."""
    import torch

    i = next((j for j, (a, b) in enumerate(zip(ar, spec)) if a != b), min(len(ar), len(spec)))
    if i == min(len(ar), len(spec)):
        return {"index": i, "lengths": [len(ar), len(spec)]}          # one transcript ends early
    ids = torch.tensor([prompt + ar[:i]], device=engine.device)
    logits = engine.runner.prefill(ids, with_features=False)[0][0, -1].float()
    top2 = torch.topk(logits, 2)
    ulp = torch.finfo(engine.target.dtype).eps * float(top2.values[0].abs())
    return {"index": i, "ar_token": ar[i], "spec_token": spec[i], "prefill_argmax": int(top2.indices[0]),
            "logit_ar": float(logits[ar[i]]), "logit_spec": float(logits[spec[i]]),
            "top2_gap": float(top2.values[0] - top2.values[1]), "ulp_at_top": ulp}


def main(argv=None) -> int:
    import torch

    from specpilot.config import EngineConfig
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target
    from specpilot.models.random_hybrid import HYBRID_PRESETS

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.hybrid_steps", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3.5-9b", choices=sorted(HYBRID_PRESETS))
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--e2e", type=int, default=0, metavar="TOKENS", help="also whole replayed generations (0: off)")
    p.add_argument("--tau", type=float, default=6.49, help="the acceptance replayed by --e2e")
    p.add_argument("--profile", default=None, metavar="FILE", help="write the profiler's top ops here")
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("hybrid_steps times GPU steps: no CUDA device here")
    if args.e2e < 0:
        raise SystemExit(f"--e2e {args.e2e} must be >= 0")
    target = random_target(TARGET_PRESETS[args.preset], "cuda", torch.bfloat16, seed=0)
    drafter = None
    if args.e2e:
        drafter = random_drafter(drafter_config_for(target.config, num_layers=5, block_size=args.block), target)
    room = args.context + max(2 * args.block, args.e2e + args.block) + 64
    graphed, eager = (Engine(target, drafter, max_seq_len=room, config=EngineConfig(cuda_graphs=on))
                      for on in (True, False))
    if not graphed.use_graphs:
        raise SystemExit(f"the engine does not graph this target: {graphed.eager_reason}")
    with torch.inference_mode():
        out = {"device": torch.cuda.get_device_name(), "preset": args.preset, "context": args.context,
               "block": args.block, **time_steps(graphed, args.context, args.block, args.iters),
               "eager": time_steps(eager, args.context, args.block, args.iters)}
        if args.profile:
            from specpilot.bench.profile_steps import profile_steps

            steps = {}
            for name, engine in (("graphed", graphed), ("eager", eager)):
                fns = step_fns(engine, args.context, args.block)
                steps[f"{name} ar"], steps[f"{name} verify{args.block}"] = fns["ar"], fns["verify"]
            profile_steps(steps, args.profile)
            out["profile"] = args.profile
        if args.e2e:
            out.update(e2e(graphed, args.context, args.e2e, args.tau))
            out["eager"].update(e2e(eager, args.context, args.e2e, args.tau))
    from specpilot.bench.device_rates import copy_bandwidth

    bandwidth = copy_bandwidth("cuda")
    out["copy_GBps"] = bandwidth / 1e9
    for name, t in (("ar", 1), ("verify", args.block)):
        moved = floor_bytes(target, graphed.cache, args.context, t)
        floor = sum(v for k, v in moved.items() if not k.startswith("layers")) / bandwidth * 1e3
        out[f"{name}_floor_ms"], out[f"{name}_bytes"] = floor, moved
        for row in (out, out["eager"]):
            row[f"{name}_over_floor"] = row[f"{name}_ms"] / floor
    for row in (out, out["eager"]):
        row["verify_over_ar"] = row["verify_ms"] / row["ar_ms"]
        row["commit_share_of_verify"] = row["commit_ms"] / row["verify_ms"]
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
