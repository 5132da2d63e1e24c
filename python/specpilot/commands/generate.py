"""`specpilot generate`: AR or speculative decoding of one prompt or a JSONL file; prints the text
(streamed as it is produced for one prompt on a terminal, or with --stream) and per-prompt stats
(tokens, tau, tokens/s); the last line is a JSON summary. Ctrl-C stops cleanly: what was generated is
printed with its stats, the JSON line says "interrupted", and the exit status is 130."""
import json
import sys

from specpilot.engine.cli_support import (add_model_args, apply_run_args, checked_block_size, checked_max_new_tokens,
                                          engine_for, load_pair, prompts_from_args, resolve_model_args)

INTERRUPTED = 130                                   # the shell's status for a Ctrl-C'd command


def configure(parser):
    add_model_args(parser, drafter_required=False)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--prompts", help="JSONL file: {id, prompt} or {id, turns} rows")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of --prompts")
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (exactly the target's own output); above 0: sampled as the target alone samples")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: unseeded)")
    parser.add_argument("--ar", action="store_true", help="target-only decoding (no drafter needed)")
    parser.add_argument("--stream", action="store_true",
                        help="print the text as it is produced (default: on for one prompt on a terminal)")


def run(args) -> int:
    from specpilot.engine.text_stream import TextStream
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights

    if not args.ar and not args.drafter:
        raise ValueError("speculative decoding needs --drafter DIR (or pass --ar)")
    apply_run_args(args)
    resolve_model_args(args)
    weights = resolve_weights(args.target, args.dtype, args.weights)
    target, drafter, tok = load_pair(args.target, None if args.ar else args.drafter, args.device, args.dtype, weights)
    args.block_size = checked_block_size(args.block_size, drafter)
    prompts = prompts_from_args(args, tok)
    checked_max_new_tokens(args.max_new_tokens, prompts, target)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens)
    stop = stop_ids_for(target, tok)
    engine.warmup(args.block_size)                 # CUDA: capture the graphs before timing (no-op on CPU)
    stream = args.stream or (len(prompts) == 1 and sys.stdout.isatty())
    rows = []
    for pid, ids in prompts:
        print(f"=== {pid} ===", flush=True)
        text = TextStream(tok, sys.stdout if stream else None)
        try:
            if args.ar:
                r = engine.generate_ar(ids, args.max_new_tokens, stop, args.temperature, seed=args.seed,
                                       on_tokens=text)
            else:
                r = engine.generate_spec(ids, args.max_new_tokens, stop, args.temperature,
                                         block_size=args.block_size, seed=args.seed, on_tokens=text)
        except KeyboardInterrupt:
            rows.append(_interrupted(pid, ids, text, stream))
            _summary(rows, args, weights, interrupted=True)
            return INTERRUPTED
        text.finish()
        print(text.text if not stream else "")
        tau = f"{r.tau:.2f}" if r.acceptance_lengths else "-"
        print(f"--- {pid}: prompt {r.prompt_len} tokens, {len(r.tokens)} new, tau {tau}, "
              f"{r.tokens_per_s:.1f} tokens/s, prefill {r.prefill_s * 1e3:.1f} ms")
        rows.append({"id": pid, "tokens": len(r.tokens), "tau": r.tau, "tokens_per_s": r.tokens_per_s})
    _summary(rows, args, weights)
    return 0


def _interrupted(pid, ids, text, stream) -> dict:
    """Ctrl-C during a prompt: its text so far and its stats (wall time, prefill included)."""
    text.finish()
    print(text.text if not stream else "")
    n, seconds = len(text.tokens), text.seconds
    rate = n / seconds if seconds > 0 else 0.0
    print(f"--- {pid}: interrupted (Ctrl-C): prompt {len(ids)} tokens, {n} new in {seconds:.2f} s "
          f"({rate:.1f} tokens/s, prefill included)")
    return {"id": pid, "tokens": n, "tau": None, "tokens_per_s": rate}


def _summary(rows, args, weights, interrupted=False) -> None:
    taus = [r["tau"] for r in rows if r["tau"]]
    summary = {"prompts": len(rows), "tokens": sum(r["tokens"] for r in rows), "mode": "ar" if args.ar else "spec",
               "weights": weights, "tau": sum(taus) / len(taus) if taus else None,
               "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows) if rows else 0.0}
    if interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary), flush=True)
