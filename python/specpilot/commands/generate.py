"""`specpilot generate`: AR or speculative decoding of one prompt or a JSONL file; prints the text
and per-prompt stats (tokens, tau, tokens/s); the last line is a JSON summary."""
import json

from specpilot.engine.cli_support import (add_mechanism_args, add_model_args, checked_block_size, engine_for,
                                          load_pair, mechanism_options, prompts_from_args)


def configure(parser):
    add_model_args(parser, drafter_required=False)
    add_mechanism_args(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--prompts", help="JSONL file: {id, prompt} or {id, turns} rows")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of --prompts")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ar", action="store_true", help="target-only decoding (no drafter needed)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="requests in flight at once through the batched engine (1: one prompt at a time)")
    parser.add_argument("--output", default=None, help="JSONL file: one {id, tokens, text} per prompt, input order")


def run(args) -> int:
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights

    if not args.ar and not args.drafter:
        raise ValueError("speculative decoding needs --drafter DIR (or pass --ar)")
    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, None if args.ar else args.drafter, args.device, args.dtype, weights)
    args.block_size = checked_block_size(args.block_size, drafter)
    prompts = prompts_from_args(args, tok)
    stop = stop_ids_for(target, tok)
    results, engine = generated(args, target, drafter, prompts, stop)
    rows, out_rows = [], []
    for (pid, ids), r in zip(prompts, results):
        print(f"=== {pid} ===")
        print(tok.decode(r.tokens, skip_special_tokens=True))
        tau = f"{r.tau:.2f}" if r.acceptance_lengths else "-"
        print(f"--- {pid}: prompt {r.prompt_len} tokens, {len(r.tokens)} new, tau {tau}, "
              f"{r.tokens_per_s:.1f} tokens/s, prefill {r.prefill_s * 1e3:.1f} ms")
        rows.append({"id": pid, "tokens": len(r.tokens), "tau": r.tau, "tokens_per_s": r.tokens_per_s})
        out_rows.append({"id": pid, "tokens": r.tokens, "text": tok.decode(r.tokens, skip_special_tokens=True)})
    if args.output:
        with open(args.output, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in out_rows)
    total_tokens = sum(r["tokens"] for r in rows)
    certified = getattr(engine, "certified_head", None)     # the single-request engine's level-1 head
    taus = [r["tau"] for r in rows if r["tau"]]
    print(json.dumps({"prompts": len(rows), "tokens": total_tokens, "mode": "ar" if args.ar else "spec", "weights": weights,
                      "concurrency": args.concurrency,
                      "tau": sum(taus) / len(taus) if taus else None,
                      "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows),
                      "draft_vocab": args.draft_vocab, "two_level": args.two_level, "tree_budget": args.tree_budget,
                      "certified_head": certified.stats.summary() if certified else None}))
    return 0


def generated(args, target, drafter, prompts, stop) -> tuple:
    """(one result per prompt, the engine): one at a time through the Engine (--concurrency 1), else batched."""
    from specpilot.config import EngineConfig

    config = EngineConfig(**mechanism_options(args))
    if args.concurrency != 1:
        from specpilot.engine.batch.run import run_batch

        if config.two_level != "off" or config.draft_vocab or config.tree_budget:
            raise ValueError("--two-level, --draft-vocab and --tree-budget run on the single-request engine only "
                             "(--concurrency 1)")
        return run_batch(target, drafter, [ids for _, ids in prompts], args.max_new_tokens, args.concurrency,
                         stop, args.temperature, args.seed, args.block_size, engine_config=config)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens, config)
    engine.warmup(args.block_size)                 # CUDA: capture the graphs before timing (no-op on CPU)
    if args.ar:
        return [engine.generate_ar(ids, args.max_new_tokens, stop, args.temperature, seed=args.seed)
                for _, ids in prompts], engine
    return [engine.generate_spec(ids, args.max_new_tokens, stop, args.temperature, block_size=args.block_size,
                                 seed=args.seed) for _, ids in prompts], engine
