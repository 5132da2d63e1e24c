"""What the generate / verify / demo commands share: common options, loading a pair, prompts."""
from __future__ import annotations

import torch

from specpilot.models.loading import load_pair  # noqa: F401  (the commands load through it)


def add_model_args(parser, drafter_required: bool = True):
    parser.add_argument("--target", required=True, help="target model folder (HF format)")
    parser.add_argument("--drafter", required=drafter_required, help="DFlash drafter folder")
    parser.add_argument("--weights", default=None, choices=["bf16", "split12"],
                        help="our engine's target weights, which the drafter's follow (default: as stored; split12 "
                             "packs a bf16 folder at load, bf16 unpacks a split12 folder)")
    add_run_args(parser)


def add_mechanism_args(parser):
    """The two-level mechanisms (EngineConfig.two_level / draft_vocab / draft_vocab_ranking; off by
    default: docs/two_level.md says where each wins)."""
    parser.add_argument("--two-level", default="off", choices=("off", "certified-head", "prefix-first"),
                        help="two-level verification (default off; certified-head: greedy only, a torch "
                             "reference; prefix-first: not built yet)")
    parser.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                        help="the drafter's LM head over the N most frequent tokens (0: full)")
    parser.add_argument("--draft-vocab-ranking", default=None, metavar="FILE",
                        help="token ranking for --draft-vocab (default: DRAFTER/token_ranking.json; "
                             "`specpilot draft-vocab` writes it)")
    parser.add_argument("--tree-budget", type=int, default=0, metavar="N",
                        help="tree verification: verify a draft tree of N nodes per step (single-request engine; "
                             "docs/trees.md); 0: chain verification (default)")


def mechanism_options(args) -> dict:
    """EngineConfig keyword arguments from add_mechanism_args' options."""
    return {"two_level": args.two_level, "draft_vocab": args.draft_vocab,
            "draft_vocab_ranking": args.draft_vocab_ranking, "tree_budget": args.tree_budget}


def add_run_args(parser):
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])


def prompts_from_args(args, tokenizer):
    """[(id, token ids)] from --prompt TEXT or --prompts FILE.jsonl (--limit N)."""
    from specpilot.models.prompts import Prompt, encode_prompt, read_prompts

    text = getattr(args, "prompt", None)
    path = getattr(args, "prompts", None)
    if (text is None) == (path is None):
        raise ValueError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    rows = [Prompt(id="prompt", text=text)] if text is not None else read_prompts(path, getattr(args, "limit", None))
    out = [(row.id, encode_prompt(tokenizer, row)) for row in rows]
    empty = [pid for pid, ids in out if not ids]
    if empty:
        raise ValueError(f"prompt(s) {empty[:5]} encode to zero tokens")
    return out


def checked_block_size(block_size, drafter):
    """--block-size, refused above the block the drafter was trained to draft (the engine itself runs
    any block exactly, as stock does, but past its training the drafter only guesses)."""
    if block_size is None or drafter is None:
        return block_size
    if not 1 <= block_size <= drafter.block_size:
        raise ValueError(f"--block-size {block_size}: the drafter was trained for blocks of {drafter.block_size}; "
                         f"use 1..{drafter.block_size}")
    return block_size


def engine_for(target, drafter, prompts, max_new_tokens, config=None):
    """An Engine whose caches fit the longest prompt + max_new_tokens (rounded up to 256), with
    `config` (an EngineConfig; None: the defaults)."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine

    need = max(len(ids) for _, ids in prompts) + max_new_tokens + 1 + (config.tree_budget if config else 0)
    engine = Engine(target, drafter, max_seq_len=max(256, -(-need // 256) * 256), config=config or EngineConfig())
    if engine.eager_reason:
        import sys
        print(f"specpilot: {engine.eager_reason}", file=sys.stderr)
    return engine
