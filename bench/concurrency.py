"""`specpilot bench --concurrency 1,2,4,...`: the batched engine under closed-loop clients.

At each concurrency C: C clients, each with its own stream of prompts (the benchmarks' prompts dealt
round robin, benchmark by benchmark), each submitting its next prompt the moment its last one
finishes. Measured per run: tokens/s over the whole run, TTFT (submit to first token, queueing
included) and TPOT (decode time per token after the first) p50 / p99, tau. Runs per C: batched AR
(the same engine, no drafter: the baseline every speedup is over), speculative with every mechanism
on, each mechanism off alone (the ablation: ragged verify, batched draft, adaptive verify), and
prefix-first verification (off by default) on alone at --verify-prefix P, default 4 (it replaces
adaptive verify: both trim the verify rows). Each engine's warmup measures the adaptive budget's
step-cost table on the card before the clock (BatchEngine.warmup). Writes concurrency.jsonl, concurrency.md and
concurrency.png (speedup vs C, with the published anchors drawn in) to --out.

Open loop (--arrival-rate R): instead of clients, the prompts arrive on one seeded Poisson process of R
requests per second, the same arrival times for every run; C caps the requests in flight (the rest
queue), and TTFT counts from the arrival. Below saturation the arrivals bound tokens/s (the speedup
column then tends to 1x): compare TPOT and TTFT there.

Scale tier (random weights accept ~nothing): --replay TAU gives every request AcceptanceReplay over
its own greedy transcript (from the AR run), as `bench --replay` does for the single-request engine.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.engine.cli_support import DEFAULT_VERIFY_PREFIX
from specpilot.engine.batch.run import pool_pages

# Each run beside batched AR: the BatchConfig fields it changes from the run's base config.
ABLATIONS = {"spec": {}, "no_ragged_verify": {"ragged_verify": False}, "no_batched_draft": {"batched_draft": False},
             "no_adaptive_verify": {"adaptive_verify": False},
             "with_prefix_first": {"verify_prefix": DEFAULT_VERIFY_PREFIX}}
# Published speedups over AR: the seed's stock and SpecPilot figures (flat lines), DFlash on SGLang (B200).
ANCHOR_LINES = {"stock (seed) 1.94x": 1.94, "SpecPilot (seed) 3.93x": 3.93}
ANCHOR_POINTS = {"DFlash on SGLang, B200": [(8, 4.5), (16, 3.9), (32, 2.8)]}


def parse_levels(text: str) -> list:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"--concurrency {text!r}: use a comma list of ints >= 1, e.g. 1,2,4,8")
    return levels


def select_ablations(ablations: dict, names) -> dict:
    """The runs named in the comma list `names` (None: all), in the list's order."""
    if names is None:
        return ablations
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in ablations]
    if unknown or not chosen:
        raise ValueError(f"--ablations {names!r}: choose from {','.join(ablations)}")
    return {n: ablations[n] for n in chosen}


