"""`specpilot cost`: the gap table of a deployment; the last line is one JSON object."""
import json

import torch


def configure(parser):
    parser.add_argument("--target", required=True, help="target checkpoint folder (config.json)")
    parser.add_argument("--drafter", default=None, help="drafter checkpoint folder (adds draft/verify steps)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--tau", type=float, default=None, help="mean tokens per verify step (default 4.3, stated)")
    parser.add_argument("--context", type=int, default=1024, help="KV length attention reads")
    parser.add_argument("--weights", choices=("split12", "bf16"), default="split12")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--quick", action="store_true", help="smaller ceiling probes (CPU)")
    parser.add_argument("--limit", type=int, default=30, help="rows to print")
    parser.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                        help="the draft LM head over N tokens (EngineConfig.draft_vocab; state the tau measured with it)")
    parser.add_argument("--two-level", choices=("off", "certified-head"), default="off",
                        help="certified-head: the verify LM head as level 1 + the exact head at --fallback-rate")
    parser.add_argument("--certified-rank", type=int, default=None, help="level 1's rank (default hidden / 8)")
    parser.add_argument("--fallback-rate", type=float, default=1.0,
                        help="share of verify steps that need the exact LM head (bench/certified_head_rate.py)")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="also draw each step's components, timed alone and at their ceilings")
    from specpilot.cost import batched_cli

    batched_cli.add_arguments(parser)


def run(args) -> int:
    from specpilot.cost import cost_report, format_table

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is visible")
    from specpilot.cost import batched_cli

    if args.concurrency is not None:
        return batched_cli.run(args)
    batched_cli.refuse_without_concurrency(args)
    if args.draft_vocab < 0 or not 0.0 <= args.fallback_rate <= 1.0:
        raise ValueError("--draft-vocab must be >= 0 and --fallback-rate in [0, 1]")
    certified = None
    if args.two_level == "certified-head":
        from specpilot.cost.shapes import ModelShape

        hidden = ModelShape.from_dir(args.target).hidden
        certified = (hidden // 8 if args.certified_rank is None else args.certified_rank, args.fallback_rate)
    report = cost_report(args.target, args.drafter, batch=args.batch, block_size=args.block_size, tau=args.tau,
                         context=args.context, device=args.device, weights=args.weights, quick=args.quick,
                         draft_vocab=args.draft_vocab, certified=certified)
    print(format_table(report, args.limit))
    if args.plot:
        from specpilot.cost.plot import plot_steps

        print(f"# plot: {plot_steps(report.to_dict(), args.plot)}")
    print(json.dumps(report.to_dict()))
    return 0
