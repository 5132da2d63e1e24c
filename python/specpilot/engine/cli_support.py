"""What the generate / verify / demo commands share: common options, loading a pair, prompts."""
from __future__ import annotations

import torch

from specpilot.models.loading import load_pair  # noqa: F401  (the commands load through it)

DEFAULT_VERIFY_PREFIX = 4     # the zoo trace's fewest verified rows among prefixes (docs/two_level.md)


def add_model_args(parser, drafter_required: bool = True):
    parser.add_argument("--target", required=True,
                        help="target model: a folder (HF format) or a Hugging Face id already in the local HF cache")
    parser.add_argument("--drafter", required=drafter_required,
                        help="drafter of any kind (DFlash, DFlash2, DSpark, PARD: detected from config.json): "
                             "a folder or a Hugging Face id already in the local HF cache")
    parser.add_argument("--weights", default=None, choices=["bf16", "split12"],
                        help="our engine's target weights, which the drafter's follow (default: as stored; split12 "
                             "packs a bf16 folder at load, bf16 unpacks a split12 folder)")
    add_run_args(parser)


def add_mechanism_args(parser):
    """The two-level mechanisms (EngineConfig.two_level / draft_vocab / draft_vocab_ranking; off by
    default: docs/two_level.md says where each wins)."""
    parser.add_argument("--two-level", default="off", choices=("off", "certified-head", "prefix-first"),
                        help="two-level verification (default off; certified-head: greedy only, a torch "
                             "reference; prefix-first: the batched engine's two verify passes, --concurrency > 1)")
    parser.add_argument("--verify-prefix", type=int, default=None, metavar="P",
                        help=f"with --two-level prefix-first: the rows of the first verify pass (anchor + P-1 "
                             f"drafts), below the block size (default {DEFAULT_VERIFY_PREFIX})")
    parser.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                        help="the drafter's LM head over the N most frequent tokens (0: full)")
    parser.add_argument("--draft-vocab-ranking", default=None, metavar="FILE",
                        help="token ranking for --draft-vocab (default: DRAFTER/token_ranking.json; "
                             "`specpilot draft-vocab` writes it)")
    parser.add_argument("--tree-budget", type=int, default=0, metavar="N",
                        help="tree verification: verify a draft tree of N nodes per step (single-request engine; "
                             "docs/trees.md); 0: chain verification (default)")


def mechanism_options(args) -> dict:
    """EngineConfig keyword arguments from add_mechanism_args' options (prefix-first is the batched
    engine's: batch_options carries it, and EngineConfig refuses it on the single-request engine)."""
    _check_verify_prefix(args)
    two_level = args.two_level
    if two_level == "prefix-first" and _batched(args):
        two_level = "off"
    return {"two_level": two_level, "draft_vocab": args.draft_vocab,
            "draft_vocab_ranking": args.draft_vocab_ranking, "tree_budget": args.tree_budget}


def batch_options(args) -> dict:
    """BatchConfig keyword arguments from add_mechanism_args' options (the batched engine's runs)."""
    _check_verify_prefix(args)
    if args.two_level != "prefix-first":
        return {}
    prefix = DEFAULT_VERIFY_PREFIX if args.verify_prefix is None else args.verify_prefix
    if prefix < 1:
        raise ValueError(f"--verify-prefix {prefix} must be >= 1 (the rows of the first verify pass)")
    return {"verify_prefix": prefix}


def _check_verify_prefix(args) -> None:
    if getattr(args, "verify_prefix", None) is not None and args.two_level != "prefix-first":
        raise ValueError("--verify-prefix sets the first pass of --two-level prefix-first: pass that too")


def _batched(args) -> bool:
    """Whether the command runs the batched engine (generate / verify --concurrency N > 1; bench
    --concurrency LEVELS)."""
    concurrency = getattr(args, "concurrency", None)
    return concurrency is not None and concurrency != 1


def add_run_args(parser):
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="new tokens per prompt (prompt + new tokens must fit the model's positions)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp32"],
                        help="default: fp32 on the CPU (exact, and faster there than bf16), bf16 on CUDA")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (1 is fastest for small models and robust on a busy machine)")


def apply_run_args(args) -> None:
    """The run options' defaults that depend on each other: --dtype from --device, --threads."""
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
    if args.threads < 1:
        raise ValueError(f"--threads {args.threads} must be >= 1")
    torch.set_num_threads(args.threads)


def resolve_model_args(args) -> None:
    """args.target / args.drafter as local folders (a Hugging Face id becomes its cached snapshot)."""
    from specpilot.models.model_paths import resolve_model_dir

    args.target = resolve_model_dir(args.target, "--target")
    if getattr(args, "drafter", None):
        args.drafter = resolve_model_dir(args.drafter, "--drafter")


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


def checked_max_new_tokens(max_new_tokens, prompts, target) -> int:
    """--max-new-tokens, refused when it is < 1 or when the longest prompt plus it passes the model's
    max_position_embeddings (positions past it were never trained: the text would be noise)."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens} must be >= 1")
    positions = target.config.max_position_embeddings
    pid, ids = max(prompts, key=lambda p: len(p[1]))
    if len(ids) + max_new_tokens > positions:
        room = positions - len(ids)
        advice = f"use --max-new-tokens {room} or less" if room >= 1 else "shorten the prompt"
        raise ValueError(f"--max-new-tokens {max_new_tokens}: prompt {pid!r} has {len(ids)} tokens and the model has "
                         f"{positions} positions (max_position_embeddings); {advice}")
    return max_new_tokens


def engine_for(target, drafter, prompts, max_new_tokens, config=None):
    """An Engine whose caches fit the longest prompt + max_new_tokens and a whole draft block past it (so
    the last step stays graphed), rounded up to 256, with `config` (an EngineConfig; None: the defaults)."""
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine

    need = max(len(ids) for _, ids in prompts) + max_new_tokens + 1 + (config.tree_budget if config else 0) \
        + (drafter.block_size if drafter is not None else 0)
    engine = Engine(target, drafter, max_seq_len=max(256, -(-need // 256) * 256), config=config or EngineConfig())
    if engine.eager_reason:
        import sys
        print(f"specpilot: {engine.eager_reason}", file=sys.stderr)
    return engine
