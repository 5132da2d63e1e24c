"""`specpilot draft-vocab`: rank the target's tokens by frequency for a reduced draft head
(EngineConfig.draft_vocab, models/draft_vocab.py). Counts the tokens of prompt files and, with
--greedy-tokens N, of the target's own greedy continuations (our engine, AR). Writes the ranking JSON
(default: token_ranking.json in the drafter's folder, where the engine looks for it); the last line
is a JSON summary with the share of counted tokens the top N cover."""
import json
from pathlib import Path

import torch

from specpilot.engine.cli_support import add_run_args

COVERAGE_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def configure(parser):
    parser.add_argument("--target", required=True, help="target model folder (tokenizer, vocab size, greedy outputs)")
    parser.add_argument("--prompts", required=True, action="append", help="JSONL prompt file (repeatable)")
    parser.add_argument("--skip", type=int, default=0,
                        help="skip the first N prompts of each file (keep them held out for measuring tau)")
    parser.add_argument("--limit", type=int, default=None, help="at most N prompts of each file (after --skip)")
    parser.add_argument("--greedy-tokens", type=int, default=0,
                        help="also count N tokens of the target's greedy continuation of each prompt (0: prompts only)")
    parser.add_argument("--out", default=None, help="ranking JSON (default: DRAFTER/token_ranking.json)")
    parser.add_argument("--drafter", default=None, help="drafter folder: where the ranking goes without --out")
    add_run_args(parser)


def count_tokens(sequences, vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: how often each id occurs in `sequences` (lists of ids)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ids in sequences:
        t = torch.tensor(list(ids), dtype=torch.int64)
        if t.numel() and (t.min() < 0 or t.max() >= vocab_size):
            raise ValueError(f"token id outside the vocabulary of {vocab_size}: {int(t.max())}")
        counts += torch.bincount(t, minlength=vocab_size)
    return counts


def coverage(counts: torch.Tensor, ranking) -> dict:
    """Share of the counted tokens the first N ranked ids cover, for the sizes below the vocabulary."""
    total = max(1, int(counts.sum()))
    ranked = counts[torch.tensor(ranking.ids)].cumsum(0)
    return {n: round(int(ranked[n - 1]) / total, 4) for n in COVERAGE_SIZES if n < counts.numel()}


def run(args) -> int:
    from specpilot.models.draft_vocab import RANKING_FILE, TokenRanking
    from specpilot.models.loading import load_target, load_tokenizer
    from specpilot.models.prompts import encode_prompt, read_prompts

    if args.out is None and args.drafter is None:
        raise ValueError("give --out FILE or --drafter DIR (the ranking goes to DIR/token_ranking.json)")
    if args.skip < 0 or args.greedy_tokens < 0:
        raise ValueError("--skip and --greedy-tokens must be >= 0")
    out = Path(args.out) if args.out else Path(args.drafter) / RANKING_FILE
    tok = load_tokenizer(args.target)
    prompts = []
    for path in args.prompts:
        rows = read_prompts(path)[args.skip:]
        prompts += [encode_prompt(tok, r) for r in rows[:args.limit]]
    prompts = [p for p in prompts if p]
    if not prompts:
        raise ValueError(f"no prompts left after --skip {args.skip}")
    target = load_target(args.target, device=args.device, dtype=torch.float32 if args.dtype == "fp32" else torch.bfloat16)
    sequences = list(prompts)
    if args.greedy_tokens:
        from specpilot.engine.cli_support import engine_for
        from specpilot.models import stop_ids_for

        engine = engine_for(target, None, [(None, p) for p in prompts], args.greedy_tokens)
        stop = stop_ids_for(target, tok)
        sequences += [engine.generate_ar(p, args.greedy_tokens, stop).tokens for p in prompts]
    counts = count_tokens(sequences, target.config.vocab_size)
    source = (f"{', '.join(Path(p).name for p in args.prompts)} (skip {args.skip}, limit {args.limit}): "
              f"{len(prompts)} prompts" + (f" + {args.greedy_tokens} greedy tokens each" if args.greedy_tokens else ""))
    ranking = TokenRanking.from_counts(counts, source)
    ranking.save(out)
    summary = {"out": str(out), "source": source, "tokens_counted": int(counts.sum()),
               "distinct": int((counts > 0).sum()), "vocab_size": ranking.vocab_size,
               "coverage": coverage(counts, ranking)}
    print(f"wrote {out}: {summary['tokens_counted']} tokens counted, {summary['distinct']} distinct ids of "
          f"{summary['vocab_size']}")
    print(json.dumps(summary))
    return 0
