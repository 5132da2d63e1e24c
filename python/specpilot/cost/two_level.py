"""The two-level mechanisms at the ceilings: what a reduced draft vocabulary (EngineConfig.draft_vocab)
and the certified LM head (two_level "certified-head") can buy on a deployment's shapes, with every
component at its ceiling (cost/gaps.py's rule), so it needs no device and no checkpoint.

Both trade something the shapes cannot know: the draft vocabulary trades tau, the certified head
its fallback rate. So the answer is a break-even: the reduced vocabulary N wins iff
    tau_N / tau_full > (draft_N + verify) / (draft_full + verify)
and the certified head wins iff its fallback rate f satisfies
    level1 + shortlist + f * head < head.
`agent loop / docs`: measure tau_N (bench/draft_vocab_tau.py) and f (bench/certified_head_rate.py) on
the pair, then keep a mechanism only where the measurement clears the break-even.

  python -m specpilot.cost.two_level --preset qwen3-8b --draft-layers 5 --block-size 16 --tau 6.49 \\
      --bandwidth 3.35e12 --matmul 9.89e14 --launch 2e-6
(the defaults: an H100's nominal HBM bandwidth and dense bf16 rate, stated, not measured).
  python -m specpilot.cost.two_level --prefix-trace OUT/traces_our_spec.json
prefix-first verification's (C2) verified rows per prefix on a recorded acceptance trace.
"""
from __future__ import annotations

import argparse
import json

from specpilot.cost.ceilings import Ceilings
from specpilot.cost.gaps import ceiling_of, work
from specpilot.cost.shapes import ModelShape, step_components


def preset_shapes(preset: str, draft_layers: int) -> tuple:
    """(target, drafter) ModelShapes of a random_ckpt preset and its DFlash drafter (dflash's layout)."""
    from specpilot.models.random_ckpt import TARGET_PRESETS

    if preset not in TARGET_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(TARGET_PRESETS)}")
    c = TARGET_PRESETS[preset]
    shape = dict(hidden=c.hidden_size, heads=c.num_heads, kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                 intermediate=c.intermediate_size, vocab=c.vocab_size)
    return (ModelShape(layers=c.num_layers, name=preset, **shape),
            ModelShape(layers=draft_layers, name=f"{preset}-dflash-{draft_layers}l", **shape))


def step_ceilings(target, drafter, feats: int, block: int, ceil: Ceilings, weights: str = "bf16",
                  context: int = 1024, draft_vocab: int = 0, certified=None) -> dict:
    """Seconds per step (decode, draft, verify) at batch 1, every component at its ceiling."""
    steps = {"decode": 0.0, "draft": 0.0, "verify": 0.0}
    for c in step_components(target, drafter, feats, 1, block, context, weights, draft_vocab, certified):
        nbytes, flops = work(c, ceil.device, target, drafter, 1, context, weights)
        seconds = c.extra[0] * ceil.launch_s if c.kind == "launches" else ceiling_of(nbytes, flops, ceil)[0]
        steps[c.step] += seconds * c.count
    return steps


def projection(target, drafter, feats: int, block: int, tau: float, ceil: Ceilings, sizes, ranks,
               weights: str = "bf16", context: int = 1024) -> dict:
    full = step_ceilings(target, drafter, feats, block, ceil, weights, context)
    spec_full = full["draft"] + full["verify"]
    vocab_rows = []
    for n in sizes:
        s = step_ceilings(target, drafter, feats, block, ceil, weights, context, draft_vocab=n)
        vocab_rows.append({"draft_vocab": n, "draft_s": s["draft"], "draft_over_full": s["draft"] / full["draft"],
                           "break_even_tau_ratio": (s["draft"] + s["verify"]) / spec_full,
                           "spec_over_ar_at_full_tau": tau * full["decode"] / (s["draft"] + s["verify"])})
    head_rows = []
    for rank in ranks:
        zero = step_ceilings(target, drafter, feats, block, ceil, weights, context, certified=(rank, 0.0))
        one = step_ceilings(target, drafter, feats, block, ceil, weights, context, certified=(rank, 1.0))
        head = one["verify"] - zero["verify"]                     # the exact head, once
        level1 = zero["verify"] - (full["verify"] - head)          # level 1 + shortlist
        head_rows.append({"rank": rank, "level1_over_head": level1 / head,
                          "break_even_fallback_rate": max(0.0, 1.0 - level1 / head),
                          "spec_over_ar_at_no_fallback": tau * full["decode"] / (full["draft"] + zero["verify"])})
    return {"target": target.name, "drafter": drafter.name, "block_size": block, "tau": tau, "weights": weights,
            "ceilings": ceil.to_dict(), "steps_full": full, "spec_over_ar_full": tau * full["decode"] / spec_full,
            "draft_vocab": vocab_rows, "certified_head": head_rows}


