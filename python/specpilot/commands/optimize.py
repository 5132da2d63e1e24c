"""`specpilot optimize`: the agent loop (see agents/loop.py); the last line is one JSON object."""
import json

import torch

from specpilot import settings


def configure(parser):
    parser.add_argument("--target", default=None, help="target checkpoint folder (config.json); required but "
                        "for --list-mechanisms and --search mechanisms --evaluator cost-model")
    parser.add_argument("--drafter", default=None,
                        help="the drafter folder (--search mechanisms: a comma list of drafters that fit the "
                             "target, among which run.drafter chooses)")
    parser.add_argument("--op", action="append", choices=("split12_gemv", "engine.block_size"),
                        help="ops the agents may act on (repeatable; default both)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--agents", type=int, default=2, help="proposers per round, run in parallel")
    parser.add_argument("--per-agent", type=int, default=3, help="candidates per proposer per round")
    parser.add_argument("--memory", default=None, help="SQLite path or sqlite:/// URL (default: settings)")
    parser.add_argument("--llm-base-url", default=None, help="OpenAI-compatible endpoint (default: settings)")
    parser.add_argument("--llm-model", default=None)
    parser.add_argument("--llm-token-budget", type=int, default=200_000, help="tokens for the whole run")
    parser.add_argument("--llm-usd-per-mtok", type=float, default=None, help="price, to enforce --llm-usd-budget")
    parser.add_argument("--llm-usd-budget", type=float, default=None)
    parser.add_argument("--llm-token-param", choices=("max_tokens", "max_completion_tokens"), default="max_tokens",
                        help="the reply cap's name; models that reject max_tokens are switched automatically")
    parser.add_argument("--resume", action="store_true", help="continue the deployment's unfinished run")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; no new round after it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--timer", choices=("auto", "cpu", "cuda", "fake"), default="auto",
                        help="fake = injected synthetic times (CPU demos and tests; labelled)")
    parser.add_argument("--workers", type=int, default=None, help="default: one per GPU, one on the CPU")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per candidate before its worker is killed")
    parser.add_argument("--backend", choices=("process", "ray"), default="process")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--forcing", choices=("auto", "off"), default="auto",
                        help="off: winners stay kernel-validated only (never integrated)")
    parser.add_argument("--out", default=None, help="folder for the markdown report")
    from specpilot.agents.mechanism_cli import add_arguments

    add_arguments(parser)


def config_from_args(args):
    from specpilot.agents.loop import LoopConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is visible")
    timer = args.timer if args.timer != "auto" else device
    if timer == "cuda" and device != "cuda":
        raise ValueError("--timer cuda needs --device cuda")
    s = settings.get()
    base_url, model = args.llm_base_url or s.llm_base_url, args.llm_model or s.llm_model
    llm = {"base_url": base_url, "model": model, "api_key": s.llm_api_key,
           "token_budget": args.llm_token_budget, "usd_per_mtok": args.llm_usd_per_mtok,
           "usd_budget": args.llm_usd_budget, "token_param": args.llm_token_param} if base_url and model else None
    workers = args.workers or (torch.cuda.device_count() if device == "cuda" else 1)
    return LoopConfig(target_dir=args.target, drafter_dir=args.drafter,
                      ops=tuple(args.op or ("split12_gemv", "engine.block_size")), rounds=args.rounds,
                      agents=args.agents, per_agent=args.per_agent, memory_url=args.memory or s.memory_url,
                      resume=args.resume, time_budget_s=args.time_budget, device=device, timer={"kind": timer},
                      workers=workers, timeout_s=args.timeout, backend=args.backend, batch=args.batch,
                      block_size=args.block_size, seed=args.seed, llm=llm, out_dir=args.out)


def run(args) -> int:
    from specpilot.agents import mechanism_cli
    from specpilot.agents.loop import run_optimize

    if args.list_mechanisms:
        from specpilot.agents.mechanisms import list_lines

        print("\n".join(list_lines()))
        return 0
    if args.search == "mechanisms":
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        return mechanism_cli.run(args, device)
    if not args.target:
        raise ValueError("specpilot optimize needs --target (a checkpoint folder)")

    if args.rounds < 1 or args.agents < 1 or args.per_agent < 1:
        raise ValueError(f"need rounds, agents and per-agent >= 1, got {args.rounds}, {args.agents}, {args.per_agent}")
    cfg = config_from_args(args)
    knob_evaluator = None
    if "engine.block_size" in cfg.ops and cfg.drafter_dir:
        from specpilot.agents.knobs import EngineKnobEvaluator

        try:
            knob_evaluator = EngineKnobEvaluator(cfg.target_dir, cfg.drafter_dir, cfg.device)
        except (ValueError, RuntimeError, FileNotFoundError, ImportError) as e:  # the GEMV gaps still run
            print(f"engine knobs skipped: the engine could not be set up ({e})", flush=True)
    forcer = "auto" if args.forcing == "auto" else None
    summary = run_optimize(cfg, forcer=forcer, knob_evaluator=knob_evaluator, log=lambda m: print(m, flush=True))
    print(json.dumps(summary, default=str))
    return 0
