"""Writing a benchmark run: rows.jsonl, report.md (tables), report.png (speedups + tau histogram),
traces.json (the acceptance recorded by the run, replayable in the scale tier).
Every report opens with the fidelity tier, device, dtype and versions (`run_info`)."""
import importlib.metadata
import json
import math
import os
import platform
from pathlib import Path

from .hf_baseline import STATIC_CACHE_BUCKET
from .metrics import summarize

LABELS = {"hf_ar": "HF AR", "hf_static": "HF static", "our_ar": "our AR", "stock": "stock DFlash",
          "our_spec": "our spec"}
SPEEDUP_LABELS = {"our_spec/hf_ar": "ours / HF AR", "our_spec/our_ar": "ours / our AR",
                  "stock/hf_ar": "stock / HF AR (dflash's)", "our_ar/hf_ar": "our AR / HF AR",
                  "our_spec/hf_static": "ours / HF static", "our_spec/stock": "ours / stock"}
TIERS = {"real": "real acceptance (trained pair, measured tau)",
         "scale": "scale (real shapes, random weights; acceptance replayed from the stated trace, else measured)",
         "correctness": "correctness (tiny random pair: timings and tau mean nothing)"}


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("specpilot", "transformers", "dflash"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # e.g. a package staged on PYTHONPATH
            out[name] = getattr(__import__(name), "__version__", None) if name == "specpilot" else None
    return out


def device_name(device) -> str:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"{device} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _fmt(x, spec=".2f", none="–"):
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def header(info: dict) -> str:
    lines = [f"# SpecPilot benchmark ({info['date']})", "",
             f"- **Fidelity tier: {TIERS.get(info['tier'], info['tier'])}**"]
    if info.get("stopped"):
        lines.append(f"- **Stopped early** by `{info['stopped']}`: these are the rows measured before it")
    if info.get("replay"):
        lines.append(f"- Replayed acceptance trace (our spec only): {info['replay']}")
    elif info["tier"] == "scale":
        lines.append("- No replay: acceptance is measured (random weights accept ~nothing)")
    lines += [f"- Device: {info['device']}; dtype: {info['dtype']}; our weight format: {info['weights']}",
              f"- Target: `{info['target']}`; drafter: `{info['drafter']}`; block size {info['block_size']}",
              f"- Greedy, max new tokens {info['max_new_tokens']}, limit {info['limit']} per benchmark "
              f"(DFlash's Random(42) selection); methods: {', '.join(info['methods'])}; "
              f"timed calls per prompt: {info.get('repeats', 1)} (fastest kept)",
              *(["- HF static: a StaticCache per prompt of its length + max new tokens, rounded up to "
                 f"{STATIC_CACHE_BUCKET} slots (HF attends over every slot at every step); its decode "
                 "step is compiled untimed for each new length"] if "hf_static" in info["methods"] else []),
              "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
              "- tok/s = 1 / mean over prompts of decode time per new token; tau = mean over prompts of "
              "the mean acceptance length (bonus included), as dflash's benchmark prints them; speedup = "
              "ratio of mean time per token on the same prompts; `all` pools every prompt", ""]
    return "\n".join(lines)


def main_table(summary: dict) -> str:
    methods = [m for m in LABELS if any(m in s["methods"] for s in summary.values())]
    spec = [m for m in ("stock", "our_spec") if m in methods]
    speedups = [k for k in SPEEDUP_LABELS if any(k in s["speedups"] for s in summary.values())]
    agree = [k for k in ("our_spec/stock", "our_ar/hf_ar")
             if any(k in s["agreement"] for s in summary.values())]
    cols = (["benchmark", "prompts"] + [f"{LABELS[m]} tok/s" for m in methods]
            + [f"tau {LABELS[m]}" for m in spec] + [SPEEDUP_LABELS[k] for k in speedups]
            + [f"{LABELS[k.split('/')[0]]} = {LABELS[k.split('/')[1]]}" for k in agree])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, s in summary.items():
        prompts = max(v["prompts"] for v in s["methods"].values())
        cells = [name, str(prompts)]
        cells += [_fmt(s["methods"][m]["tokens_per_s"], ".1f") if m in s["methods"] else "–" for m in methods]
        cells += [_fmt(s["methods"][m]["tau"]) if m in s["methods"] else "–" for m in spec]
        cells += [_fmt(s["speedups"].get(k)) + ("x" if s["speedups"].get(k) else "") for k in speedups]
        cells += [("%d/%d" % s["agreement"][k]) if s["agreement"].get(k) else "–" for k in agree]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def histogram_table(summary: dict, block_size: int) -> str:
    out = ["| benchmark | method | steps | " + " | ".join(str(i) for i in range(1, block_size + 1)) + " |",
           "|" + "---|" * (block_size + 3)]
    for name, s in summary.items():
        for m, counts in s["histograms"].items():
            total = sum(counts)
            shares = [f"{100 * c / total:.1f}%" for c in counts]
            out.append(f"| {name} | {LABELS.get(m, m)} | {total} | " + " | ".join(shares) + " |")
    return "\n".join(out)


def replay_note(summary: dict) -> str:
    """Replayed steps the target did not accept as planned (timings still follow the trace)."""
    notes = [f"{name} {LABELS.get(m, m)}: {v['replay_shortfalls']}" for name, s in summary.items()
             for m, v in s["methods"].items() if v.get("replay_shortfalls") is not None]
    return ("\n\nReplay shortfalls (steps whose forced drafts the target rejected early): "
            + "; ".join(notes)) if notes else ""


def markdown(summary: dict, info: dict) -> str:
    return (header(info) + "\n## Throughput, acceptance, speedups\n\n" + main_table(summary) + replay_note(summary)
            + "\n\n## Acceptance length histogram (share of verify steps producing 1..B tokens)\n\n"
            + histogram_table(summary, info["block_size"]) + "\n")


def plot(summary: dict, info: dict, path: Path) -> Path:
    """Left: speedup bars per benchmark; right: tau histogram of the pooled run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(summary)
    keys = [k for k in ("our_spec/hf_static", "our_spec/hf_ar", "our_spec/our_ar", "stock/hf_ar")
            if any(summary[n]["speedups"].get(k) for n in names)]
    width = 0.8 / max(1, len(keys))
    top = 1.0
    for j, k in enumerate(keys):
        vals = [summary[n]["speedups"].get(k) or 0.0 for n in names]
        bars = ax1.bar([i + j * width for i in range(len(names))], vals, width, label=SPEEDUP_LABELS[k])
        ax1.bar_label(bars, fmt="%.2f", fontsize=7)
        top = max(top, *vals)
    ax1.set_ylim(0, top * 1.25)  # headroom for the legend above the bars
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(names))], names)
    ax1.set_ylabel("speedup (x)")
    ax1.set_title(f"speedup per benchmark [{info['tier']} tier]")
    if keys:
        ax1.legend(fontsize=8, loc="upper left", ncol=len(keys))
    pooled = summary[names[-1]] if names else {"histograms": {}}
    bs = info["block_size"]
    hists = pooled["histograms"]
    for j, (m, counts) in enumerate(hists.items()):
        total = sum(counts) or 1
        tau = pooled["methods"][m]["tau"]
        ax2.bar([x + j * 0.4 for x in range(1, bs + 1)], [c / total for c in counts], 0.4,
                label=f"{LABELS.get(m, m)} (tau {_fmt(tau)})")
    ax2.set_xlabel("tokens per verify step")
    ax2.set_ylabel("share of steps")
    ax2.set_title(f"acceptance histogram ({names[-1] if names else 'none'})")
    if hists:
        ax2.legend(fontsize=8)
    fig.suptitle(f"{info['device']} | {info['dtype']}, our weights {info.get('weights', info['dtype'])} | "
                 f"target {str(info['target'])}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def write_all(rows: list[dict], info: dict, out_dir: Path) -> tuple[str, dict]:
    """rows.jsonl, report.md, report.png, run_info.json into out_dir; returns (markdown, summary)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, info["block_size"])
    write_jsonl(rows, out_dir / "rows.jsonl")
    text = markdown(summary, info)
    (out_dir / "report.md").write_text(text)
    (out_dir / "run_info.json").write_text(json.dumps({**info, "summary": summary}, indent=1, default=str))
    plot(summary, info, out_dir / "report.png")
    return text, summary
