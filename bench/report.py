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
from .metrics import base_and_format, summarize

LABELS = {"hf_ar": "HF AR", "hf_static": "HF static", "our_ar": "our AR", "stock": "stock DFlash",
          "our_spec": "our spec"}
SPEEDUP_LABELS = {"our_spec/hf_ar": "ours / HF AR", "our_spec/our_ar": "ours / our AR",
                  "stock/hf_ar": "stock / HF AR (dflash's)", "our_ar/hf_ar": "our AR / HF AR",
                  "our_spec/hf_static": "ours / HF static", "our_spec/stock": "ours / stock"}
TIERS = {"real": "real acceptance (trained pair, measured tau)",
         "scale": "scale (real shapes, random weights; acceptance replayed from the stated trace, else measured)",
         "correctness": "correctness (tiny random pair: timings and tau mean nothing)"}


def label(method: str) -> str:
    """"our_spec@split12" -> "our spec (split12)"."""
    base, fmt = base_and_format(method)
    return LABELS.get(base, base) + (f" ({fmt})" if fmt else "")


def speedup_label(key: str) -> str:
    """"our_spec@split12/hf_static" -> "ours / HF static (split12)"; formats compared with each
    other read "our spec (split12) / our spec (bf16)"."""
    a, b = key.split("/")
    (ba, fa), (bb, fb) = base_and_format(a), base_and_format(b)
    text = SPEEDUP_LABELS.get(f"{ba}/{bb}")
    if text is None or (fa and fb and fa != fb):
        return f"{label(a)} / {label(b)}"
    return text + (f" ({fa or fb})" if fa or fb else "")


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


