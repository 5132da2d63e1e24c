"""The run's markdown report, built from memory only (so a resumed run reports everything)."""
from collections import Counter
from pathlib import Path


def _us(t) -> str:
    return f"{t * 1e6:.2f}" if t else "-"


def render_report(memory, run_id: str, deployment: str, ceilings: dict | None = None) -> str:
    rounds = memory.rounds(run_id)
    verdicts = memory.verdict_rows(run_id)
    by_round = {}
    for v in verdicts:
        by_round.setdefault(v["round"], {}).setdefault(v["cand_id"], []).append(v)
    lines = [f"# specpilot optimize: run {run_id}", "", f"Deployment: `{deployment}`", ""]
    labels = Counter(r["label"] for r in memory.db.execute(
        "SELECT DISTINCT cand_id, label FROM measurements WHERE run_id=? AND metric='time_s'", (run_id,)))
    if labels:
        fake = " (fake = injected, not measured)" if "fake" in labels else ""
        lines += [f"Timings: {', '.join(f'{k} ({n})' for k, n in labels.items())}{fake}", ""]
    if "cpu-wall" in labels or "fake" in labels or deployment.startswith("cpu|"):
        lines += ["CPU run: these timings exercise the loop's plumbing (gates, memory, integration); "
                  "they are not kernel results.", ""]

    lines += ["## Before / after per gap", "",
              "| gap | ceiling us | before us | after us | speedup | of roofline | best variant | integrated |",
              "|---|---|---|---|---|---|---|---|"]
    per_gap = {}
    for r in rounds:
        per_gap.setdefault(r["gap_key"], []).append(r)
    for key, rs in per_gap.items():
        before = next((r["before_s"] for r in rs if r["before_s"]), None)
        done = [r for r in rs if r["status"] == "done" and r["after_s"] and r["winner"]]  # a re-timed incumbent is no "after"
        best = min(done, key=lambda r: r["after_s"]) if done else None
        after = best["after_s"] if best else None
        ceiling = (ceilings or {}).get(key)
        winner = memory.candidate(best["winner"]) if best and best["winner"] else None
        label = winner.label if winner else "incumbent kept"
        integrated = "yes" if any(r["integrated"] for r in rs) else "no"
        speed = f"{before / after:.2f}x" if before and after else "-"
        frac = f"{100 * ceiling / after:.0f}%" if ceiling and after else "-"
        lines.append(f"| {key} | {_us(ceiling)} | {_us(before)} | {_us(after)} | {speed} | {frac} | {label} | {integrated} |")

    lines += ["", "## Rounds", "", "| round | gap | candidates | passed | rejected | winner | before -> after us | note |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        cands = by_round.get(r["round"], {})
        passed = sum(1 for vs in cands.values() if all(v["passed"] for v in vs))
        winner = memory.candidate(r["winner"]).label if r["winner"] else "-"
        lines.append(f"| {r['round']} | {r['gap_key']} | {len(cands)} | {passed} | {len(cands) - passed} | {winner} | "
                     f"{_us(r['before_s'])} -> {_us(r['after_s'])} | {r['note']} |")

    reasons = Counter(v["check_name"] for v in verdicts if not v["passed"])
    if reasons:
        lines += ["", "## Rejections by gate check", ""] + [f"- {k}: {n}" for k, n in reasons.most_common()]
    transfers = memory.transfers(run_id)
    if transfers:
        lines += ["", "## Transferred mechanisms", ""]
        judged = {}
        for v in verdicts:
            judged.setdefault(v["cand_id"], []).append(v["passed"])
        winners = {r["winner"] for r in rounds if r["winner"]}
        for t in transfers:
            ok = judged.get(t["cand_id"])
            status = "not judged yet" if ok is None else ("passed the gates here" if all(ok) else "rejected here")
            won = "; it won its round" if t["cand_id"] in winners else ""
            label = memory.candidate(t["cand_id"]).label if memory.candidate(t["cand_id"]) else t["cand_id"]
            lines.append(f"- {t['op']} {t['shape']}: {label} from `{t['from_deployment']}`: {status}{won}")
    return "\n".join(lines) + "\n"


def write_report(memory, run_id: str, deployment: str, state, out_dir) -> dict:
    ceilings = {g.key: g.ceiling_s for g in state.gaps.values()} if state is not None else None
    text = render_report(memory, run_id, deployment, ceilings)
    path = None
    if out_dir:
        path = Path(out_dir) / f"optimize-{run_id}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"markdown": text, "path": str(path) if path else None}
