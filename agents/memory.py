"""The agents' structured memory: SQLite (WAL), one writer (the controller), idempotent keys.

Every record has a natural key (run, round, candidate id, check), so replaying a step after a kill
rewrites the same rows instead of adding new ones; each step commits in one transaction, so a kill
leaves either all of a step or none of it. Tables: deployments, runs, gaps, rounds, candidates,
round_candidates, verdicts, measurements, mechanisms (validated, with evidence), transfers; and for the
mechanism search (agents/mechanism_search.py): mech_evals (every configuration evaluated, its gain,
verdict and rejection reasons) and mech_winners (the best configuration per deployment and evaluator).
"""
import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (key TEXT PRIMARY KEY, info TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, deployment TEXT NOT NULL, args TEXT NOT NULL,
  status TEXT NOT NULL, started REAL NOT NULL, finished REAL);
CREATE TABLE IF NOT EXISTS gaps (run_id TEXT, gap_key TEXT, deployment TEXT, op TEXT, shape TEXT,
  measured_s REAL, ceiling_s REAL, lost_per_token_s REAL, actionable INTEGER, info TEXT,
  PRIMARY KEY (run_id, gap_key));
CREATE TABLE IF NOT EXISTS rounds (run_id TEXT, round INTEGER, gap_key TEXT, status TEXT,
  winner TEXT, before_s REAL, after_s REAL, integrated INTEGER, note TEXT, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS candidates (cand_id TEXT PRIMARY KEY, op TEXT, shape TEXT, kind TEXT,
  proposer TEXT, label TEXT, params TEXT, source TEXT, created REAL);
CREATE TABLE IF NOT EXISTS round_candidates (run_id TEXT, round INTEGER, cand_id TEXT, position INTEGER,
  PRIMARY KEY (run_id, round, cand_id));
CREATE TABLE IF NOT EXISTS verdicts (run_id TEXT, round INTEGER, cand_id TEXT, check_name TEXT,
  passed INTEGER, reason TEXT, PRIMARY KEY (run_id, round, cand_id, check_name));
CREATE TABLE IF NOT EXISTS measurements (run_id TEXT, round INTEGER, cand_id TEXT, metric TEXT,
  value REAL, label TEXT, PRIMARY KEY (run_id, round, cand_id, metric));
CREATE TABLE IF NOT EXISTS mechanisms (deployment TEXT, op TEXT, shape TEXT, cand_id TEXT, label TEXT,
  params TEXT, before_s REAL, after_s REAL, integrated INTEGER, evidence TEXT, updated REAL,
  PRIMARY KEY (deployment, op, shape));
CREATE TABLE IF NOT EXISTS transfers (run_id TEXT, op TEXT, shape TEXT, from_deployment TEXT,
  cand_id TEXT, PRIMARY KEY (run_id, op, shape));
CREATE TABLE IF NOT EXISTS mech_evals (run_id TEXT, seq INTEGER, deployment TEXT, config TEXT, changed TEXT,
  evaluator TEXT, tokens_per_s REAL, gain REAL, verdict TEXT, reasons TEXT, label TEXT, created REAL,
  PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS mech_winners (deployment TEXT, evaluator TEXT, run_id TEXT, config TEXT,
  tokens_per_s REAL, baseline_tokens_per_s REAL, verdict TEXT, transferred_from TEXT, updated REAL,
  PRIMARY KEY (deployment, evaluator));
"""


def sqlite_path(url: str) -> Path:
    """A filesystem path or a sqlite:/// URL -> the database path."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    if "://" in url:
        raise ValueError(f"memory URL {url!r}: only a file path or sqlite:///PATH is supported")
    return Path(url)


class Memory:
    def __init__(self, url: str):
        self.path = sqlite_path(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    @contextmanager
    def tx(self):
        """One atomic step: everything inside commits together or not at all."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self):
        self.db.close()

    # ---- deployments and runs -----------------------------------------------------------------
    def upsert_deployment(self, key: str, info: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO deployments VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET info=excluded.info",
                       (key, json.dumps(info, sort_keys=True), time.time()))

    def deployments(self) -> dict:
        return {r["key"]: json.loads(r["info"]) for r in self.db.execute("SELECT * FROM deployments")}

    def start_run(self, run_id: str, deployment: str, args: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?, 'running', ?, NULL)",
                       (run_id, deployment, json.dumps(args, sort_keys=True, default=str), time.time()))

    def finish_run(self, run_id: str, status: str = "done") -> None:
        with self.tx() as db:
            db.execute("UPDATE runs SET status=?, finished=? WHERE run_id=?", (status, time.time(), run_id))

    def last_unfinished_run(self, deployment: str) -> str | None:
        row = self.db.execute("SELECT run_id FROM runs WHERE deployment=? AND status!='done' "
                              "ORDER BY started DESC LIMIT 1", (deployment,)).fetchone()
        return row["run_id"] if row else None

    def run_args(self, run_id: str) -> dict:
        row = self.db.execute("SELECT args FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return json.loads(row["args"]) if row else {}

    # ---- gaps and rounds ----------------------------------------------------------------------
    def record_gaps(self, run_id: str, deployment: str, gaps: list) -> None:
        with self.tx() as db:
            for g in gaps:
                db.execute("INSERT OR REPLACE INTO gaps VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (run_id, g["key"], deployment, g["op"], json.dumps(g["shape"]), g["measured_s"],
                            g["ceiling_s"], g["lost_per_token_s"], int(g["actionable"]), json.dumps(g)))

    def gaps(self, run_id: str) -> list:
        rows = self.db.execute("SELECT info FROM gaps WHERE run_id=? ORDER BY lost_per_token_s DESC", (run_id,))
        return [json.loads(r["info"]) for r in rows]

    def rounds(self, run_id: str) -> list:
        return [dict(r) for r in self.db.execute("SELECT * FROM rounds WHERE run_id=? ORDER BY round", (run_id,))]

    def record_proposals(self, run_id: str, rnd: int, gap_key: str, candidates: list) -> None:
        """The round's candidate list, fixed before any evaluation (a resume re-uses it)."""
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO rounds VALUES (?, ?, ?, 'proposed', NULL, NULL, NULL, 0, '')",
                       (run_id, rnd, gap_key))
            for i, c in enumerate(candidates):
                self._insert_candidate(db, c)
                db.execute("INSERT OR IGNORE INTO round_candidates VALUES (?, ?, ?, ?)", (run_id, rnd, c.cand_id, i))

    def _insert_candidate(self, db, c) -> None:
        db.execute("INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?,?,?,?,?)",
                   (c.cand_id, c.op, json.dumps(list(c.shape)), c.kind, c.proposer, c.label,
                    json.dumps(c.params, sort_keys=True), c.source, time.time()))

    def round_candidates(self, run_id: str, rnd: int) -> list:
        from specpilot.agents.candidates import Candidate

        rows = self.db.execute(
            "SELECT c.* FROM round_candidates rc JOIN candidates c ON c.cand_id = rc.cand_id "
            "WHERE rc.run_id=? AND rc.round=? ORDER BY rc.position", (run_id, rnd))
        return [Candidate(r["op"], tuple(json.loads(r["shape"])), r["kind"], r["proposer"],
                          json.loads(r["params"]), r["source"], r["label"]) for r in rows]

    def evaluated(self, run_id: str, rnd: int) -> dict:
        """cand_id -> {'passed': bool, 'time_s': float | None} for candidates already judged."""
        out = {}
        for r in self.db.execute("SELECT cand_id, MIN(passed) AS ok FROM verdicts WHERE run_id=? AND round=? "
                                 "GROUP BY cand_id", (run_id, rnd)):
            t = self.db.execute("SELECT value FROM measurements WHERE run_id=? AND round=? AND cand_id=? "
                                "AND metric='time_s'", (run_id, rnd, r["cand_id"])).fetchone()
            out[r["cand_id"]] = {"passed": bool(r["ok"]), "time_s": t["value"] if t else None}
        return out

    def record_evaluation(self, run_id: str, rnd: int, candidate, verdicts: list, measurements: dict,
                          label: str = "") -> None:
        with self.tx() as db:
            self._insert_candidate(db, candidate)
            for v in verdicts:
                db.execute("INSERT OR REPLACE INTO verdicts VALUES (?,?,?,?,?,?)",
                           (run_id, rnd, candidate.cand_id, v["check"], int(v["passed"]), v.get("reason", "")))
            for metric, value in measurements.items():
                db.execute("INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?)",
                           (run_id, rnd, candidate.cand_id, metric, value, label))

    def finish_round(self, run_id: str, rnd: int, winner, before_s, after_s, integrated: bool, note: str,
                     mechanism: dict | None) -> None:
        """Close a round and (same transaction) store its validated mechanism."""
        with self.tx() as db:
            db.execute("UPDATE rounds SET status='done', winner=?, before_s=?, after_s=?, integrated=?, note=? "
                       "WHERE run_id=? AND round=?", (winner, before_s, after_s, int(integrated), note, run_id, rnd))
            if mechanism:
                m = mechanism
                # the best validated result per mechanism: integrated beats kernel-validated only,
                # then the faster; a slower or less validated result never overwrites it
                db.execute("INSERT INTO mechanisms VALUES (?,?,?,?,?,?,?,?,?,?,?) "
                           "ON CONFLICT(deployment, op, shape) DO UPDATE SET cand_id=excluded.cand_id, "
                           "label=excluded.label, params=excluded.params, before_s=excluded.before_s, "
                           "after_s=excluded.after_s, integrated=excluded.integrated, evidence=excluded.evidence, "
                           "updated=excluded.updated WHERE excluded.integrated > mechanisms.integrated OR "
                           "(excluded.integrated = mechanisms.integrated AND excluded.after_s < mechanisms.after_s)",
                           (m["deployment"], m["op"], json.dumps(list(m["shape"])), m["cand_id"], m["label"],
                            json.dumps(m["params"], sort_keys=True), m["before_s"], m["after_s"],
                            int(m["integrated"]), json.dumps(m.get("evidence", {}), sort_keys=True), time.time()))

    # ---- mechanisms and transfer --------------------------------------------------------------
    def mechanisms(self, deployment: str | None = None) -> list:
        q, args = "SELECT * FROM mechanisms", ()
        if deployment:
            q, args = q + " WHERE deployment=?", (deployment,)
        rows = []
        for r in self.db.execute(q + " ORDER BY deployment, op, shape", args):
            d = dict(r)
            d["shape"], d["params"], d["evidence"] = json.loads(d["shape"]), json.loads(d["params"]), json.loads(d["evidence"])
            rows.append(d)
        return rows

    def candidate(self, cand_id: str):
        from specpilot.agents.candidates import Candidate

        r = self.db.execute("SELECT * FROM candidates WHERE cand_id=?", (cand_id,)).fetchone()
        return None if r is None else Candidate(r["op"], tuple(json.loads(r["shape"])), r["kind"], r["proposer"],
                                                json.loads(r["params"]), r["source"], r["label"])

    def record_transfer(self, run_id: str, op: str, shape, from_deployment: str, cand_id: str) -> None:
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO transfers VALUES (?,?,?,?,?)",
                       (run_id, op, json.dumps(list(shape)), from_deployment, cand_id))

    def transfers(self, run_id: str) -> list:
        return [dict(r) for r in self.db.execute("SELECT * FROM transfers WHERE run_id=?", (run_id,))]

    def verdict_rows(self, run_id: str | None = None) -> list:
        q = "SELECT v.*, c.label, c.proposer FROM verdicts v JOIN candidates c ON c.cand_id = v.cand_id"
        args = ()
        if run_id:
            q, args = q + " WHERE v.run_id=?", (run_id,)
        return [dict(r) for r in self.db.execute(q + " ORDER BY v.run_id, v.round, v.cand_id", args)]

    def gap_history(self, run_id: str, gap_key: str) -> list:
        """[(Candidate, passed, time_s, reason)] of every judged candidate of this gap in this run."""
        out = []
        for r in self.db.execute("SELECT round FROM rounds WHERE run_id=? AND gap_key=? ORDER BY round", (run_id, gap_key)):
            judged = self.evaluated(run_id, r["round"])
            for c in self.round_candidates(run_id, r["round"]):
                if c.cand_id in judged:
                    out.append((c, judged[c.cand_id]["passed"], judged[c.cand_id]["time_s"],
                                self.first_failure(run_id, r["round"], c.cand_id)))
        return out

    def first_failure(self, run_id: str, rnd: int, cand_id: str) -> str:
        row = self.db.execute("SELECT check_name, reason FROM verdicts WHERE run_id=? AND round=? AND cand_id=? "
                              "AND passed=0 LIMIT 1", (run_id, rnd, cand_id)).fetchone()
        return f"{row['check_name']}: {row['reason']}" if row else ""

    # ---- the mechanism search ------------------------------------------------------------------
    def record_mech_eval(self, run_id: str, seq: int, deployment: str, config: dict, changed: dict, evaluator: str,
                         tokens_per_s, gain, verdict: str, reasons: list, label: str = "") -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO mech_evals VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (run_id, seq, deployment, json.dumps(config, sort_keys=True), json.dumps(changed, sort_keys=True),
                        evaluator, tokens_per_s, gain, verdict, json.dumps(reasons), label, time.time()))

    def mech_evals(self, deployment: str | None = None, run_id: str | None = None) -> list:
        q, args, where = "SELECT * FROM mech_evals", [], []
        if deployment:
            where.append("deployment=?"), args.append(deployment)
        if run_id:
            where.append("run_id=?"), args.append(run_id)
        q += (" WHERE " + " AND ".join(where)) if where else ""
        rows = []
        for r in self.db.execute(q + " ORDER BY created, run_id, seq", args):
            d = dict(r)
            d["config"], d["changed"], d["reasons"] = json.loads(d["config"]), json.loads(d["changed"]), json.loads(d["reasons"])
            rows.append(d)
        return rows

    def record_mech_winner(self, deployment: str, evaluator: str, run_id: str, config: dict, tokens_per_s: float,
                           baseline_tokens_per_s: float, verdict: str, transferred_from: str | None) -> None:
        """The best configuration per (deployment, evaluator); a slower one never replaces it."""
        with self.tx() as db:
            db.execute("INSERT INTO mech_winners VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(deployment, evaluator) DO UPDATE "
                       "SET run_id=excluded.run_id, config=excluded.config, tokens_per_s=excluded.tokens_per_s, "
                       "baseline_tokens_per_s=excluded.baseline_tokens_per_s, verdict=excluded.verdict, "
                       "transferred_from=excluded.transferred_from, updated=excluded.updated "
                       "WHERE excluded.tokens_per_s > mech_winners.tokens_per_s",
                       (deployment, evaluator, run_id, json.dumps(config, sort_keys=True), tokens_per_s,
                        baseline_tokens_per_s, verdict, transferred_from, time.time()))

    def mech_winners(self, evaluator: str | None = None) -> list:
        q, args = "SELECT * FROM mech_winners", ()
        if evaluator:
            q, args = q + " WHERE evaluator=?", (evaluator,)
        rows = []
        for r in self.db.execute(q + " ORDER BY deployment", args):
            d = dict(r)
            d["config"] = json.loads(d["config"])
            rows.append(d)
        return rows

    def export(self) -> dict:
        """Every table as lists of rows (JSON-able): `specpilot memory export FILE`."""
        tables = [r["name"] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: [dict(r) for r in self.db.execute(f"SELECT * FROM {t}")] for t in tables}
