"""`specpilot demo`: speculative decoding of a few prompts with the zoo pair ($SPECPILOT_ZOO), printing
the text, acceptance length, tokens/s (ours, speculative and AR) and the token-forcing verdict against
stock dflash. Without the zoo pair: a tiny random pair built on the fly (said clearly)."""
import json
import tempfile
import time

import torch

PROMPT_TOKENS = 160
DEMO_PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n    def __init__(self):\n"]


def configure(parser):
    parser.add_argument("--prompts", type=int, default=3, help="how many prompts (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: fastest for this small model, and robust on a busy machine)")
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp32"],
                        help="default: fp32 on the CPU (exact forcing), bf16 on CUDA")


def _pair_and_prompts(count):
    from specpilot import settings
    from specpilot.models.prompts import read_prompts

    zoo = settings.zoo_pair()
    if zoo is not None:
        rows = read_prompts(zoo[0].parent / "prompts" / "pystdlib.jsonl", limit=count)
        return zoo, [(r.id, r.text) for r in rows], f"the zoo pair at {zoo[0].parent.resolve()}"
    from specpilot.models.random_ckpt import write_pair

    folder = tempfile.mkdtemp(prefix="specpilot-demo-")
    pair = write_pair(folder, "tiny-qwen3", drafter_layers=2, block_size=8, layer_ids=[0, 2], seed=0)
    texts = [(f"demo/{i}", DEMO_PROMPTS[i % len(DEMO_PROMPTS)]) for i in range(count)]
    note = (f"NO ZOO PAIR FOUND (set SPECPILOT_ZOO); using a tiny RANDOM-WEIGHT pair built in {folder}: "
            "its text is noise and its acceptance ~1, but the engine and the check against stock are real")
    return pair, texts, note


def run(args) -> int:
    from specpilot.engine.cli_support import engine_for, load_pair
    from specpilot.models import stop_ids_for
    from specpilot.models.prompts import Prompt, encode_prompt
    from specpilot.verify.forcing import token_force
    from specpilot.verify.stock import load_stock

    t0 = time.perf_counter()
    if args.device == "cpu":
        torch.set_num_threads(max(1, args.threads))
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    (tdir, ddir), texts, note = _pair_and_prompts(args.prompts)
    print(f"specpilot demo: {note}; {args.device}, {dtype}, {args.max_new_tokens} new tokens per prompt")
    target, drafter, tok = load_pair(tdir, ddir, args.device, dtype)
    # The last PROMPT_TOKENS tokens of each prompt: a short prefill keeps the CPU demo quick.
    prompts = [(pid, encode_prompt(tok, Prompt(id=pid, text=text))[-PROMPT_TOKENS:]) for pid, text in texts]
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
        print(tok.decode(ids[-40:]) + "\033[1m" + tok.decode(spec.tokens) + "\033[0m")
        speedup = spec.tokens_per_s / ar.tokens_per_s if ar.tokens_per_s else 0.0
        print(f"--- {len(spec.tokens)} tokens, acceptance length (tau) {spec.tau:.2f}, speculative "
              f"{spec.tokens_per_s:.0f} tokens/s vs AR {ar.tokens_per_s:.0f} tokens/s ({speedup:.2f}x); "
              f"same tokens as AR: {spec.tokens == ar.tokens}")
    if args.device == "cpu":
        print("\n(note: a CPU is compute-bound, so verifying a 16-token block costs ~16 tokens of work and "
              "speculation rarely pays here; on a GPU a decode step is memory-bound and the block is ~free)")
    print("\ntoken forcing against stock dflash_generate (HF transformers):")
    stock = load_stock(tdir, ddir, args.device, dtype)
    report = token_force(engine, stock, [ids for _, ids in prompts], args.max_new_tokens, stop_ids=stop,
                         ids=[pid for pid, _ in prompts], spec_results=results, ar_results=ar_results)
    from specpilot.commands.verify import print_report

    print(f"({time.perf_counter() - t0:.1f} s)")
    print_report(report)
    print(json.dumps(report.summary()))
    return 0 if report.passed else 1
