"""`specpilot bench`: the five benchmarks end to end -> rows.jsonl, report.md, report.png, traces.json
in --out; the markdown table is printed last, progress goes to stderr."""
import sys
import time
from pathlib import Path

from specpilot import settings



def configure(parser):
    from specpilot.bench.datasets import BENCHMARKS
    from specpilot.bench.e2e import DEFAULT_METHODS, METHODS

    s = settings.get()
    parser.add_argument("--target", required=True,
                        help="target HF checkpoint folder, or random:<preset>[:<drafter layers>] "
                             "(scale tier, our methods only, e.g. random:qwen3-8b)")
    parser.add_argument("--drafter", default=None,
                        help="drafter folder, any kind (DFlash, DFlash2, DSpark, PARD; detected); "
                             "hf_ar and stock take DFlash / DFlash2 only")
    parser.add_argument("--datasets", default=str(s.datasets),
                        help="folder of <benchmark>.jsonl (default %(default)s)")
    parser.add_argument("--out", default="bench_out", help="output folder (default %(default)s)")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                        help="comma list; any <name>.jsonl in --datasets works (default %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per benchmark, DFlash's seeded selection")
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"comma list of {','.join(METHODS)}")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--weights", default=None,
                        help="our engine's target weights, which the drafter's follow: bf16, split12, or a comma "
                             "list (bf16,split12: one engine each, timed in one run against the same baselines, "
                             "rows named our_spec@split12 ...); default: as stored; split12 packs a bf16 folder "
                             "at load")
    parser.add_argument("--replay", default=None,
                        help="scale tier: replay acceptance in our_spec, a fixed TAU (e.g. 6.49) or a trace.json")
    parser.add_argument("--tier", default="auto", choices=("auto", "real", "scale", "correctness"),
                        help="fidelity tier stated in the report (auto: scale with --replay or a random: target, else real)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="KV capacity of our engine (default: from the prompts, with room for max-new-tokens "
                             "in the last turn and 2x for each earlier turn's answer); hf_static sizes its "
                             "cache per prompt")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed calls per prompt and method, the fastest kept (for noisy hosts)")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--concurrency", default=None,
                        help="comma list (e.g. 1,2,4,8,16,32): the batched engine under that many closed-loop "
                             "clients instead of the per-prompt methods; speedup over batched AR, TTFT / TPOT, "
                             "the ablation of each batching mechanism, a plot (--replay takes a TAU only)")
    parser.add_argument("--arrival-rate", type=float, default=None, metavar="R",
                        help="with --concurrency: open loop, the prompts arrive as a Poisson process of R requests/s "
                             "(seed 0: the same arrivals every run) and each concurrency caps the batch; default: closed-loop clients")
    parser.add_argument("--ablations", default=None,
                        help="with --concurrency: the comma list of runs beside batched AR (default: all of "
                             "spec,no_ragged_verify,no_batched_draft,no_adaptive_verify,with_prefix_first)")
    parser.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                        help="with --concurrency: prompt tokens prefilled per step over all newcomers, for batched "
                             "AR and every run beside it (BatchConfig.prefill_chunk; default: its default)")
    from specpilot.engine.cli_support import add_mechanism_args
    add_mechanism_args(parser)


