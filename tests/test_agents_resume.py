"""Resume after a kill: the killed + resumed run holds exactly the records of an uninterrupted one
(no duplicates, nothing lost); and a hung candidate is killed by the worker timeout."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

from agents_helpers import tiny_target

from specpilot.agents.candidates import Candidate, gemv_candidate
from specpilot.agents.memory import Memory
from specpilot.agents.workers import WorkerPool

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from agents_helpers import FakeForcer
    from specpilot.agents.loop import LoopConfig, run_optimize
    cfg = LoopConfig(target_dir={target!r}, ops=("split12_gemv",), rounds=3, agents=2, per_agent=2,
                     memory_url={mem!r}, timer={{"kind": "fake"}}, resume={resume}, seed=3,
                     shapes=[("a", 96, 64, 2), ("b", 64, 160, 2), ("c", 128, 96, 1)])
    run_optimize(cfg, forcer=FakeForcer(True), log=lambda m: print(m, flush=True))
""")


def _launch(tmp_path, mem, resume, cache):
    code = SCRIPT.format(tests=os.path.dirname(__file__), target=str(tmp_path / "t"), mem=str(mem), resume=resume)
    env = {**os.environ, "SPECPILOT_KERNEL_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _verdict_count(mem) -> int:
    if not mem.exists():
        return 0
    try:
        with sqlite3.connect(str(mem), timeout=5) as db:
            return db.execute("SELECT COUNT(DISTINCT cand_id || round) FROM verdicts").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0


def _records(mem_path):
    m = Memory(str(mem_path))
    run = m.db.execute("SELECT run_id, status FROM runs").fetchall()
    assert len(run) == 1 and run[0]["status"] == "done"
    run_id = run[0]["run_id"]
    rounds = [(r["round"], r["gap_key"], r["winner"], r["status"]) for r in m.rounds(run_id)]
    cands = {r["round"]: [c.cand_id for c in m.round_candidates(run_id, r["round"])] for r in m.rounds(run_id)}
    verdicts = sorted((v["round"], v["cand_id"], v["check_name"], v["passed"]) for v in m.verdict_rows(run_id))
    times = sorted(tuple(r) for r in m.db.execute("SELECT round, cand_id, metric, value FROM measurements"))
    mechs = sorted((x["op"], tuple(x["shape"]), x["cand_id"], x["after_s"]) for x in m.mechanisms())
    return rounds, cands, verdicts, times, mechs


def test_kill_mid_round_then_resume_matches_uninterrupted_run(tmp_path):
    tiny_target(tmp_path / "t")
    clean = _launch(tmp_path, tmp_path / "clean.sqlite", False, tmp_path / "c1" / "k")
    out, _ = clean.communicate(timeout=300)
    assert clean.returncode == 0, out

    victim_mem = tmp_path / "killed.sqlite"
    victim = _launch(tmp_path, victim_mem, False, tmp_path / "c2" / "k")
    deadline = time.monotonic() + 240
    while _verdict_count(victim_mem) < 6 and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim.poll() is None, "the run finished before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)  # the controller and its worker process, mid-round
    victim.wait()
    with sqlite3.connect(str(victim_mem)) as db:
        done = db.execute("SELECT COUNT(*) FROM rounds WHERE status='done'").fetchone()[0]
    assert done < 3

    resumed = _launch(tmp_path, victim_mem, True, tmp_path / "c2" / "k")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resuming run" in out
    assert _records(victim_mem) == _records(tmp_path / "clean.sqlite")


def test_hung_candidate_is_killed_and_the_worker_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "k"))
    hung = Candidate("split12_gemv", (32, 64), "python", "test", {},
                     "import time\n\ndef split12_gemv(*args):\n    while True:\n        time.sleep(1)\n", "hung_kernel")
    honest = gemv_candidate((32, 64), {"threads_per_row": 32, "rows_per_block": 1}, "builtin", "cpu")
    pool = WorkerPool(1, "cpu", timeout_s=4)
    try:
        results = pool.run([{"candidate": c.to_dict(), "device": "cpu", "timer": {"kind": "fake"}}
                            for c in (hung, honest)])
    finally:
        pool.close()
    assert results[0]["verdicts"][0]["check"] == "timeout" and not results[0]["verdicts"][0]["passed"]
    assert all(v["passed"] for v in results[1]["verdicts"])
