"""Memory: idempotent records, URL forms, and `specpilot memory show`."""
import json

import pytest

from specpilot import cli
from specpilot.agents.candidates import gemv_candidate
from specpilot.agents.memory import Memory, sqlite_path


def test_records_are_idempotent_and_transactions_atomic(tmp_path):
    m = Memory(f"sqlite:///{tmp_path / 'm.sqlite'}")
    m.upsert_deployment("d", {"gpu": "cpu"})
    m.start_run("r", "d", {"seed": 1})
    cands = [gemv_candidate((64, 64), {"threads_per_row": t, "rows_per_block": 1}, "builtin", "cpu") for t in (32, 64)]
    for _ in range(2):  # a replay after a kill writes the same rows again
        m.record_proposals("r", 0, "g", cands)
        m.record_evaluation("r", 0, cands[0], [{"check": "decode", "passed": True}], {"time_s": 1e-6})
    assert [c.cand_id for c in m.round_candidates("r", 0)] == [c.cand_id for c in cands]
    assert m.db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 1
    assert m.evaluated("r", 0) == {cands[0].cand_id: {"passed": True, "time_s": 1e-6}}
    with pytest.raises(RuntimeError):
        with m.tx() as db:
            db.execute("INSERT INTO verdicts VALUES ('r', 0, 'x', 'decode', 1, '')")
            raise RuntimeError("killed mid-step")
    assert m.db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 1
    assert m.last_unfinished_run("d") == "r"
    m.finish_run("r")
    assert m.last_unfinished_run("d") is None


def test_memory_url_forms(tmp_path):
    assert sqlite_path(f"sqlite:///{tmp_path}/a.db") == tmp_path / "a.db"
    assert sqlite_path(str(tmp_path / "b.db")) == tmp_path / "b.db"
    with pytest.raises(ValueError, match="postgres"):
        sqlite_path("postgres://host/db")


def test_memory_show_cli(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    m = Memory(str(path))
    m.upsert_deployment("cpu|t|none|b1|bsdefault", {"gpu": "cpu"})
    m.start_run("r1", "cpu|t|none|b1|bsdefault", {})
    c = gemv_candidate((64, 64), {"threads_per_row": 32, "rows_per_block": 2}, "builtin", "cpu")
    m.record_proposals("r1", 0, "split12_gemv:64x64", [c])
    m.record_evaluation("r1", 0, c, [{"check": "roofline", "passed": False, "reason": "suspect"}], {})
    m.finish_round("r1", 0, c.cand_id, 2e-6, 1e-6, False, "n", {
        "deployment": "cpu|t|none|b1|bsdefault", "op": "split12_gemv", "shape": (64, 64), "cand_id": c.cand_id,
        "label": c.label, "params": c.params, "before_s": 2e-6, "after_s": 1e-6, "integrated": False})
    m.close()
    assert cli.main(["memory", "show", "--memory", str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("tpr32-rpb2" in line and "2.00x" in line for line in out)
    data = json.loads(out[-1])
    assert data["cpu|t|none|b1|bsdefault"]["rejections"] == {"roofline": 1}
    assert cli.main(["memory", "show", "--memory", str(path), "--deployment", "nope"]) == 2


def test_a_slower_or_less_validated_result_never_replaces_the_best(tmp_path):
    m = Memory(str(tmp_path / "m.sqlite"))
    m.upsert_deployment("d", {"gpu": "cpu"})
    m.start_run("r", "d", {})

    def close(rnd, cand_id, after_s, integrated):
        m.record_proposals("r", rnd, "g", [])
        m.finish_round("r", rnd, cand_id, 2e-6, after_s, integrated, "", {
            "deployment": "d", "op": "split12_gemv", "shape": (64, 64), "cand_id": cand_id, "label": cand_id,
            "params": {}, "before_s": 2e-6, "after_s": after_s, "integrated": integrated})

    close(0, "fast", 1.0e-6, True)
    close(1, "slower", 1.5e-6, True)          # slower: ignored
    close(2, "faster-unforced", 0.5e-6, False)  # faster but not integrated: ignored
    assert [x["cand_id"] for x in m.mechanisms("d")] == ["fast"]
    close(3, "faster", 0.8e-6, True)          # faster and integrated: replaces
    (best,) = m.mechanisms("d")
    assert best["cand_id"] == "faster" and best["after_s"] == 0.8e-6