def _check_args(args):
    for name in ("limit", "max_new_tokens", "block_size", "max_seq_len", "repeats", "prefill_chunk"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    from specpilot.bench import random_pair

    if random_pair.is_random(args.target):
        random_pair.parse(args.target)
    else:                                  # a folder, or a Hugging Face id in the local HF cache
        from specpilot.models.model_paths import resolve_model_dir

        args.target = resolve_model_dir(args.target, "--target")
        args.drafter = resolve_model_dir(args.drafter, "--drafter") if args.drafter else None
    for flag, path in (("--target", None if random_pair.is_random(args.target) else args.target),
                       ("--drafter", args.drafter), ("--datasets", args.datasets)):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{flag} {path} does not exist")


def _load_tokenizer(target_dir):
    from specpilot.bench import random_pair

    if random_pair.is_random(target_dir):
        return random_pair.tokenizer(target_dir)
    try:
        from specpilot.models import load_tokenizer
    except ImportError:
        from transformers import AutoTokenizer as _auto

        return _auto.from_pretrained(target_dir)
    return load_tokenizer(target_dir)


def _seq_len_bound(tokenizer, samples_by_bench, max_new_tokens, block_size) -> int:
    """Longest conversation any method should see: every turn's text with empty answers, room for
    max_new_tokens in the last turn and for each earlier turn's carried answer (decoded to text
    and re-encoded, as DFlash does, which can change its length: e2e.carried_answer caps it at
    ANSWER_ROOM x max_new_tokens), plus one verify block. --max-seq-len overrides it."""
    from specpilot.bench.datasets import encode
    from specpilot.bench.e2e import ANSWER_ROOM

    longest = 0
    for samples in samples_by_bench.values():
        for s in samples:
            msgs = []
            for t in s.turns:
                msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": " "}]
            answers = (len(s.turns) - 1) * ANSWER_ROOM * max_new_tokens + max_new_tokens
            longest = max(longest, len(encode(tokenizer, msgs[:-1])) + answers + 8 * len(s.turns))
    return longest + 2 * block_size


def _weight_formats(args, random_target) -> tuple[str, ...]:
    """--weights as a tuple of formats, each resolved against the target folder ("as stored");
    the one place the list is checked (e2e.build_runners takes it as given)."""
    from specpilot.models.loading import resolve_weights

    names = [w.strip() for w in args.weights.split(",")] if args.weights else [None]
    bad = [w for w in names if w not in ("bf16", "split12", None)]
    if bad or (args.weights and "" in names):
        raise ValueError(f"--weights {args.weights!r}: use bf16, split12 or a comma list of them (bf16,split12)")
    formats = tuple((w or "bf16") if random_target else resolve_weights(args.target, args.dtype, w) for w in names)
    if len(set(formats)) != len(formats):
        raise ValueError(f"--weights {args.weights!r} names a format twice")
    return formats


def _check_methods(args, methods, random_target):
    if random_target and {"hf_ar", "hf_static", "stock"} & set(methods):
        raise ValueError(f"--target {args.target} builds our models only; hf_ar/hf_static/stock need a "
                         "checkpoint folder (specpilot.models.random_ckpt.write_pair writes one)")
    if args.drafter is None and not random_target and {"hf_ar", "stock", "our_spec"} & set(methods):
        raise ValueError(f"methods {','.join(methods)} need --drafter (hf_ar runs dflash_generate at "
                         "block 1, which takes the drafter; without one use hf_static,our_ar)")
    if args.replay and "our_spec" not in methods:
        raise ValueError("--replay replays acceptance in our_spec; add our_spec to --methods")


def _run_info(args, cfg, runners, names, random_target) -> dict:
    """What the report header states: tier, trace, device, dtype, models, versions."""
    from specpilot.bench import random_pair, report

    tier = args.tier if args.tier != "auto" else ("scale" if cfg.replay or random_target else "real")
    drafter = args.drafter
    if random_target:
        has_drafter = {"stock", "our_spec"} & set(cfg.methods)
        names = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark", "pard": "PARD"}
        name = names[random_pair.kind(args.target)]
        drafter = f"random {random_pair.parse(args.target)[1]}-layer {name} drafter" if has_drafter else None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tier": tier,
            "replay": cfg.replay.describe() if cfg.replay else None, "device": report.device_name(cfg.device),
            "dtype": args.dtype, "weights": ",".join(cfg.weights), "target": args.target, "drafter": drafter,
            "block_size": runners.block_size, "max_new_tokens": args.max_new_tokens, "limit": args.limit,
            "methods": list(cfg.methods), "benchmarks": names, "repeats": args.repeats,
            "versions": report.versions()}


