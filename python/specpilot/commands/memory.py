"""`specpilot memory show [--deployment KEY]`: what the agents remember; last line one JSON object.
`specpilot memory export FILE`: every table of the memory as one JSON file."""
import json

from specpilot import settings


def configure(parser):
    parser.add_argument("action", choices=("show", "export"))
    parser.add_argument("file", nargs="?", default=None, help="export: the JSON file to write")
    parser.add_argument("--deployment", default=None, help="one deployment key (default: all)")
    parser.add_argument("--memory", default=None, help="SQLite path or sqlite:/// URL (default: settings)")


def run(args) -> int:
    from specpilot.agents.memory import Memory, sqlite_path

    url = args.memory or settings.get().memory_url
    if not sqlite_path(url).exists():            # a fresh install: nothing validated yet, not an error
        print(f"no agent memory yet at {sqlite_path(url)}: `specpilot optimize` writes it")
        return 0
    if args.action == "export" and not args.file:
        raise ValueError("specpilot memory export needs a FILE to write")
    mem = Memory(url)
    if args.action == "export":
        from pathlib import Path

        data = mem.export()
        Path(args.file).write_text(json.dumps(data, indent=1, default=str))
        mem.close()
        print(json.dumps({"exported": args.file, "rows": {t: len(rows) for t, rows in data.items()}}))
        return 0
    deps = mem.deployments()
    if args.deployment and args.deployment not in deps:
        raise ValueError(f"unknown deployment {args.deployment!r}; known: {sorted(deps)}")
    keys = [args.deployment] if args.deployment else sorted(deps)
    out = {}
    for key in keys:
        runs = [dict(r) for r in mem.db.execute("SELECT run_id, status, started FROM runs WHERE deployment=? "
                                                "ORDER BY started", (key,))]
        mechs = mem.mechanisms(key)
        rejected = mem.db.execute("SELECT v.check_name, COUNT(*) AS n FROM verdicts v JOIN runs r ON r.run_id = v.run_id "
                                  "WHERE r.deployment=? AND v.passed=0 GROUP BY v.check_name", (key,)).fetchall()
        print(f"== {key}")
        listed = ", ".join(f"{r['run_id']} ({r['status']})" for r in runs) or "none"
        print(f"   runs: {listed}")
        for m in mechs:
            speed = f"{m['before_s'] / m['after_s']:.2f}x" if m["before_s"] and m["after_s"] else "-"
            print(f"   mechanism {m['op']} {'x'.join(map(str, m['shape'])) or '-'}: {m['label']} "
                  f"{(m['after_s'] or 0) * 1e6:.2f} us ({speed}), integrated={bool(m['integrated'])}")
        for r in rejected:
            print(f"   rejected by {r['check_name']}: {r['n']}")
        winners, evals = _mechanism_search(mem, key)
        out[key] = {"runs": runs, "mechanisms": mechs, "rejections": {r["check_name"]: r["n"] for r in rejected},
                    "mechanism_winners": winners, "mechanism_evaluations": evals}
    mem.close()
    print(json.dumps(out, default=str))
    return 0


def _mechanism_search(mem, key) -> tuple:
    """Prints the mechanism search's winners and verdict counts for one deployment."""
    winners = [w for w in mem.mech_winners() if w["deployment"] == key]
    for w in winners:
        on = ", ".join(f"{k}={v}" for k, v in sorted(w["config"].items()))
        speed = w["tokens_per_s"] / w["baseline_tokens_per_s"] if w["baseline_tokens_per_s"] else float("nan")
        print(f"   mechanism winner ({w['evaluator']}, {w['verdict']}): {w['tokens_per_s']:.1f} tok/s, {speed:.2f}x "
              f"the start" + (f", started from {w['transferred_from']}" if w["transferred_from"] else "") + f": {on}")
    evals = mem.mech_evals(deployment=key)
    counts = {}
    for e in evals:
        counts[e["verdict"]] = counts.get(e["verdict"], 0) + 1
        if e["verdict"] not in ("pass", "estimate"):
            print(f"   mechanism candidate {e['changed']} {e['verdict']}: {'; '.join(e['reasons'])[:200]}")
    if evals:
        print(f"   mechanism evaluations: {len(evals)} ({', '.join(f'{k} {n}' for k, n in sorted(counts.items()))})")
    return winners, {"count": len(evals), "verdicts": counts}
