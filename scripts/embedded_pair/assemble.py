"""Copies a trained pair into the package folder (python/specpilot/data/pair): the target's and the
drafter's Hugging Face files, train_stats.json (both trainings and the held-out measurement) and the
first --demo-prompts held-out prompts for `specpilot demo` (final newline removed, see below)."""
import argparse
import json
import shutil
from pathlib import Path

TARGET_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
DRAFTER_FILES = ("config.json", "model.safetensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", required=True, help="build.sh's work folder: target/, drafter/, data/, measure.json")
    ap.add_argument("--dest", required=True)
    ap.add_argument("--demo-prompts", type=int, default=8)
    ap.add_argument("--earlier-drafter-runs", default="", help="comma list of work subfolders the drafter continued")
    a = ap.parse_args()
    work, dest = Path(a.work), Path(a.dest)
    for sub, names in (("target", TARGET_FILES), ("drafter", DRAFTER_FILES)):
        (dest / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copyfile(work / sub / name, dest / sub / name)
    target = json.loads((work / "target" / "train_stats.json").read_text())
    corpus = target.pop("corpus")
    drafter = json.loads((work / "drafter" / "train_stats.json").read_text())
    drafter["earlier_runs"] = [json.loads((work / run / "train_stats.json").read_text())
                               for run in a.earlier_drafter_runs.split(",") if run]
    measure = json.loads((work / "measure.json").read_text())
    earlier = work / "continued_from.json"            # build.sh INIT=...: the pair this one continued
    if earlier.exists():
        target["continued_from"] = json.loads(earlier.read_text())
    stats = {"target": target, "drafter": drafter,
             "corpus": {k: corpus[k] for k in ("python", "n_docs", "text_mib", "n_tokens", "val_tokens",
                                               "heldout_stdlib_files", "dropped_overlap", "top_packages_mib")},
             "heldout": measure["summary"]}
    (dest / "train_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    # Without their final newline: the byte-level split merges "\n" with the next line's indentation,
    # so a prompt ending in a bare "\n" mostly makes the model stop at once (the zoo README's limitation).
    rows = [json.loads(line) for line in (work / "data" / "prompts" / "pystdlib.jsonl").read_text().splitlines()]
    rows = [{**r, "prompt": r["prompt"].rstrip("\n")} for r in rows[:a.demo_prompts]]
    (dest / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"wrote {dest}: {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
