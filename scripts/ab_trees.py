"""Engine step times of two source trees, interleaved: has a refactor made anything slower?

    python scripts/ab_trees.py --tree old=/tmp/sp_old --tree new=/tmp/sp --rounds 2 --out ab.jsonl

Each `--tree NAME=DIR` is a folder that holds an importable `specpilot` package (with its built
extension). Per round, one process per tree (in the order given) builds the Qwen3-8B-shape random pair
on the GPU and, for each weight format, times the graphed AR, verify16 and draft steps and a whole
greedy generation replaying tau 6.49 (bench/step_times.py and bench/scale_models.py of THIS checkout,
loaded by path, so both trees are measured by the same code). The trees only need what has stayed
stable: `Engine(target, drafter, max_seq_len)` with its default configuration, the step runner's
prefill / target_step / draft_step, and generate_spec(replay=AcceptanceReplay(...)).
Prints one JSON row per (tree, round, weights) and a table of medians with new / old ratios last.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
KEYS = ("ar_ms", "verify_ms", "draft_ms", "e2e_spec_tokens_per_s", "e2e_ar_ms_per_token")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"ab_trees_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(args) -> None:
    import torch

    import specpilot
    from specpilot.engine import Engine

    scale, steps = _load("scale_models"), _load("step_times")
    prompt = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    for weights in args.weights.split(","):
        target, drafter = scale.scale_pair(args.preset)
        if weights == "split12":
            scale.to_split12(target, drafter)
        for rep in range(args.reps):
            engine = Engine(target, drafter, max_seq_len=1024)
            row = {"tree": args.name, "round": args.round, "rep": rep, "weights": weights,
                   "package": str(Path(specpilot.__file__).parent), "gpu": torch.cuda.get_device_name()}
            row.update(steps.step_times(engine, drafter.block_size, args.iters, 512))
            gen = steps.replayed_generation(engine, prompt, args.tokens, args.tau)
            row.update({k: v for k, v in gen.items() if k != "e2e_tokens"})
            print("ROW " + json.dumps(row), flush=True)
            del engine
        del target, drafter
        torch.cuda.empty_cache()


def table(rows: list, names: list) -> str:
    lines = [f"| weights | metric | {' | '.join(names)} | {names[-1]} / {names[0]} |", "|---" * (len(names) + 3) + "|"]
    for weights in dict.fromkeys(r["weights"] for r in rows):
        for key in KEYS:
            med = [statistics.median(r[key] for r in rows if r["tree"] == n and r["weights"] == weights)
                   for n in names]
            lines.append(f"| {weights} | {key} | " + " | ".join(f"{m:.4g}" for m in med) + f" | {med[-1] / med[0]:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[], help="NAME=DIR holding an importable specpilot")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=2, help="engines timed per weight format in one process")
    p.add_argument("--weights", default="bf16,split12")
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--tokens", type=int, default=512, help="new tokens of each replayed generation")
    p.add_argument("--tau", type=float, default=6.49)
    p.add_argument("--out", default=None, help="JSONL of every row")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--name", default="", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    trees = [t.split("=", 1) for t in args.tree]
    if len(trees) < 2 or any(len(t) != 2 or not Path(t[1], "specpilot").is_dir() for t in trees):
        p.error(f"--tree NAME=DIR twice or more, each DIR holding specpilot/; got {args.tree}")
    rows = []
    for rnd in range(args.rounds):
        for name, folder in trees:
            env = {**os.environ, "PYTHONPATH": folder + os.pathsep + os.environ.get("PYTHONPATH", "")}
            cmd = [sys.executable, __file__, "--worker", "--name", name, "--round", str(rnd)] + \
                [f"--{k}={getattr(args, k)}" for k in ("reps", "weights", "preset", "iters", "tokens", "tau")]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            got = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
            if done.returncode or not got:
                print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
                raise SystemExit(f"tree {name} ({folder}) failed in round {rnd} (exit {done.returncode})")
            for row in got:
                print(json.dumps(row), flush=True)
            rows += got
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(rows, [name for name, _ in trees]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
