"""`specpilot memory show [--deployment KEY]`: what the agents remember; last line one JSON object."""
import json

from specpilot import settings


def configure(parser):
    parser.add_argument("action", choices=("show",))
    parser.add_argument("--deployment", default=None, help="one deployment key (default: all)")
    parser.add_argument("--memory", default=None, help="SQLite path or sqlite:/// URL (default: settings)")


def run(args) -> int:
    from specpilot.agents.memory import Memory, sqlite_path

    url = args.memory or settings.get().memory_url
    if not sqlite_path(url).exists():            # a fresh install: nothing validated yet, not an error
        print(f"no agent memory yet at {sqlite_path(url)}: `specpilot optimize` writes it")
        return 0
    mem = Memory(url)
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
        out[key] = {"runs": runs, "mechanisms": mechs, "rejections": {r["check_name"]: r["n"] for r in rejected}}
    mem.close()
    print(json.dumps(out, default=str))
    return 0