def best_draft_vocab(steps: dict, taus: dict) -> tuple:
    """The draft vocabulary that maximises tokens per second: steps {N: (draft_s, verify_s)} (measured,
    or step_ceilings'), taus {N: tau measured with N} (0: the full head, required). Returns (N, its
    tokens/s over the full head's); the full head wins ties, so a mechanism goes on only when it pays."""
    if 0 not in steps or 0 not in taus:
        raise ValueError("best_draft_vocab needs the full head (N = 0) in both steps and taus")
    missing = sorted(set(taus) ^ set(steps))
    if missing:
        raise ValueError(f"best_draft_vocab: sizes {missing} have a step time or a tau but not both")
    rate = {n: taus[n] / sum(steps[n]) for n in taus}
    best = max(sorted(rate), key=lambda n: (rate[n], n == 0))
    return best, rate[best] / rate[0]


def prefix_first_rows(acceptance_lengths, block: int, prefix: int) -> dict:
    """Prefix-first verification (C2, BatchConfig.verify_prefix = `prefix`) on recorded greedy steps:
    pass 1 verifies the block's first `prefix` rows (anchor + prefix - 1 drafts), which judge drafts
    1..prefix; pass 2 verifies the other block - prefix rows only when all of those were accepted
    (the same decisions as one pass, so the recorded acceptance lengths, bonus included, stay valid).
    Returns verified rows per step against `block` and the share of steps needing pass 2."""
    if not 1 <= prefix < block:
        raise ValueError(f"prefix {prefix} must be in 1..{block - 1} for block {block}")
    steps = [a for a in acceptance_lengths if 1 <= a <= block]
    if not steps:
        raise ValueError("prefix_first_rows needs at least one recorded acceptance length")
    second = [a - 1 >= prefix for a in steps]                # all `prefix` judged drafts accepted
    rows = sum(prefix + (block - prefix) * s for s in second) / len(steps)
    return {"prefix": prefix, "rows_per_step": rows, "rows_over_block": rows / block,
            "second_pass_share": sum(second) / len(steps)}


def format_projection(p: dict) -> str:
    lines = [f"# {p['target']} + {p['drafter']}, block {p['block_size']}, tau {p['tau']}, {p['weights']}, at the "
             f"ceilings ({p['ceilings']['device_name']}): spec / AR <= {p['spec_over_ar_full']:.2f}x single-level",
             "| draft vocab N | draft step / full | N wins iff tau_N / tau_full > | spec / AR at unchanged tau |",
             "| --- | --- | --- | --- |"]
    for r in p["draft_vocab"]:
        lines.append(f"| {r['draft_vocab'] or 'full'} | {r['draft_over_full']:.3f} | {r['break_even_tau_ratio']:.3f} | "
                     f"{r['spec_over_ar_at_full_tau']:.2f}x |")
    lines += ["| certified head rank r | level 1 / exact head | wins iff fallback rate < | spec / AR, no fallback |",
              "| --- | --- | --- | --- |"]
    for r in p["certified_head"]:
        lines.append(f"| {r['rank']} | {r['level1_over_head']:.3f} | {r['break_even_fallback_rate']:.3f} | "
                     f"{r['spec_over_ar_at_no_fallback']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b", help="a models.random_ckpt preset (the target's shape)")
    p.add_argument("--draft-layers", type=int, default=5)
    p.add_argument("--feature-layers", type=int, default=5, help="target layers the drafter reads")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--tau", type=float, default=6.49)
    p.add_argument("--weights", choices=("bf16", "split12"), default="bf16")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--sizes", default="0,8192,16384,32768,65536")
    p.add_argument("--ranks", default="256,512,1024")
    p.add_argument("--bandwidth", type=float, default=3.35e12, help="copy bytes/s (stated: H100 HBM3 nominal)")
    p.add_argument("--matmul", type=float, default=9.89e14, help="bf16 flop/s (stated: H100 SXM dense)")
    p.add_argument("--launch", type=float, default=2e-6, help="seconds per kernel in a graph (stated)")
    p.add_argument("--prefix-trace", default=None, metavar="TRACE.json",
                   help="an acceptance trace (specpilot bench's traces_*.json): print prefix-first's verified "
                        "rows per prefix from it instead (each prompt's last, possibly capped, step left out)")
    args = p.parse_args(argv)
    if args.prefix_trace:
        from specpilot.bench import traces

        trace = traces.load(args.prefix_trace)
        steps = [a for row in trace.prompts for a in row["acceptance_lengths"][:-1]]
        print(f"# {trace.describe()}: {len(steps)} steps")
        print("| verify prefix P (pass-1 rows) | verified rows / block | steps needing pass 2 |\n| --- | --- | --- |")
        for m in range(1, trace.block_size):
            r = prefix_first_rows(steps, trace.block_size, m)
            print(f"| {m} | {r['rows_over_block']:.3f} | {100 * r['second_pass_share']:.1f} % |")
        return 0
    target, drafter = preset_shapes(args.preset, args.draft_layers)
    ceil = Ceilings("cuda", f"stated: {args.bandwidth:.3g} B/s, {args.matmul:.3g} flop/s, {args.launch:.2g} s/launch",
                    args.bandwidth, args.matmul, args.launch, "bfloat16")
    out = projection(target, drafter, args.feature_layers, args.block_size, args.tau, ceil,
                     [int(s) for s in args.sizes.split(",")], [int(r) for r in args.ranks.split(",")],
                     args.weights, args.context)
    print(format_projection(out))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