def _save_traces(rows, info, out: Path):
    """traces_<method>.json of the measured acceptance, replayable with --replay (not after a replay)."""
    from specpilot.bench import metrics, traces

    if info["replay"]:
        return
    spec = [m for m in dict.fromkeys(r["method"] for r in rows)
            if metrics.base_and_format(m)[0] in ("our_spec", "stock")]
    for m in spec:
        source = f"{m} on {Path(info['target']).name} ({info['tier']} tier, {', '.join(info['benchmarks'])})"
        trace = traces.from_rows(rows, m, source, info["block_size"])
        if trace.prompts:
            traces.save(trace, out / f"traces_{m.replace('@', '_')}.json")


def run(args) -> int:
    from specpilot.bench import datasets, e2e, random_pair, report, traces
    import torch

    from specpilot.engine.cli_support import mechanism_options
    from specpilot.models.loading import as_dtype

    _check_args(args)
    if args.concurrency:
        if args.tree_budget:
            raise ValueError("--tree-budget runs on the single-request engine only (no --concurrency)")
        from specpilot.bench.concurrency import cli_run

        return cli_run(args, _load_tokenizer)
    methods = e2e.parse_methods(args.methods)
    random_target = random_pair.is_random(args.target)
    _check_methods(args, methods, random_target)
    formats = _weight_formats(args, random_target)
    names = [datasets.canonical_name(n) for n in args.benchmarks.split(",") if n.strip()]
    samples = {n: datasets.load_benchmark(Path(args.datasets), n, args.limit) for n in names}
    tokenizer = _load_tokenizer(args.target)
    # a random target gets no stop token: every prompt runs to --max-new-tokens
    stop_ids = [] if random_target else e2e.stop_ids_for(args.target, tokenizer)
    block_size = args.block_size or (e2e.drafter_block_size(args.drafter) if args.drafter
                                     else random_pair.default_block_size(args.target) if random_target else 1)
    cfg = e2e.BenchConfig(
        target_dir=args.target, drafter_dir=args.drafter,
        device=torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")),
        dtype=as_dtype(args.dtype), max_new_tokens=args.max_new_tokens, block_size=block_size,
        methods=methods, replay=traces.parse_replay(args.replay, block_size) if args.replay else None,
        weights=formats,
        max_seq_len=args.max_seq_len or _seq_len_bound(tokenizer, samples, args.max_new_tokens, block_size)
        + args.tree_budget,                                 # a tree's scratch slots past the last position
        cuda_graphs=not args.no_cuda_graphs, engine_options=mechanism_options(args))
    print(f"specpilot bench: loading {args.target} ({', '.join(methods)}) on {cfg.device} {args.dtype}",
          file=sys.stderr, flush=True)
    runners = e2e.build_runners(cfg, stop_ids)
    first = samples[names[0]][0]
    e2e.warm_up(runners, datasets.encode(tokenizer, [{"role": "user", "content": first.turns[0]}]),
                args.max_new_tokens)

    rows = []
    out = Path(args.out)
    info = _run_info(args, cfg, runners, names, random_target)
    from specpilot.bench.live_progress import LiveProgress

    progress = LiveProgress()
    try:
        for n in names:
            e2e.run_benchmark(n, samples[n], tokenizer, runners, args.max_new_tokens, progress,
                              args.repeats, rows=rows)
        progress.close()
    except (Exception, KeyboardInterrupt) as e:  # a long run keeps every finished prompt's rows
        progress.close()
        if rows:
            done = sorted({r["benchmark"] for r in rows}, key=names.index)
            report.write_all(rows, {**info, "benchmarks": done, "stopped": f"{type(e).__name__}: {e}"}, out)
            print(f"specpilot bench: stopped; the {len(rows)} rows measured before the error "
                  f"({', '.join(done)}) are in {out}/", file=sys.stderr)
        raise
    _, summary = report.write_all(rows, info, out)
    _save_traces(rows, info, out)
    print(f"specpilot bench: wrote {out}/rows.jsonl, report.md, report.png", file=sys.stderr)
    print(report.tables(summary))
    return 0
