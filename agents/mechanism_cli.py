"""`specpilot optimize --list-mechanisms` and `specpilot optimize --search mechanisms`: the options and
the run of the mechanism search (agents/mechanism_search.py) behind the optimize command."""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    g = parser.add_argument_group("mechanism search (--search mechanisms)")
    g.add_argument("--list-mechanisms", action="store_true",
                   help="print every mechanism and knob the loop can search, one per line with its values, and exit")
    g.add_argument("--search", choices=("kernels", "mechanisms"), default="kernels",
                   help="kernels: the kernel / block-size loop (default); mechanisms: search engine mechanisms")
    g.add_argument("--evaluator", choices=("cost-model", "engine"), default="engine",
                   help="cost-model: estimates on stated ceilings (no checkpoint, nothing forced); engine: the "
                        "real engine on --target / --drafter, every candidate token-forced")
    g.add_argument("--target-shape", default=None, help="the deployment's target shape (default: the --target "
                                                        "folder's name; cost-model: a random_ckpt preset, e.g. qwen3-8b)")
    g.add_argument("--drafter-kind", default=None, help="default: the --drafter folders' names joined by '+', or none")
    g.add_argument("--card", default=None, help="H100 | H200 | cpu (default: this machine's)")
    g.add_argument("--concurrency", type=int, default=1)
    g.add_argument("--weights", choices=("bf16", "split12"), default=None,
                   help="the format the deployment stores (default: split12 on CUDA, bf16 on the CPU)")
    g.add_argument("--budget", type=int, default=40, help="evaluations, the start included")
    g.add_argument("--start", choices=("detuned", "default"), default="detuned",
                   help="detuned: every switch off, the plainest kernels; default: the shipped configuration")
    g.add_argument("--cold", action="store_true", help="do not start from the nearest deployment in memory")
    g.add_argument("--min-gain", type=float, default=0.02, help="a candidate must be this much faster to win")
    g.add_argument("--prompts", type=int, default=3, help="engine evaluator: zoo HumanEval prompts, or random "
                                                          "token prompts where the target has no tokenizer")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--prompt-tokens", type=float, default=0.0, metavar="P",
                   help="cost-model evaluator, concurrency > 1: mean prompt tokens a request; the estimate is then a "
                        "closed loop of P prompt + --max-new-tokens new tokens a request whose prompt chunks ride in "
                        "the steps; 0: decode steps only")
    g.add_argument("--repeats", type=int, default=2, help="engine evaluator: timings per candidate (best kept)")
    g.add_argument("--replay", type=float, default=None, metavar="TAU",
                   help="engine evaluator: time with this tau replayed (random-weight scale tier); the gate "
                        "judges a run without replay")


def card_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0)
    return next((c for c in ("H200", "H100") if c in name), name.replace("|", "/").replace(" ", "-"))


def drafters(option: str) -> list:
    """--drafter's comma list of drafter folders (one, or the candidates run.drafter chooses among)."""
    dirs = [d.strip() for d in option.split(",") if d.strip()]
    if not dirs:
        raise ValueError(f"--drafter {option!r} names no drafter folder")
    return dirs


def _prompts(target_dir, n: int, seed: int) -> list:
    from specpilot.agents.forcing import _prompts as zoo_prompts

    try:
        return zoo_prompts(target_dir, n)
    except (FileNotFoundError, OSError, ValueError):   # a random checkpoint: no tokenizer, random ids
        import torch

        from specpilot.cost.shapes import ModelShape

        vocab = ModelShape.from_dir(target_dir).vocab
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(0, vocab - 2, (32,), generator=g).tolist() for _ in range(n)]


def run(args, device: str) -> int:
    from pathlib import Path

    from specpilot import settings
    from specpilot.agents.deployment import Deployment
    from specpilot.agents.memory import Memory
    from specpilot.agents.mechanism_search import search_mechanisms

    if args.evaluator == "cost-model":
        from specpilot.agents.cost_evaluator import CostModelEvaluator

        evaluator = CostModelEvaluator(workload=(args.prompt_tokens, args.max_new_tokens) if args.prompt_tokens else None)
        card = args.card or "H100"
        shape = args.target_shape or (Path(args.target).name if args.target else None)
    else:
        import torch

        from specpilot.agents.engine_evaluator import EngineEvaluator

        if not args.target or not args.drafter:
            raise ValueError("--evaluator engine needs --target and --drafter checkpoint folders")
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        evaluator = EngineEvaluator(args.target, drafters(args.drafter), _prompts(args.target, args.prompts, args.seed),
                                    args.max_new_tokens, device=device, dtype=dtype, repeats=args.repeats,
                                    replay_tau=args.replay)
        card = args.card or card_name(device)
        shape = args.target_shape or Path(args.target).resolve().name
    if not shape:
        raise ValueError("--search mechanisms needs --target-shape (cost model) or --target")
    drafter = args.drafter_kind or ("+".join(Path(d).resolve().name for d in drafters(args.drafter))
                                    if args.drafter else "none")
    weights = args.weights or ("split12" if device == "cuda" or args.evaluator == "cost-model" else "bf16")
    dep = Deployment(shape, drafter, card, args.concurrency, weights)
    memory = Memory(args.memory or settings.get().memory_url)
    start = {} if args.start == "default" else None     # {}: every mechanism at its shipped value
    result = search_mechanisms(dep, evaluator, memory, budget=args.budget, start=start, from_memory=not args.cold,
                               min_gain=args.min_gain, compare_shipped=True, time_budget_s=args.time_budget, log=lambda m: print(m, flush=True))
    memory.close()
    print(json.dumps(result.to_dict(), default=str))
    return 0
