"""`specpilot generate`: AR or speculative decoding of one prompt or a JSONL file; prints the text
(streamed as it is produced for one prompt on a terminal, or with --stream) and per-prompt stats
(tokens, tau, tokens/s); the last line is a JSON summary. Ctrl-C stops cleanly: what was generated is
printed with its stats, the JSON line says "interrupted", and the exit status is 130.
With --concurrency N > 1 the prompts run through the batched engine, N in flight at once (no streaming)."""
import json
import sys

from specpilot.engine.cli_support import (add_mechanism_args, add_model_args, apply_run_args, checked_block_size,
                                          checked_max_new_tokens, engine_for, load_pair, mechanism_options,
                                          prompts_from_args, resolve_model_args)

INTERRUPTED = 130                                   # the shell's status for a Ctrl-C'd command


def configure(parser):
    add_model_args(parser, drafter_required=False)
    add_mechanism_args(parser)
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
    parser.add_argument("--concurrency", type=int, default=1,
                        help="requests in flight at once through the batched engine (1: one prompt at a time)")
    parser.add_argument("--output", default=None, help="JSONL file: one {id, tokens, text} per prompt, input order")


def run(args) -> int:
    from specpilot.config import EngineConfig
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
    config = EngineConfig(**mechanism_options(args))
    stop = stop_ids_for(target, tok)
    if args.concurrency != 1:
        results, engine = _batched(args, target, drafter, prompts, stop, config), None
        for (pid, _), r in zip(prompts, results):
            print(f"=== {pid} ===")
            print(tok.decode(r.tokens, skip_special_tokens=True))
            _stats(pid, r)
    else:
        engine = engine_for(target, drafter, prompts, args.max_new_tokens, config)
        engine.warmup(args.block_size)             # CUDA: capture the graphs before timing (no-op on CPU)
        results = _one_at_a_time(args, engine, prompts, stop, tok, weights)
        if results is None:
            return INTERRUPTED
    rows = [_row(pid, r) for (pid, _), r in zip(prompts, results)]
    if args.output:
        with open(args.output, "w") as f:
            f.writelines(json.dumps({"id": pid, "tokens": r.tokens, "text": tok.decode(r.tokens, skip_special_tokens=True)})
                         + "\n" for (pid, _), r in zip(prompts, results))
    certified = getattr(engine, "certified_head", None)     # the single-request engine's level-1 head
    _summary(rows, args, weights, certified=certified.stats.summary() if certified else None)
    return 0


def _batched(args, target, drafter, prompts, stop, config) -> list:
    from specpilot.engine.batch import BatchConfig
    from specpilot.engine.batch.run import run_batch
    from specpilot.engine.cli_support import batch_options

    if config.two_level != "off" or config.draft_vocab or config.tree_budget:
        raise ValueError("--two-level certified-head, --draft-vocab and --tree-budget run on the single-request "
                         "engine only (--concurrency 1)")
    results, _ = run_batch(target, drafter, [ids for _, ids in prompts], args.max_new_tokens, args.concurrency,
                           stop, args.temperature, args.seed, args.block_size, config=BatchConfig(**batch_options(args)),
                           engine_config=config)
    return results


def _one_at_a_time(args, engine, prompts, stop, tok, weights):
    """The results, each prompt's text streamed or printed as it finishes; None after a Ctrl-C (its
    partial text and stats printed)."""
    from specpilot.engine.text_stream import TextStream

    stream = args.stream or (len(prompts) == 1 and sys.stdout.isatty())
    results, rows = [], []
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
            return None
        text.finish()
        print(text.text if not stream else "")
        _stats(pid, r)
        results.append(r)
        rows.append(_row(pid, r))
    return results


def _stats(pid, r) -> None:
    tau = f"{r.tau:.2f}" if r.acceptance_lengths else "-"
    print(f"--- {pid}: prompt {r.prompt_len} tokens, {len(r.tokens)} new, tau {tau}, "
          f"{r.tokens_per_s:.1f} tokens/s, prefill {r.prefill_s * 1e3:.1f} ms", flush=True)


def _row(pid, r) -> dict:
    return {"id": pid, "tokens": len(r.tokens), "tau": r.tau, "tokens_per_s": r.tokens_per_s}


def _interrupted(pid, ids, text, stream) -> dict:
    """Ctrl-C during a prompt: its text so far and its stats (wall time, prefill included)."""
    text.finish()
    print(text.text if not stream else "")
    n, seconds = len(text.tokens), text.seconds
    rate = n / seconds if seconds > 0 else 0.0
    print(f"--- {pid}: interrupted (Ctrl-C): prompt {len(ids)} tokens, {n} new in {seconds:.2f} s "
          f"({rate:.1f} tokens/s, prefill included)")
    return {"id": pid, "tokens": n, "tau": None, "tokens_per_s": rate}


def _summary(rows, args, weights, interrupted=False, certified=None) -> None:
    taus = [r["tau"] for r in rows if r["tau"]]
    summary = {"prompts": len(rows), "tokens": sum(r["tokens"] for r in rows), "mode": "ar" if args.ar else "spec",
               "weights": weights, "concurrency": args.concurrency, "tau": sum(taus) / len(taus) if taus else None,
               "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows) if rows else 0.0,
               "draft_vocab": args.draft_vocab, "two_level": args.two_level, "tree_budget": args.tree_budget,
               "certified_head": certified}
    if interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary), flush=True)