def _table(summary: dict, cols: list[str], cells) -> str:
    """One row per benchmark: its name, then cells(name, s) under cols."""
    out = ["| benchmark | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    out += ["| " + " | ".join([name] + cells(s)) + " |" for name, s in summary.items()]
    return "\n".join(out)


def throughput_table(summary: dict) -> str:
    methods = list(dict.fromkeys(m for s in summary.values() for m in s["methods"]))
    spec = [m for m in methods if base_and_format(m)[0] in ("stock", "our_spec")]
    return _table(summary, ["prompts"] + [f"{label(m)} tok/s" for m in methods] + [f"tau {label(m)}" for m in spec],
                  lambda s: [str(max(v["prompts"] for v in s["methods"].values()))]
                  + [_fmt(s["methods"][m]["tokens_per_s"], ".1f") if m in s["methods"] else "–" for m in methods]
                  + [_fmt(s["methods"][m]["tau"]) if m in s["methods"] else "–" for m in spec])


def speedup_table(summary: dict) -> str:
    keys = list(dict.fromkeys(k for s in summary.values() for k in s["speedups"]))
    return _table(summary, [speedup_label(k) for k in keys],
                  lambda s: [_fmt(s["speedups"].get(k)) + ("x" if s["speedups"].get(k) else "") for k in keys])


def agreement_table(summary: dict) -> str:
    keys = list(dict.fromkeys(k for s in summary.values() for k in s["agreement"]))
    return _table(summary, [" = ".join(label(m) for m in k.split("/")) for k in keys],
                  lambda s: [("%d/%d" % s["agreement"][k]) if s["agreement"].get(k) else "–" for k in keys])


def tables(summary: dict) -> str:
    """The three per-benchmark tables, each under its heading (a wide run, e.g. two weight formats,
    stays readable)."""
    parts = [("Throughput and acceptance", throughput_table(summary)), ("Speedups", speedup_table(summary))]
    if any(v for s in summary.values() for v in s["agreement"].values()):
        parts.append(("Identical outputs (prompts whose tokens are the same, of those run by both)",
                      agreement_table(summary)))
    return "\n\n".join(f"## {title}\n\n{table}" for title, table in parts)


def histogram_table(summary: dict, block_size: int) -> str:
    out = ["| benchmark | method | steps | " + " | ".join(str(i) for i in range(1, block_size + 1)) + " |",
           "|" + "---|" * (block_size + 3)]
    for name, s in summary.items():
        for m, counts in s["histograms"].items():
            total = sum(counts)
            shares = [f"{100 * c / total:.1f}%" for c in counts]
            out.append(f"| {name} | {label(m)} | {total} | " + " | ".join(shares) + " |")
    return "\n".join(out)


def replay_note(summary: dict) -> str:
    """Replayed steps the target did not accept as planned (timings still follow the trace)."""
    notes = [f"{name} {label(m)}: {v['replay_shortfalls']}" for name, s in summary.items()
             for m, v in s["methods"].items() if v.get("replay_shortfalls") is not None]
    return ("\n\nReplay shortfalls (steps whose forced drafts the target rejected early): "
            + "; ".join(notes)) if notes else ""


def scale_outputs_note(summary: dict, info: dict) -> str:
    """Why a scale-tier run's identical-output counts say little about correctness."""
    if info["tier"] != "scale" or not any(v for s in summary.values() for v in s["agreement"].values()):
        return ""
    return ("\n\nIdentical outputs at scale: random weights give flat logits, so two correct bf16 computations "
            "break some near-tie within a long output and fork from there"
            + (", and replay overrides our spec's drafts" if info.get("replay") else "")
            + ". The correctness check is `specpilot verify` (token forcing against stock).")


def markdown(summary: dict, info: dict) -> str:
    return (header(info) + "\n" + tables(summary) + scale_outputs_note(summary, info) + replay_note(summary)
            + "\n\n## Acceptance length histogram (share of verify steps producing 1..B tokens)\n\n"
            + histogram_table(summary, info["block_size"]) + "\n")


PLOTTED = ("our_spec/hf_static", "our_spec/hf_ar", "our_spec/our_ar", "stock/hf_ar")


def _plotted_speedups(summary: dict) -> list[str]:
    """The speedup keys the plot shows, in PLOTTED's order: each format's against the baselines,
    not formats against each other (the table has those)."""
    def bases(key):
        return "/".join(base_and_format(m)[0] for m in key.split("/"))

    keys = dict.fromkeys(k for s in summary.values() for k in s["speedups"])
    return sorted((k for k in keys if bases(k) in PLOTTED
                   and len({base_and_format(m)[1] for m in k.split("/")} - {None}) <= 1),
                  key=lambda k: PLOTTED.index(bases(k)))


def plot(summary: dict, info: dict, path: Path) -> Path:
    """Left: speedup bars per benchmark; right: tau histogram of the pooled run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(summary)
    keys = _plotted_speedups(summary)
    width = 0.8 / max(1, len(keys))
    top = 1.0
    for j, k in enumerate(keys):
        vals = [summary[n]["speedups"].get(k) or 0.0 for n in names]
        bars = ax1.bar([i + j * width for i in range(len(names))], vals, width, label=speedup_label(k))
        ax1.bar_label(bars, fmt="%.2f", fontsize=7)
        top = max(top, *vals)
    ax1.set_ylim(0, top * 1.35)  # headroom for the legend above the bars
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(names))], names)
    ax1.set_ylabel("speedup (x)")
    ax1.set_title(f"speedup per benchmark [{info['tier']} tier]")
    if keys:
        ax1.legend(fontsize=8, loc="upper left", ncol=min(2, len(keys)))
    pooled = summary[names[-1]] if names else {"histograms": {}}
    bs = info["block_size"]
    hists = pooled["histograms"]
    hwidth = 0.8 / max(1, len(hists))
    for j, (m, counts) in enumerate(hists.items()):
        total = sum(counts) or 1
        tau = pooled["methods"][m]["tau"]
        xs = [x + (j - (len(hists) - 1) / 2) * hwidth for x in range(1, bs + 1)]
        ax2.bar(xs, [c / total for c in counts], hwidth,
                label=f"{label(m)} (tau {_fmt(tau)})")
    ax2.set_xticks(range(1, bs + 1))
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