def closed_loop(target, drafter, config, concurrency: int, prompts: list, max_new_tokens: int, stop_ids=(),
                replays=None, arrivals=None) -> tuple:
    """Runs every prompt through C closed-loop clients, or with `arrivals` (seconds from the start, one
    per prompt: poisson_arrivals) each prompt submitted at its arrival time into an engine of at most C
    requests; (metrics dict, results in prompt order). TTFT counts from the arrival (closed loop: from
    the submit), queueing included."""
    engine = BatchEngine(target, drafter, config, max_batch=concurrency,
                         kv_pages=pool_pages(prompts, max_new_tokens, concurrency, config.page_size))
    streams = [list(range(i, len(prompts), concurrency)) for i in range(concurrency)] if arrivals is None else []
    pending = list(range(len(prompts)))                 # open loop: prompts not yet arrived, in arrival order
    owner, results, late = {}, {}, {}

    def submit(index, client=None):
        replay = replays[index]() if replays is not None else None
        rid = engine.submit(Request(tuple(prompts[index]), max_new_tokens, stop_ids=tuple(stop_ids), replay=replay))
        owner[rid] = (client, index)

    def submit_next(client):
        if streams[client]:
            submit(streams[client].pop(0), client)

    def submit_arrived(now):
        while pending and arrivals[pending[0]] <= now - t0:
            index = pending.pop(0)
            late[index] = now - t0 - arrivals[index]    # between its arrival and this submit (one step at most)
            submit(index)

    # Graphs are captured before the clock, as a server captures them at startup (BatchEngine.warmup).
    warm_t0 = engine.clock()
    graphs = engine.warmup(max(len(p) for p in prompts) + max_new_tokens)
    warmup_s = engine.clock() - warm_t0
    t0 = engine.clock()
    if arrivals is None:
        for client in range(concurrency):
            submit_next(client)
    while len(results) < len(prompts):
        if arrivals is not None:                        # host time: a device sync would stall AR's lookahead
            submit_arrived(time.perf_counter())
            if engine.idle:                             # nothing in flight: wait for the next arrival
                time.sleep(max(0.0, t0 + arrivals[pending[0]] - time.perf_counter()))
                continue
        for r in engine.step():
            if r.error:
                raise RuntimeError(f"prompt {owner[r.request_id][1]} failed: {r.error}")
            client, index = owner[r.request_id]
            results[index] = r
            if arrivals is None:
                submit_next(client)
    wall = engine.clock() - t0
    ordered = [results[i] for i in range(len(prompts))]
    tokens = sum(len(r.tokens) for r in ordered)
    tpot = [r.decode_s / (len(r.tokens) - 1) for r in ordered if len(r.tokens) > 1]
    ttft = [r.prefill_s + late.get(i, 0.0) for i, r in enumerate(ordered)]
    taus = [r.tau for r in ordered if r.acceptance_lengths]
    metrics = {"concurrency": concurrency, "prompts": len(prompts), "tokens": tokens, "seconds": wall,
               "tokens_per_s": tokens / wall, "tau": float(np.mean(taus)) if taus else None,
               "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99),
               "tpot_p50_ms": _pct(tpot, 50), "tpot_p99_ms": _pct(tpot, 99), "steps": engine.steps,
               "prefill_steps": engine.prefill_steps,
               "prefill_step_share": engine.prefill_step_s / max(engine.prefill_step_s + engine.decode_step_s, 1e-12),
               "prefill_step_ms": engine.prefill_step_s / engine.prefill_steps * 1e3 if engine.prefill_steps else None,
               "decode_step_ms": (engine.decode_step_s / (engine.steps - engine.prefill_steps) * 1e3
                                  if engine.steps > engine.prefill_steps else None),
               "verified_rows_share": engine.verify_rows / engine.block_rows if engine.block_rows else None,
               "second_passes": engine.second_passes, "second_pass_requests": engine.second_pass_requests,
               "replay_shortfalls": sum(r.replay_shortfalls for r in ordered), "graphs": graphs, "graph_warmup_s": warmup_s,
               "step_costs_ms": ({n: s * 1e3 for n, s in zip(engine.costs.tokens, engine.costs.seconds)}
                                 | {"draft": engine.costs.fixed_s * 1e3, "host": engine.costs.host_s * 1e3})
               if engine.costs_measured else None}
    engine.close()          # before the next run's engine: its caches and graphs would stay allocated
    return metrics, ordered


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list:
    """Arrival times (seconds from the start) of `count` requests at `rate` requests per second: a
    Poisson process (exponential gaps, the first request at 0), the same for every run of one seed."""
    if not rate > 0:
        raise ValueError(f"--arrival-rate {rate!r} must be > 0 requests per second")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])]).tolist()


def _pct(values, q):
    return float(np.percentile(values, q) * 1e3) if values else None


