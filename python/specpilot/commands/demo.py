"""`specpilot demo`: speculative decoding of a few held-out prompts, printing the text, acceptance length,
tokens/s (ours, speculative and AR) and the token-forcing verdict against stock dflash. The pair: the zoo
pair ($SPECPILOT_ZOO, default ../shared/zoo) when it is there, else the small trained pair shipped inside
the package. A SPECPILOT_ZOO that holds no pair is an error, not a silent fallback."""
import json
import time

import torch

PROMPT_TOKENS = 160


def configure(parser):
    parser.add_argument("--prompts", type=int, default=3, help="how many prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (1: fastest for these small models, and robust on a busy machine)")
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp32"],
                        help="default: fp32 on the CPU (exact forcing), bf16 on CUDA")


def pair_and_prompts(count):
    """((target_dir, drafter_dir), [(id, text)], a sentence saying which pair and where it looked)."""
    import os

    from specpilot import settings
    from specpilot.models.prompts import read_prompts

    zoo_dir = settings.get().zoo
    zoo = settings.zoo_pair()
    if zoo is not None:
        rows = read_prompts(zoo[0].parent / "prompts" / "pystdlib.jsonl", limit=count)
        return zoo, [(r.id, r.text) for r in rows], f"the zoo pair at {zoo[0].parent.resolve()}"
    if settings.zoo_is_explicit():
        raise FileNotFoundError(f"SPECPILOT_ZOO={os.environ['SPECPILOT_ZOO']}: no zoo pair there (looked for "
                                f"{zoo_dir.resolve()}/code-tiny and code-tiny-dflash-b16, each with config.json); "
                                "fix the path, or unset SPECPILOT_ZOO to use the pair shipped with specpilot")
    pair = settings.embedded_pair()
    rows = read_prompts(settings.EMBEDDED_PAIR / "prompts.jsonl", limit=count)
    note = (f"no zoo pair at {zoo_dir.resolve()} (set SPECPILOT_ZOO for one); using the small trained pair "
            f"shipped with specpilot, {settings.EMBEDDED_PAIR}")
    return pair, [(r.id, r.text) for r in rows], note


def run(args) -> int:
    from specpilot.engine.cli_support import checked_max_new_tokens, engine_for, load_pair
    from specpilot.models import stop_ids_for
    from specpilot.models.prompts import Prompt, encode_prompt
    from specpilot.progress import bold
    from specpilot.verify.forcing import token_force
    from specpilot.verify.stock import load_stock

    t0 = time.perf_counter()
    if args.threads < 1:
        raise ValueError(f"--threads {args.threads} must be >= 1")
    torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    (tdir, ddir), texts, note = pair_and_prompts(args.prompts)
    print(f"specpilot demo: {note}; {args.device}, {dtype}, {args.max_new_tokens} new tokens per prompt", flush=True)
    target, drafter, tok = load_pair(tdir, ddir, args.device, dtype)
    # The last PROMPT_TOKENS tokens of each prompt: a short prefill keeps the CPU demo quick.
    prompts = [(pid, encode_prompt(tok, Prompt(id=pid, text=text))[-PROMPT_TOKENS:]) for pid, text in texts]
    checked_max_new_tokens(args.max_new_tokens, prompts, target)
    engine = engine_for(target, drafter, prompts, args.max_new_tokens)
    stop = stop_ids_for(target, tok)
    engine.warmup()                              # CUDA: capture every graph up front (no-op on CPU)
    results, ar_results = [], []
    for pid, ids in prompts:
        spec = engine.generate_spec(ids, args.max_new_tokens, stop)
        results.append(spec)
        ar = engine.generate_ar(ids, args.max_new_tokens, stop)
        ar_results.append(ar)
        print(f"\n=== {pid} ({len(ids)} prompt tokens) ===")
        print(tok.decode(ids[-40:]) + bold(tok.decode(spec.tokens, skip_special_tokens=True)))
        speedup = spec.tokens_per_s / ar.tokens_per_s if ar.tokens_per_s else 0.0
        print(f"--- {len(spec.tokens)} tokens, acceptance length (tau) {spec.tau:.2f}, speculative "
              f"{spec.tokens_per_s:.0f} tokens/s vs AR {ar.tokens_per_s:.0f} tokens/s ({speedup:.2f}x); "
              f"same tokens as AR: {spec.tokens == ar.tokens}", flush=True)
    if args.device == "cpu":
        print("\n(note: a CPU is compute-bound, so verifying a 16-token block costs ~16 tokens of work and "
              "speculation rarely pays here; on a GPU a decode step is memory-bound and the block is ~free)")
    print("\ntoken forcing against stock dflash_generate (HF transformers):", flush=True)
    stock = load_stock(tdir, ddir, args.device, dtype)
    report = token_force(engine, stock, [ids for _, ids in prompts], args.max_new_tokens, stop_ids=stop,
                         ids=[pid for pid, _ in prompts], spec_results=results, ar_results=ar_results)
    from specpilot.commands.verify import print_report

    print(f"({time.perf_counter() - t0:.1f} s)")
    print_report(report)
    print(json.dumps(report.summary()))
    return 0 if report.passed else 1
