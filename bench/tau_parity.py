"""Acceptance parity with stock: stock dflash_generate and our engine's generate_spec, greedy, on many
prompts, with pooled tau, bootstrap confidence intervals and the per-step acceptance side by side.

    python -m specpilot.bench.tau_parity --target DIR --drafter DIR --datasets DIR[,DIR] --sets a,b,c \
        --limit N --max-new-tokens T --device cpu|cuda --dtype fp32|bf16 --out DIR [--time-budget S] [--plot]

A set name `s` is the file `<dir>/s.jsonl` in the first --datasets folder that has it. Prompts are the
first N rows of each file, encoded exactly as `specpilot verify` encodes them (models/prompts.py), and
run round-robin over the sets so that a run cut by --time-budget stays balanced.
tau per prompt = mean acceptance length (tokens per verify step, bonus included), as dflash prints;
pooled two ways: the mean over prompts of that (dflash's "Average Acceptance length") and token-weighted
(all produced tokens / all steps). Prompts where either side made no verify step (first token a stop
token) have no tau and are counted apart. CIs: percentile bootstrap over prompts (seeded), paired, so
the difference (ours - stock) is resampled on the same prompts for both sides.
Writes <out>/rows.jsonl (one row per prompt, flushed as it goes), summary.json, report.md, and with
--plot scatter.png; progress goes to stderr, the summary table last to stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from specpilot.verify.spec_checks import first_fork as first_difference  # the verdict's own fork rule

BOOTSTRAP_RESAMPLES = 10000
SIDE_BY_SIDE_STEPS = 12


# -- prompts -----------------------------------------------------------------------------------------

def resolve_sets(folders: list, names: list) -> list:
    """[(set name, file)] with each name found in the first folder holding `<name>.jsonl`."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--sets names {', '.join(repeated)} more than once")
    out = []
    for name in names:
        hits = [Path(d) / f"{name}.jsonl" for d in folders if (Path(d) / f"{name}.jsonl").is_file()]
        if not hits:
            raise FileNotFoundError(f"prompt set {name!r}: no {name}.jsonl in any of {', '.join(map(str, folders))}")
        out.append((name, hits[0]))
    return out


def load_prompts(sets: list, tokenizer, limit) -> list:
    """[(set, id, token ids)] round-robin over the sets (first `limit` rows of each, file order)."""
    from specpilot.models.prompts import encode_prompt, read_prompts

    per_set = []
    for name, path in sets:
        rows = [(name, p.id, encode_prompt(tokenizer, p)) for p in read_prompts(path, limit)]
        empty = [pid for _, pid, ids in rows if not ids]
        if empty:
            raise ValueError(f"{path}: prompt(s) {empty[:5]} encode to zero tokens")
        per_set.append(rows)
    return [rows[i] for i in range(max(map(len, per_set))) for rows in per_set if i < len(rows)]


# -- one prompt --------------------------------------------------------------------------------------

def mean_or_none(xs: list):
    return sum(xs) / len(xs) if xs else None


def compare_prompt(set_name, prompt_id, prompt_ids, stock_tokens, stock_acc, our_tokens, our_acc) -> dict:
    """One JSONL row: both sides' tokens and acceptance, their taus and where they first differ."""
    for side, tokens, acc in (("stock", stock_tokens, stock_acc), ("ours", our_tokens, our_acc)):
        if sum(acc) != len(tokens) - 1:     # the prefill's token + every step's produced tokens
            raise ValueError(f"{prompt_id}: {side} produced {len(tokens)} tokens but its acceptance lengths "
                             f"sum to {sum(acc)} (+1 for the prefill token): the record is inconsistent")
    identical = stock_tokens == our_tokens
    return {"set": set_name, "id": prompt_id, "prompt_len": len(prompt_ids),
            "identical": identical, "first_token_difference": first_difference(stock_tokens, our_tokens),
            "acceptance_identical": stock_acc == our_acc, "first_step_difference": first_difference(stock_acc, our_acc),
            "stock_tau": mean_or_none(stock_acc), "our_tau": mean_or_none(our_acc),
            "stock_tokens": stock_tokens, "our_tokens": our_tokens,
            "stock_acceptance": stock_acc, "our_acceptance": our_acc}