def run_levels(target, drafter, prompts, levels, max_new_tokens, stop_ids=(), replay_tau=None, ablations=ABLATIONS,
               log=sys.stderr, arrivals=None, base=BatchConfig()) -> list:
    """Every run at every level: rows {method, concurrency, ... metrics, speedup}. ablations: run name ->
    the BatchConfig fields it changes from `base` (batched AR runs `base` itself, so that settings such
    as the prefill chunk are the same on both sides of a speedup). arrivals: open-loop arrival times
    (poisson_arrivals), the same for every run; each level then caps the batch."""
    from specpilot.engine.replay import AcceptanceReplay

    ablations = {name: replace(base, **changes) for name, changes in ablations.items()}
    rows, replays = [], None
    warm = prompts[:1]
    for name, config in [("ar", base)] + list(ablations.items()):       # untimed warm-up of each path
        closed_loop(target, None if name == "ar" else drafter, config, 1, warm, min(8, max_new_tokens), stop_ids,
                    None if name == "ar" or replay_tau is None else [lambda: AcceptanceReplay([0] * 8, replay_tau)])
    for c in levels:
        ar, ar_results = closed_loop(target, None, base, c, prompts, max_new_tokens, stop_ids,
                                     arrivals=arrivals)
        rows.append({"method": "ar", **ar, "speedup": 1.0})
        print(f"C={c} ar: {ar['tokens_per_s']:.1f} tok/s", file=log, flush=True)
        if replay_tau is not None and replays is None:
            replays = [(lambda t=r.tokens: AcceptanceReplay(t, replay_tau)) for r in ar_results]
        for name, config in ablations.items():
            try:
                m, _ = closed_loop(target, drafter, config, c, prompts, max_new_tokens, stop_ids, replays, arrivals)
            except RuntimeError as e:      # one run's failure (e.g. a CUDA graph capture) is a row, not the end
                rows.append({"method": name, "concurrency": c, "error": str(e)[:500], "speedup": None})
                print(f"C={c} {name}: FAILED: {rows[-1]['error']}", file=log, flush=True)
                continue
            rows.append({"method": name, **m, "speedup": m["tokens_per_s"] / ar["tokens_per_s"]})
            print(f"C={c} {name}: {m['tokens_per_s']:.1f} tok/s, {rows[-1]['speedup']:.2f}x, tau {m['tau']}",
                  file=log, flush=True)
    return rows


def add_ceiling_model(rows: list, shapes, prompts: list, max_new_tokens: int, prefill_chunk: int, card: str) -> None:
    """Each spec row gets `ceiling_model`: its closed loop's spec / AR with every kernel at the card's
    stated ceilings (cost/batched.py closed_loop): this run's mean prompt rows, new tokens and chunk,
    the row's measured tau as a geometric law, the best fixed verify lengths of decode steps and of
    chunk steps (as adaptive verify prices each), bf16. shapes: (target,
    drafter, feature layers, block) ModelShapes; card: a key of cost/batched.py CARDS."""
    from specpilot.cost.batched import CARDS, Acceptance, closed_loop

    target, drafter, feats, block = shapes
    prompt = float(np.mean([len(p) for p in prompts]))
    context = int(prompt + max_new_tokens / 2)
    for r in rows:
        if r["method"] != "spec" or r.get("error") or not r.get("tau") or not 1 <= r["tau"] <= block:
            continue
        law = Acceptance.geometric(r["tau"], block)
        runs = [closed_loop(target, drafter, feats, r["concurrency"], law, CARDS[card], max_new_tokens, prompt,
                            prefill_chunk, weights="bf16", context=context, verify_len=n, mixed_verify_len=m)
                for n in range(1, block + 1) for m in range(1, block + 1)]
        r["ceiling_model"] = min(runs, key=lambda run: run["spec_s"])["speedup_over_ar"]


def failed(rows: list) -> list:
    """The rows of runs that failed (run_levels keeps going past them)."""
    return [r for r in rows if r.get("error")]


