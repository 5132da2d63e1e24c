"""`specpilot cost --concurrency C [--verify-prefix P | --verify-len L]`: the batched step model
(cost/batched.py) of a deployment at a card's ceilings, against batched AR; the last line is one JSON
object. The target and drafter are checkpoint folders (config.json) or, for the target, a
models.random_ckpt preset name (its DFlash drafter then has --draft-layers layers)."""
from __future__ import annotations

import json
from pathlib import Path


def add_arguments(parser) -> None:
    g = parser.add_argument_group("batched step model (--concurrency; at stated ceilings, no device needed)")
    g.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="model the batched engine's steps at C requests instead of timing single-request components")
    policy = g.add_mutually_exclusive_group()
    policy.add_argument("--verify-prefix", type=int, default=0, metavar="P",
                        help="prefix-first verification (BatchConfig.verify_prefix): pass 1 over P rows, pass 2 "
                             "over the rest for the requests that accepted all P drafts")
    policy.add_argument("--verify-len", type=int, default=0, metavar="L",
                        help="verify only the first L block rows (acceptance cut at L - 1 drafts)")
    g.add_argument("--card", default="H100", help="stated ceilings: H100 | H200 (cost/batched.py CARDS), or "
                                                  "'here' to measure this --device's")
    g.add_argument("--matmul", type=float, default=None, metavar="FLOP/S",
                   help="replace the card's matmul rate (e.g. a GEMM rate measured on it)")
    g.add_argument("--trace", default=None, metavar="TRACE.json",
                   help="acceptance lengths from a recorded trace (specpilot bench's traces_*.json) instead of "
                        "a geometric law fitted to --tau")
    g.add_argument("--draft-layers", type=int, default=5, help="the preset target's DFlash drafter layers")
    g.add_argument("--new-tokens", type=int, default=0, metavar="N",
                   help="also the closed loop's speedup at the ceilings: requests of N new tokens and "
                        "--prompt-tokens prompt rows, whose prefill chunks ride in decode steps")
    g.add_argument("--prompt-tokens", type=float, default=0.0, metavar="P", help="mean prompt rows a request")
    g.add_argument("--prefill-chunk", type=int, default=256, metavar="ROWS",
                   help="prompt rows a step carries at most (BatchConfig.prefill_chunk)")


def refuse_without_concurrency(args) -> None:
    """The batched model's options mean nothing to the single-request gap table: name the one given."""
    given = [flag for flag, on in (("--verify-prefix", args.verify_prefix), ("--verify-len", args.verify_len),
                                   ("--trace", args.trace), ("--matmul", args.matmul is not None),
                                   ("--card", args.card != "H100"), ("--new-tokens", args.new_tokens),
                                   ("--prompt-tokens", args.prompt_tokens),
                                   ("--prefill-chunk", args.prefill_chunk != 256)) if on]
    if given:
        raise ValueError(f"{', '.join(given)} go with --concurrency C (the batched step model)")


def _shapes(args) -> tuple:
    """(target, drafter, feature layers, block size) from folders or a preset."""
    from specpilot.cost.shapes import ModelShape, drafter_target_layers
    from specpilot.cost.two_level import preset_shapes

    if Path(args.target).is_dir():
        if not args.drafter:
            raise ValueError("--concurrency with a target folder needs --drafter (a DFlash drafter folder)")
        from specpilot.cost.gaps import _drafter_block_size

        return (ModelShape.from_dir(args.target), ModelShape.from_dir(args.drafter),
                drafter_target_layers(args.drafter), args.block_size or _drafter_block_size(args.drafter))
    try:
        target, drafter = preset_shapes(args.target, args.draft_layers)
    except ValueError as e:
        raise ValueError(f"--target {args.target!r} is neither a checkpoint folder nor a preset: {e}") from None
    if args.drafter:
        raise ValueError("--drafter goes with a target folder; a preset target uses its DFlash drafter (--draft-layers)")
    return target, drafter, args.draft_layers, args.block_size or 16


def _acceptance(args, block: int):
    from specpilot.cost.batched import Acceptance

    if args.trace:
        from specpilot.bench import traces

        trace = traces.load(args.trace)
        if trace.block_size != block:
            raise ValueError(f"--trace was recorded at block {trace.block_size}, the deployment's block is {block}")
        steps = [a for row in trace.prompts for a in row["acceptance_lengths"][:-1]]  # last step: capped
        return Acceptance.from_lengths(steps, block, f"trace {Path(args.trace).name}")
    return Acceptance.geometric(4.3 if args.tau is None else args.tau, block)  # cost_report's stated default


def _ceilings(args):
    from dataclasses import replace

    from specpilot.cost.batched import CARDS

    if args.card == "here":
        import torch

        from specpilot.cost.ceilings import measure_ceilings

        ceil = measure_ceilings(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), quick=args.quick)
    elif args.card in CARDS:
        ceil = CARDS[args.card]
    else:
        raise ValueError(f"--card {args.card!r}: choose from {sorted(CARDS)} or 'here'")
    if args.matmul is not None:
        if args.matmul <= 0:
            raise ValueError(f"--matmul must be > 0, got {args.matmul}")
        ceil = replace(ceil, matmul_flops=args.matmul, device_name=f"{ceil.device_name}, matmul {args.matmul:.3g} stated")
    return ceil


def run(args) -> int:
    from specpilot.cost.batched import batched_step, closed_loop, format_closed_loop, format_step

    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.batch != 1:
        raise ValueError("--batch times single-request components; --concurrency models batched steps: give one")
    target, drafter, feats, block = _shapes(args)
    acceptance = _acceptance(args, block)
    ceil = _ceilings(args)
    kw = dict(weights=args.weights, context=args.context)
    step = batched_step(target, drafter, feats, args.concurrency, acceptance, ceil, verify_prefix=args.verify_prefix,
                        verify_len=args.verify_len, **kw)
    print(format_step(step))
    out = {"deployment": {"target": target.name, "drafter": drafter.name, "concurrency": args.concurrency,
                          "block_size": block, "weights": args.weights, "context": args.context}, "step": step}
    if args.verify_prefix or args.verify_len:
        full = batched_step(target, drafter, feats, args.concurrency, acceptance, ceil, **kw)
        print(f"# against full-block verify: {full['spec_tokens_per_s']:.0f} tok/s ({full['speedup_over_ar']:.2f}x AR);"
              f" {step['policy']} is {step['spec_tokens_per_s'] / full['spec_tokens_per_s']:.3f}x full-block verify")
        out["full_block"] = full
    if args.new_tokens or args.prompt_tokens:
        loop = closed_loop(target, drafter, feats, args.concurrency, acceptance, ceil, args.new_tokens,
                           args.prompt_tokens, args.prefill_chunk, verify_prefix=args.verify_prefix,
                           verify_len=args.verify_len, **kw)
        print(format_closed_loop(loop))
        out["closed_loop"] = loop
    print(json.dumps(out))
    return 0
