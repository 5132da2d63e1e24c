"""One picture of a cost report: each step's time as its components stack up, timed alone beside
their ceilings, so that where a step loses time (and how far the whole step is from its floor) can
be seen at a glance. `specpilot cost --plot FILE.png` draws it."""
from pathlib import Path

# Segment colours by component, in stacking order; a drafter's "draft.x" is drawn as "x".
PARTS = ("qkv", "o", "gate_up", "down", "attention", "lm_head", "fc", "ctx_kv", "accept", "sample", "launches")


def _part(name: str) -> str:
    return name.split(".", 1)[-1]


def plot_steps(report: dict, path) -> Path:
    """report: CostReport.to_dict(). Writes a PNG with two bars per step: components timed alone
    and at their ceilings, stacked in PARTS order and labelled with the step's total in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(report["bounds"]["steps"])
    colours = dict(zip(PARTS, plt.get_cmap("tab20").colors))
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * len(steps)))
    labels, y = [], 0
    for step in steps:
        for column, kind in (("ceiling_s", "at the ceilings"), ("measured_s", "timed alone")):
            left = 0.0
            for part in PARTS:
                ms = 1e3 * sum(r[column] * r["count"] for r in report["rows"]
                               if r["step"] == step and _part(r["name"]) == part)
                if ms > 0:
                    ax.barh(y, ms, left=left, color=colours[part], edgecolor="white", linewidth=0.4,
                            label=part if part not in ax.get_legend_handles_labels()[1] else None)
                    left += ms
            ax.text(left, y, f" {left:.3f} ms", va="center", fontsize=8)
            labels.append(f"{step}, {kind}")
            y += 1
        y += 0.5
    ax.set_yticks([i + (i // 2) * 0.5 for i in range(len(labels))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    ax.legend(fontsize=7, ncol=len(PARTS), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    d, b = report["deployment"], report["bounds"]
    title = (f"{d['target']} + {d['drafter'] or 'no drafter'}, {d['weights']} weights, {d['device_name']}, "
             f"context {d['context']}")
    if "spec_over_ar_at_ceiling" in b:
        title += (f"\nat the ceilings: draft / verify >= {b['draft_over_verify_at_ceiling']:.3f}, "
                  f"spec / AR <= {b['spec_over_ar_at_ceiling']:.2f}x at tau {d['tau']}")
    fig.suptitle(title, fontsize=9, y=1.0)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