def markdown(rows: list, info: dict) -> str:
    head = ["# Batched engine: speedup over batched AR vs concurrency", "",
            ", ".join(f"{k}: {v}" for k, v in info.items()), "",
            "| C | AR tok/s | spec tok/s | speedup | tau | TTFT p50 / p99 ms | TPOT p50 / p99 ms | verified rows | "
            "prefill steps' time AR / spec | spec step ms with / without a chunk | "
            "no ragged verify | no batched draft | no adaptive verify | with prefix-first (verified rows) | "
            "at the ceilings (model) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["method"], r["concurrency"]): r for r in rows}
    for c in sorted({r["concurrency"] for r in rows}):
        ar, sp = by[("ar", c)], by.get(("spec", c))
        if sp is None:
            continue
        if sp.get("error"):
            head.append(f"| {c} | {ar['tokens_per_s']:.1f} | failed | - | - | - | - | - | - | - | - | - | - | - | - |")
            continue
        abl = [_speedup(by.get((m, c))) for m in ("no_ragged_verify", "no_batched_draft", "no_adaptive_verify")]
        prefix = by.get(("with_prefix_first", c))
        abl.append(f"{prefix['speedup']:.2f}x ({prefix['verified_rows_share']:.0%})"
                   if prefix and not prefix.get("error") else _speedup(prefix))
        share = f"{sp['verified_rows_share']:.0%}" if sp["verified_rows_share"] is not None else "-"
        tau = f"{sp['tau']:.2f}" if sp["tau"] is not None else "-"
        prefill = " / ".join(f"{r['prefill_step_share']:.0%}" if r.get("prefill_step_share") is not None else "-"
                             for r in (ar, sp))
        head.append(f"| {c} | {ar['tokens_per_s']:.1f} | {sp['tokens_per_s']:.1f} | {sp['speedup']:.2f}x | {tau} | "
                    f"{sp['ttft_p50_ms']:.1f} / {sp['ttft_p99_ms']:.1f} | {_ms(sp['tpot_p50_ms'])} / "
                    f"{_ms(sp['tpot_p99_ms'])} | {share} | {prefill} | "
                    f"{_ms(sp.get('prefill_step_ms'))} / {_ms(sp.get('decode_step_ms'))} | " + " | ".join(abl) +
                    (f" | {sp['ceiling_model']:.2f}x |" if sp.get("ceiling_model") else " | - |"))
    return "\n".join(head) + "\n"


def _speedup(row) -> str:
    if row is None:
        return "-"
    return "failed" if row.get("error") else f"{row['speedup']:.2f}x"


def _ms(v):
    return f"{v:.2f}" if v is not None else "-"


def plot(rows: list, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in ABLATIONS:
        pts = sorted((r["concurrency"], r["speedup"]) for r in rows if r["method"] == method and not r.get("error"))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=method if method != "spec" else "SpecPilot batched (this run)",
                    linewidth=2.5 if method == "spec" else 1, alpha=1 if method == "spec" else 0.6)
    for label, y in ANCHOR_LINES.items():
        ax.axhline(y, linestyle="--", color="gray" if "stock" in label else "black", linewidth=1, label=label)
    for label, pts in ANCHOR_POINTS.items():
        ax.plot(*zip(*pts), linestyle=":", marker="s", color="tab:red", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("speedup over batched AR")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(rows: list, info: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "concurrency.jsonl").write_text("".join(json.dumps({**r, **{"info": info}}) + "\n" for r in rows))
    (out / "concurrency.md").write_text(markdown(rows, info))
    plot(rows, out / "concurrency.png", f"{info.get('target')} on {info.get('device')}")


def load_models(args, tokenizer):
    """(target, drafter, stop ids) for `bench --concurrency`: a random pair (random:<preset>, no stop
    token: every request runs to --max-new-tokens) or checkpoint folders."""
    import torch

    from specpilot.bench import e2e, random_pair
    from specpilot.models.loading import as_dtype

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = as_dtype(args.dtype)
    if random_pair.is_random(args.target):
        from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

        preset, layers = random_pair.parse(args.target)
        cfg = TARGET_PRESETS[preset]
        target = random_target(cfg, device, dtype, seed=0)
        drafter = random_drafter(drafter_config_for(cfg, layers, args.block_size or 16), target, seed=1)
        return target, drafter, ()
    from specpilot.models import load_drafter, load_target

    if args.drafter is None:
        raise ValueError("bench --concurrency needs --drafter (or a random:<preset> target)")
    target = load_target(args.target, device=str(device), dtype=dtype)
    return target, load_drafter(args.drafter, target), tuple(e2e.stop_ids_for(args.target, tokenizer))


def ceiling_model_card(args, target, drafter, arrivals) -> tuple:
    """(card, note): the stated ceilings (a cost/batched.py CARDS key) the table's model column uses,
    or (None, why there is none)."""
    from specpilot.bench.report import device_name

    card = next((name for name in ("H100", "H200") if name in device_name(target.device)), None)
    why = ("no stated ceilings for this device" if card is None else
           "bf16 only" if args.dtype != "bf16" else
           "closed loops only" if arrivals is not None else
           "dense targets only" if hasattr(target.config, "layer_types") else
           "DFlash drafters only" if getattr(drafter, "kind", "dflash") != "dflash" else None)
    if why is not None:
        return None, f"not computed: {why}"
    return card, f"{card} stated ceilings (cost/batched.py closed_loop)"


def model_shapes(args, drafter) -> tuple:
    """(target, drafter, feature layers, block) ModelShapes of this run's pair, for the ceiling model."""
    from specpilot.bench import random_pair
    from specpilot.cost.shapes import ModelShape, drafter_target_layers
    from specpilot.cost.two_level import preset_shapes

    if random_pair.is_random(args.target):
        preset, layers = random_pair.parse(args.target)
        return (*preset_shapes(preset, layers), layers, drafter.block_size)
    return (ModelShape.from_dir(args.target), ModelShape.from_dir(args.drafter), drafter_target_layers(args.drafter),
            drafter.block_size)


def cli_run(args, load_tokenizer) -> int:
    """`specpilot bench --concurrency LEVELS`: first turns of the benchmarks' prompts (--limit each)."""
    from specpilot.bench import datasets
    from specpilot.bench.report import device_name

    levels = parse_levels(args.concurrency)
    if args.weights not in (None, "bf16"):
        raise ValueError("bench --concurrency runs bf16 weights only for now (--weights bf16)")
    replay_tau = float(args.replay) if args.replay else None
    tokenizer = load_tokenizer(args.target)
    names = [datasets.canonical_name(n) for n in args.benchmarks.split(",") if n.strip()]
    per_bench = [[datasets.encode(tokenizer, [{"role": "user", "content": s.turns[0]}])
                  for s in datasets.load_benchmark(Path(args.datasets), n, args.limit)] for n in names]
    prompts = [p for group in zip(*per_bench) for p in group]           # benchmark by benchmark, round robin
    target, drafter, stop_ids = load_models(args, tokenizer)
    print(f"specpilot bench --concurrency {levels}: {len(prompts)} prompts, {args.target}", file=sys.stderr)
    from specpilot.engine.cli_support import batch_options

    prefix = batch_options(args).get("verify_prefix", DEFAULT_VERIFY_PREFIX)
    ablations = select_ablations({**ABLATIONS, "with_prefix_first": {"verify_prefix": prefix}},
                                 getattr(args, "ablations", None))
    base = BatchConfig(**({"prefill_chunk": args.prefill_chunk} if getattr(args, "prefill_chunk", None) else {}))
    rate = getattr(args, "arrival_rate", None)
    arrivals = poisson_arrivals(len(prompts), rate) if rate is not None else None
    rows = run_levels(target, drafter, prompts, levels, args.max_new_tokens, stop_ids, replay_tau, ablations=ablations,
                      arrivals=arrivals, base=base)
    card, model = ceiling_model_card(args, target, drafter, arrivals)
    if card is not None:
        try:                 # the measured rows are written whatever the model makes of them
            add_ceiling_model(rows, model_shapes(args, drafter), prompts, args.max_new_tokens, base.prefill_chunk,
                              card)
        except (ValueError, FileNotFoundError, KeyError) as e:
            model = f"not computed: {e}"
    info = {"target": args.target, "drafter": args.drafter or "random", "device": device_name(target.device),
            "dtype": args.dtype, "prompts": len(prompts), "benchmarks": ",".join(names),
            "max_new_tokens": args.max_new_tokens, "replay tau": replay_tau,
            "step costs": "measured by each engine's warmup" if target.device.type == "cuda" else "roofline (no CUDA)",
            "verify prefix": prefix,
            "prefill chunk": base.prefill_chunk, "ceiling model": model,
            **({"arrivals": f"Poisson, {rate} requests/s (seed 0), C caps the batch"} if rate else {})}
    write(rows, info, Path(args.out))
    print(markdown(rows, info))
    for r in failed(rows):
        print(f"specpilot bench: the {r['method']} run at C={r['concurrency']} failed: {r['error']}", file=sys.stderr)
    return 1 if failed(rows) else 0
