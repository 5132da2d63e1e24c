"""A/B of a setting of the greedy decode loops in one process, measured where it counts: in whole
generations, host time between steps included.

Knobs (EngineConfig fields): early_launch (off: the host reads a step's result, does
stock's bookkeeping, uploads the next control and then launches; on: the spec step writes the next
step's control itself, so the host launches as soon as it has read a result with no stop in it, and
the AR loop keeps one token's step in flight), step_kernels (the spec step's argmaxes and
bookkeeping in two CUDA kernels, or in torch's small kernels).

    python -m specpilot.bench.loop_ab [--knob early_launch] [--preset qwen3-8b] [--split12] [--tokens 512]

A random-weight target of the preset (scale tier) on the GPU, a prompt of random ids, our greedy
AR output as the transcript, and our spec loop replaying a fixed tau over it (6.49: DFlash's
published Qwen3-8B mean). Each rep runs AR then spec with the knob off, then both with it on,
each on a fresh engine whose graphs were captured with the knob as set.
Prints decode ms per AR token and per spec step (decode time: after the prefill's token), the spec
loop's tokens/s, and the graphed steps alone (CUDA events, no host in between) for reference.
"""
import argparse
import dataclasses
import gc
import json

KNOBS = ("early_launch", "step_kernels")   # EngineConfig fields


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.loop_ab", description=__doc__.split("\n")[0])
    p.add_argument("--knob", default="early_launch", choices=sorted(KNOBS))
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--split12", action="store_true", help="split12 weights (target and drafter)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=512, help="new tokens per generation")
    p.add_argument("--tau", type=float, default=6.49, help="replayed tokens per spec step")
    p.add_argument("--reps", type=int, default=2, help="off / on pairs")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    from specpilot.engine import Engine
    from specpilot.engine.replay import AcceptanceReplay

    from .gpu_engine import BEST, scale_pair, time_steps

    if not torch.cuda.is_available():
        raise SystemExit("loop_ab: needs a CUDA GPU")
    target, drafter = scale_pair(args.preset)
    if args.split12:
        from .gpu_engine_split12 import shared_plane_split12, split12_drafter

        shared_plane_split12(target)
        split12_drafter(drafter)
    seq_len = 1 << (args.prompt_tokens + args.tokens + 16).bit_length()

    def fresh_engine(config=BEST):
        """An Engine whose graphs capture `config` (a knob may change their kernels)."""
        gc.collect()
        torch.cuda.empty_cache()
        engine = Engine(target, drafter, max_seq_len=seq_len, config=config)
        engine.warmup(drafter.block_size)
        return engine

    engine = fresh_engine()
    prompt = torch.randint(0, 256, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    transcript = engine.generate_ar(prompt, args.tokens).tokens
    steps = time_steps(engine, drafter.block_size, context=args.prompt_tokens + args.tokens // 2)
    print("graphed steps:", json.dumps({k: round(v, 4) for k, v in steps.items()}), flush=True)

    rows, first = [], None
    for _ in range(args.reps):
        for on in (False, True):
            del engine
            engine = fresh_engine(dataclasses.replace(BEST, **{args.knob: on}))
            ar = engine.generate_ar(prompt, args.tokens)
            spec = engine.generate_spec(prompt, args.tokens, replay=AcceptanceReplay(transcript, args.tau))
            # Both modes must give the same tokens (the same kernels). Spec may still fork from
            # the AR transcript at bf16 near-ties (replay's shortfalls): reported, not an error.
            first = first or (ar.tokens, spec.tokens)
            if (ar.tokens, spec.tokens) != first:
                raise SystemExit(f"loop_ab: {args.knob}={on} changed the tokens: not a timing difference")
            row = {"on": on, "ar_ms_per_token": ar.decode_s / (len(ar.tokens) - 1) * 1e3,
                   "spec_ms_per_step": spec.decode_s / spec.steps * 1e3,
                   "spec_tokens_per_s": len(spec.tokens) / spec.decode_s, "spec_steps": spec.steps,
                   "tau": (len(spec.tokens) - 1) / spec.steps, "shortfalls": spec.replay_shortfalls}
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "graphed_steps": steps, "rows": rows}, f, indent=1)

    name = torch.cuda.get_device_name()
    print(f"\n{args.preset}, random weights, {'split12' if args.split12 else 'bf16'}, {name}; prompt "
          f"{args.prompt_tokens} + {args.tokens} new tokens, tau {args.tau} replayed; one process")
    print(f"graphed alone: AR {steps['ar_ms']:.3f} ms, verify16 + draft {steps['verify_ms'] + steps['draft_ms']:.3f} ms")
    print(f"| {args.knob} | AR ms / token | spec ms / step | spec tok/s | spec steps |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['on'] else 'off'} | {r['ar_ms_per_token']:.3f} | {r['spec_ms_per_step']:.3f} | "
              f"{r['spec_tokens_per_s']:.1f} | {r['spec_steps']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
