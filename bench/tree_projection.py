"""Issue 34's scale-tier projection: end-to-end speed of tree verification against the chain's, from
step times measured at a scale shape (bench/tree_steps.py's JSON) and the tree's acceptance gain
measured on a real pair (bench/tree_tau.py's JSON):

    python -m specpilot.bench.tree_projection --steps tree_steps_qwen3-8b.json \\
        --tau tree_tau_code-tiny.json --other-ms 1.565 [--chain-commit-ms 0] [--block 16]

A step of either loop is draft + verify + commit, plus the host between; both draft the same block, so
the draft and host time (--other-ms, measured beside: a drafter_steps or hybrid_steps figure) is
shared. Chain step = the graphed chain verify of one block (tree_steps' row of N = --block) +
--chain-commit-ms + other. Tree step of N nodes = the graphed tree verify (its packing and copy
included) + its graphed commit + other. Projected tree / chain tokens per second =
(tau_tree / tau_chain) x chain step / tree step. Not in it: building the tree from the draft's
distributions on the host, which only an overlapped loop hides (the tiny real pairs, where nothing
hides it, measure trees below the chain end to end: docs/trees.md).
"""
from __future__ import annotations

import argparse
import json


def projection(steps: dict, tau: dict, other_ms: float, chain_commit_ms: float = 0.0, block: int = 16) -> list:
    """Rows {nodes, tau_gain, chain_step_ms, tree_step_ms, projected}, one per tree budget that both
    files have (tree_steps' `steps` by `nodes`, tree_tau's `budgets` with `tau_vs_chain`)."""
    by_nodes = {row["nodes"]: row for row in steps["steps"]}
    if block not in by_nodes or "chain_graphed_ms" not in by_nodes[block]:
        raise ValueError(f"the step times have no graphed chain verify of the block ({block} rows): "
                         f"nodes {sorted(by_nodes)}")
    chain = by_nodes[block]["chain_graphed_ms"] + chain_commit_ms + other_ms
    rows = []
    for budget, measured in sorted((int(b), m) for b, m in tau["budgets"].items()):
        if budget == 0 or budget not in by_nodes:
            continue
        row = by_nodes[budget]
        tree = row["tree_graphed_ms"] + row["commit_graphed_ms"] + other_ms
        gain = measured["tau_vs_chain"]
        rows.append({"nodes": budget, "tau_gain": gain, "chain_step_ms": chain, "tree_step_ms": tree,
                     "projected": gain * chain / tree})
    if not rows:
        raise ValueError(f"no tree budget in both files: tau budgets {sorted(tau['budgets'])}, nodes {sorted(by_nodes)}")
    return rows


def markdown(rows: list, steps: dict, tau: dict) -> str:
    head = [f"{steps.get('preset', '?')} step times on {steps.get('device', '?')}; tau gain of "
            f"{tau.get('target', '?')} ({tau.get('dtype', '?')})", "",
            "| N | tau tree / chain | chain step ms | tree step ms | projected tree / chain tok/s |",
            "| --- | --- | --- | --- | --- |"]
    return "\n".join(head + [f"| {r['nodes']} | {r['tau_gain']:.3f} | {r['chain_step_ms']:.2f} | "
                             f"{r['tree_step_ms']:.2f} | {r['projected']:.3f} |" for r in rows]) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specpilot.bench.tree_projection", description=__doc__.split("\n")[0])
    p.add_argument("--steps", required=True, help="bench/tree_steps.py's JSON (scale shape, graphed)")
    p.add_argument("--tau", required=True, help="bench/tree_tau.py's JSON (a real pair's tau per budget)")
    p.add_argument("--other-ms", type=float, required=True,
                   help="the step's draft and host time, shared by both loops (measured beside)")
    p.add_argument("--chain-commit-ms", type=float, default=0.0,
                   help="the chain's commit (a hybrid's state copy; 0 for a dense target)")
    p.add_argument("--block", type=int, default=16, help="the chain's verify block")
    args = p.parse_args(argv)
    with open(args.steps) as f:
        steps = json.load(f)
    with open(args.tau) as f:
        tau = json.load(f)
    rows = projection(steps, tau, args.other_ms, args.chain_commit_ms, args.block)
    print(markdown(rows, steps, tau))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