# -- statistics --------------------------------------------------------------------------------------

def _pooled(tau_s, tau_o, tok_s, steps_s, tok_o, steps_o, idx) -> np.ndarray:
    """[..., 6]: stock / ours / difference for mean-of-taus and token-weighted tau over rows idx."""
    ms, mo = tau_s[idx].mean(-1), tau_o[idx].mean(-1)
    ws, wo = tok_s[idx].sum(-1) / steps_s[idx].sum(-1), tok_o[idx].sum(-1) / steps_o[idx].sum(-1)
    return np.stack([ms, mo, mo - ms, ws, wo, wo - ws], axis=-1)


STAT_NAMES = ("stock_tau", "our_tau", "diff_tau", "stock_tau_weighted", "our_tau_weighted", "diff_tau_weighted")


def pooled_stats(rows: list, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """Pooled taus of both sides and their paired difference, each {value, lo, hi} (95 % percentile
    bootstrap over prompts). Rows where either side has no step are left out (counted in `no_step`)."""
    both = [r for r in rows if r["stock_acceptance"] and r["our_acceptance"]]
    out = {"with_tau": len(both), "no_step": len(rows) - len(both)}
    if not both:
        return {**out, **{k: None for k in STAT_NAMES}}
    tau_s = np.array([r["stock_tau"] for r in both])
    tau_o = np.array([r["our_tau"] for r in both])
    tok_s = np.array([sum(r["stock_acceptance"]) for r in both], dtype=float)
    tok_o = np.array([sum(r["our_acceptance"]) for r in both], dtype=float)
    steps_s = np.array([len(r["stock_acceptance"]) for r in both], dtype=float)
    steps_o = np.array([len(r["our_acceptance"]) for r in both], dtype=float)
    arrays = (tau_s, tau_o, tok_s, steps_s, tok_o, steps_o)
    point = _pooled(*arrays, np.arange(len(both)))
    rng = np.random.default_rng(seed)
    boot = _pooled(*arrays, rng.integers(0, len(both), size=(resamples, len(both))))
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    for i, name in enumerate(STAT_NAMES):
        out[name] = {"value": float(point[i]), "lo": float(lo[i]), "hi": float(hi[i])}
    return out


def summarize(rows: list, seed: int = 0) -> dict:
    """Pooled stats for all prompts and per set, plus output / acceptance agreement counts."""
    def agreement(rs):
        same = [r for r in rs if r["identical"]]
        return {"prompts": len(rs), "identical_outputs": len(same),
                "identical_acceptance": sum(r["acceptance_identical"] for r in same)}

    sets = list(dict.fromkeys(r["set"] for r in rows))
    same = [r for r in rows if r["identical"]]
    return {"all": {**agreement(rows), **pooled_stats(rows, seed)},
            "identical_outputs_only": {**agreement(same), **pooled_stats(same, seed)},
            "sets": {s: {**agreement(rs), **pooled_stats(rs, seed)}
                     for s in sets for rs in [[r for r in rows if r["set"] == s]]}}


# -- reports -----------------------------------------------------------------------------------------

def _ci(stat) -> str:
    return "–" if stat is None else f"{stat['value']:.3f} [{stat['lo']:.3f}, {stat['hi']:.3f}]"


def summary_table(summary: dict) -> str:
    cols = ["set", "prompts", "with tau", "identical outputs", "of which identical acceptance", "stock tau",
            "our tau", "ours - stock", "stock tau (token-weighted)", "our tau (token-weighted)",
            "ours - stock (token-weighted)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for name, s in [*summary["sets"].items(), ("all", summary["all"]),
                    ("all, identical outputs only", summary["identical_outputs_only"])]:
        cells = [name, s["prompts"], s["with_tau"], s["identical_outputs"], s["identical_acceptance"]]
        lines.append("| " + " | ".join(map(str, cells + [_ci(s[k]) for k in STAT_NAMES])) + " |")
    return "\n".join(lines)


def side_by_side(rows: list, steps: int = SIDE_BY_SIDE_STEPS) -> str:
    """Prompts with identical outputs: both acceptance sequences and where they part (`steps` steps from
    the start, or from 2 before the first differing step)."""
    lines = ["| set | id | steps | stock acceptance | our acceptance | first differing step |", "|" + " --- |" * 6]
    for r in rows:
        if r["identical"]:
            diff = r["first_step_difference"]
            first = 0 if diff is None else max(0, diff - 2)

            def seq(acc):
                shown = " ".join(map(str, acc[first:first + steps]))
                return ("… " if first else "") + shown + (" …" if len(acc) > first + steps else "")
            lines.append(f"| {r['set']} | {r['id']} | {len(r['stock_acceptance'])} | {seq(r['stock_acceptance'])} | "
                         f"{seq(r['our_acceptance'])} | {'–' if diff is None else diff} |")
    return "\n".join(lines)


def divergences(rows: list) -> str:
    """Prompts whose outputs differ: the first differing token and both taus."""
    lines = ["| set | id | stock tokens | our tokens | first differing token | stock tau | our tau |",
             "|" + " --- |" * 7]
    for r in rows:
        if not r["identical"]:
            taus = [("–" if t is None else f"{t:.2f}") for t in (r["stock_tau"], r["our_tau"])]
            lines.append(f"| {r['set']} | {r['id']} | {len(r['stock_tokens'])} | {len(r['our_tokens'])} | "
                         f"{r['first_token_difference']} | {taus[0]} | {taus[1]} |")
    return "\n".join(lines) if len(lines) > 2 else "(none)"


def markdown(summary: dict, rows: list, info: dict) -> str:
    from .tau_parity_probe import probe_section

    head = "\n".join(f"- {k}: {v}" for k, v in info.items())
    return (f"# Acceptance parity: stock dflash_generate vs our generate_spec (greedy)\n\n{head}\n\n"
            f"tau = mean acceptance length per prompt (bonus included), pooled as the mean over prompts and "
            f"token-weighted (tokens / steps); [95 % bootstrap CI over prompts, {BOOTSTRAP_RESAMPLES} "
            f"resamples, seed {info['seed']}], difference paired.\n\n{summary_table(summary)}\n\n"
            f"## Identical outputs: acceptance per step ({SIDE_BY_SIDE_STEPS} steps from the first, or from 2 "
            f"before the first differing step)\n\n{side_by_side(rows)}\n\n"
            f"## Different outputs\n\n{divergences(rows)}\n{probe_section(rows)}")


def plot(rows: list, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    for identical, style in ((True, dict(marker="o", label="identical outputs")),
                             (False, dict(marker="x", label="different outputs"))):
        pts = [(r["stock_tau"], r["our_tau"]) for r in rows
               if r["identical"] == identical and r["stock_tau"] is not None and r["our_tau"] is not None]
        if pts:
            ax.scatter(*zip(*pts), s=14, alpha=0.7, **style)
    top = max([1.0] + [max(r["stock_tau"] or 0, r["our_tau"] or 0) for r in rows]) + 0.5
    ax.plot([1, top], [1, top], color="grey", lw=0.8)
    ax.set(xlabel="stock tau", ylabel="our tau", title="per-prompt tau", xlim=(1, top), ylim=(1, top))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- the run -----------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.tau_parity", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="target model folder (HF format)")
    p.add_argument("--drafter", required=True, help="DFlash drafter folder")
    p.add_argument("--datasets", required=True, help="comma-separated folders of <set>.jsonl prompt files")
    p.add_argument("--sets", required=True, help="comma-separated set names, e.g. humaneval,pystdlib,mtbench")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each set (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when torch sees one")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no prompt that the mean time per prompt so far says would end past it "
                        "(--probe reruns come after, outside the budget)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--plot", action="store_true", help="also write scatter.png (per-prompt tau, stock vs ours)")
    p.add_argument("--probe", type=int, default=0, metavar="N",
                   help="for up to N prompts whose acceptance differs (identical outputs first), rerun both sides "
                        "and compare the drafters' logits at the first differing step (tau_parity_probe)")
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    if args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.probe < 0:
        p.error(f"--probe must be >= 0, got {args.probe}")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error(f"--time-budget must be > 0 seconds, got {args.time_budget}")
    import torch
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    return args


def run(args) -> tuple:
    """Runs both sides on every prompt (within the budget); returns (rows, info)."""
    from specpilot.engine.cli_support import engine_for, load_pair
    from specpilot.models import stop_ids_for
    from specpilot.models.loading import resolve_weights
    from specpilot.verify.stock import load_stock, run_stock

    from .report import device_name, versions

    sets = resolve_sets([d for d in args.datasets.split(",") if d], [s for s in args.sets.split(",") if s])
    weights = resolve_weights(args.target, args.dtype, None)
    target, drafter, tok = load_pair(args.target, args.drafter, args.device, args.dtype, weights)
    prompts = load_prompts(sets, tok, args.limit)
    engine = engine_for(target, drafter, [(pid, ids) for _, pid, ids in prompts], args.max_new_tokens)
    stock = load_stock(args.target, args.drafter, args.device, args.dtype)
    stop_ids = stop_ids_for(target, tok)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    stopped_by_budget = False
    with open(out / "rows.jsonl", "w") as f:
        for i, (set_name, pid, ids) in enumerate(prompts):
            elapsed = time.perf_counter() - t0
            if args.time_budget is not None and rows and elapsed + elapsed / len(rows) > args.time_budget:
                stopped_by_budget = True
                print(f"time budget {args.time_budget:.0f} s: stopping after {len(rows)} of {len(prompts)} prompts",
                      file=sys.stderr)
                break
            ref = run_stock(stock, ids, args.max_new_tokens, stop_ids, 0.0, args.block_size)
            ours = engine.generate_spec(ids, args.max_new_tokens, stop_ids=stop_ids, block_size=args.block_size)
            row = compare_prompt(set_name, pid, ids, ref.tokens, list(ref.acceptance_lengths), list(ours.tokens),
                                 list(ours.acceptance_lengths))
            row.update(stock_s=ref.seconds, our_s=ours.prefill_s + ours.decode_s)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            taus = [("–" if t is None else f"{t:.2f}") for t in (row["stock_tau"], row["our_tau"])]
            print(f"[{i + 1}/{len(prompts)}] {set_name} {pid}: {len(ref.tokens)} tokens, tau stock {taus[0]} ours "
                  f"{taus[1]}, {'identical' if row['identical'] else 'DIFFERENT'} outputs"
                  f"{'' if row['acceptance_identical'] else ', different acceptance'} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    parted = [r for r in rows if not r["acceptance_identical"] and r["first_step_difference"] is not None]
    probed = sorted(parted, key=lambda r: not r["identical"])[:args.probe]       # identical outputs first
    if probed:
        from .tau_parity_probe import probe
        by_id = {(s, pid): ids for s, pid, ids in prompts}
        for r in probed:
            r["draft_probe"] = probe(engine, stock, by_id[r["set"], r["id"]], args.max_new_tokens, stop_ids,
                                     args.block_size, r)
            print(f"probe {r['set']} {r['id']}: {r['draft_probe']}", file=sys.stderr)
        with open(out / "rows.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    info = {"tier": "real (trained pair, measured acceptance)", "target": args.target, "drafter": args.drafter,
            "device": device_name(args.device), "dtype": args.dtype, "weights": weights,
            "sets": ", ".join(f"{n} ({p})" for n, p in sets), "prompts run": f"{len(rows)} of {len(prompts)}"
            + (" (stopped by --time-budget)" if stopped_by_budget else ""),
            "max_new_tokens": args.max_new_tokens, "block_size": args.block_size or drafter.block_size,
            "stop_ids": list(stop_ids), "seconds": round(time.perf_counter() - t0, 1),
            "stock / our seconds (generation calls)": f"{sum(r['stock_s'] for r in rows):.1f} / "
                                                      f"{sum(r['our_s'] for r in rows):.1f}", "seed": args.seed,
            "versions": versions()}
    return rows, info


def main(argv=None) -> int:
    args = parse_args(argv)
    rows, info = run(args)                          # the first prompt always runs: rows is never empty
    summary = summarize(rows, args.seed)
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps({"info": info, "summary": summary}, indent=1))
    (out / "report.md").write_text(markdown(summary, rows, info))
    if args.plot:
        plot(rows, out / "scatter.png")
    print(summary_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
