"""`specpilot generate`: AR or speculative decoding of one prompt or a JSONL file; prints the text
and per-prompt stats (tokens, tau, tokens/s); the last line is a JSON summary."""
import json

from specpilot.engine.cli_support import (add_model_args, checked_block_size, engine_for, load_pair, prompts_from_args,
                                          resolve_model_args)


def configure(parser):
    add_model_args(parser, drafter_required=False)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--prompts", help="JSONL file: {id, prompt} or {id, turns} rows")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of --prompts")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ar", action="store_true", help="target-only decoding (no drafter needed)")


def run(args) -> int:
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights

    if not args.ar and not args.drafter:
        raise ValueError("speculative decoding needs --drafter DIR (or pass --ar)")
    resolve_model_args(args)
    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, None if args.ar else args.drafter, args.device, args.dtype, weights)
    args.block_size = checked_block_size(args.block_size, drafter)
    prompts = prompts_from_args(args, tok)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens)
    stop = stop_ids_for(target, tok)
    engine.warmup(args.block_size)                 # CUDA: capture the graphs before timing (no-op on CPU)
    rows = []
    for pid, ids in prompts:
        if args.ar:
            r = engine.generate_ar(ids, args.max_new_tokens, stop, args.temperature, seed=args.seed)
        else:
            r = engine.generate_spec(ids, args.max_new_tokens, stop, args.temperature,
                                     block_size=args.block_size, seed=args.seed)
        print(f"=== {pid} ===")
        print(tok.decode(r.tokens, skip_special_tokens=True))
        tau = f"{r.tau:.2f}" if r.acceptance_lengths else "-"
        print(f"--- {pid}: prompt {r.prompt_len} tokens, {len(r.tokens)} new, tau {tau}, "
              f"{r.tokens_per_s:.1f} tokens/s, prefill {r.prefill_s * 1e3:.1f} ms")
        rows.append({"id": pid, "tokens": len(r.tokens), "tau": r.tau, "tokens_per_s": r.tokens_per_s})
    total_tokens = sum(r["tokens"] for r in rows)
    taus = [r["tau"] for r in rows if r["tau"]]
    print(json.dumps({"prompts": len(rows), "tokens": total_tokens, "mode": "ar" if args.ar else "spec", "weights": weights,
                      "tau": sum(taus) / len(taus) if taus else None,
                      "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows)}))
    return 0
