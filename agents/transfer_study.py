"""Transfer, measured: a search that starts from memory against a cold one, per deployment pair.

For each (source, target) pair: a cold search of the target in an empty memory gives the cold best
and the evaluations the cold search needed to come within 5% of it; then the source is searched
cold into a fresh memory, and the target searched again from that memory (the source's winner
first). Reported: evaluations to within 5% of the cold best, warm vs cold, and both trajectories
in a plot. The evaluator is stated in every output: with the cost-model evaluator the numbers are
estimates on stated ceilings, not measurements.

  python -m specpilot.agents.transfer_study --out OUT            # cost model, CPU, seconds
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from specpilot.agents.deployment import Deployment
from specpilot.agents.memory import Memory
from specpilot.agents.mechanism_search import search_mechanisms

WITHIN = 0.05


def reach(trajectory: list, target: float) -> int | None:
    """1-based evaluation count at which the best so far is within WITHIN of `target` (None: never)."""
    for i, t in enumerate(trajectory, 1):
        if t is not None and t >= (1.0 - WITHIN) * target:
            return i
    return None


def default_pairs() -> list:
    """(kind, source, target): another target shape, another concurrency, the other card."""
    def d(shape, card, c):
        return Deployment(shape, "dflash-b16", card, c, "split12")

    pairs = []
    for card in ("H100", "H200"):
        for c in (1, 4, 16, 32):
            pairs.append(("target shape", d("qwen3-8b", card, c), d("llama-3.1-8b", card, c)))
    for shape in ("qwen3-8b", "llama-3.1-8b"):
        for src, dst in ((1, 16), (16, 1), (4, 32), (16, 32)):
            pairs.append(("concurrency", d(shape, "H100", src), d(shape, "H100", dst)))
        for c in (1, 16):
            pairs.append(("card", d(shape, "H100", c), d(shape, "H200", c)))
    return pairs


def run_pair(kind, source, target, evaluator, budget: int, workdir: Path) -> dict:
    quiet = lambda m: None  # noqa: E731
    cold = search_mechanisms(target, evaluator, Memory(str(workdir / "cold.db")), budget=budget,
                             from_memory=False, log=quiet)
    mem = Memory(str(workdir / "warm.db"))
    search_mechanisms(source, evaluator, mem, budget=budget, from_memory=False, log=quiet)
    warm = search_mechanisms(target, evaluator, mem, budget=budget, from_memory=True, log=quiet)
    best = cold.best_tokens_per_s
    cold_n, warm_n = reach(cold.trajectory, best), reach(warm.trajectory, best)
    return {"kind": kind, "source": source.key, "target": target.key, "evaluator": evaluator.name,
            "cold_best_tokens_per_s": best, "warm_best_tokens_per_s": warm.best_tokens_per_s,
            "cold_evaluations": cold.evaluations, "warm_evaluations": warm.evaluations,
            "cold_reach": cold_n, "warm_reach": warm_n, "transferred_from": warm.transferred_from,
            "meets_one_third": warm_n is not None and cold_n is not None and 3 * warm_n <= cold_n,
            "cold_trajectory": cold.trajectory, "warm_trajectory": warm.trajectory}


def study(evaluator, pairs=None, budget: int = 60) -> list:
    rows = []
    for i, (kind, src, dst) in enumerate(pairs or default_pairs()):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run_pair(kind, src, dst, evaluator, budget, Path(tmp)))
    return rows


def markdown(rows: list) -> str:
    lines = [f"Evaluator: {rows[0]['evaluator']} (estimates; nothing token-forced)" if rows else "no rows",
             "", "| transfer | from | to | cold best tok/s | evals to 95%, cold | from memory | <= 1/3 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['source']} | {r['target']} | {r['cold_best_tokens_per_s']:.0f} | "
                     f"{r['cold_reach']} | {r['warm_reach']} | {'yes' if r['meets_one_third'] else 'no'} |")
    met = sum(r["meets_one_third"] for r in rows)
    lines.append(f"\n{met} of {len(rows)} pairs reach within 5% of the cold best in at most one third of the "
                 f"cold search's evaluations.")
    return "\n".join(lines)


def plot(rows: list, path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["kind"] for r in rows})
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for r in [r for r in rows if r["kind"] == kind][:4]:
            best = r["cold_best_tokens_per_s"]
            label = r["target"].split("|", 1)[1]
            line, = ax.plot(range(1, len(r["cold_trajectory"]) + 1), [t / best for t in r["cold_trajectory"]],
                            "--", label=f"cold {label}")
            ax.plot(range(1, len(r["warm_trajectory"]) + 1), [t / best for t in r["warm_trajectory"]], "-",
                    color=line.get_color(), label="from memory")
        ax.axhline(1 - WITHIN, color="grey", lw=0.8)
        ax.set_title(f"transfer: {kind}")
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best tok/s / cold best")
        ax.legend(fontsize=6)
    fig.suptitle(f"{rows[0]['evaluator']} evaluator (estimates on stated ceilings)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for transfer.json, transfer.md, transfer.png")
    p.add_argument("--budget", type=int, default=60)
    args = p.parse_args(argv)
    from specpilot.agents.cost_evaluator import CostModelEvaluator

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = study(CostModelEvaluator(), budget=args.budget)
    (out / "transfer.json").write_text(json.dumps(rows, indent=1))
    (out / "transfer.md").write_text(markdown(rows) + "\n")
    plot(rows, out / "transfer.png")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
