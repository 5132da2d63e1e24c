"""bench/tree_projection.py: the tree's projected speed over the chain from step times and a tau gain."""
import json

import pytest

from specpilot.bench.tree_projection import main, projection

STEPS = {"preset": "x", "device": "d", "steps": [
    {"nodes": 16, "chain_graphed_ms": 6.0, "tree_graphed_ms": 6.5, "commit_graphed_ms": 1.0},
    {"nodes": 32, "chain_graphed_ms": 7.0, "tree_graphed_ms": 7.5, "commit_graphed_ms": 0.5}]}
TAU = {"target": "t", "dtype": "fp32", "budgets": {"0": {"tau_vs_chain": 1.0}, "16": {"tau_vs_chain": 1.25},
                                                   "32": {"tau_vs_chain": 1.5}, "64": {"tau_vs_chain": 1.6}}}


def test_projection_is_the_tau_gain_times_the_step_ratio():
    rows = projection(STEPS, TAU, other_ms=2.0, chain_commit_ms=0.25)
    # chain: the block's chain verify (N = 16: 6.0) + its commit + the shared draft/host time
    assert [r["nodes"] for r in rows] == [16, 32]          # 64 has no step times, 0 is the chain
    assert rows[0]["chain_step_ms"] == rows[1]["chain_step_ms"] == pytest.approx(8.25)
    assert rows[0]["tree_step_ms"] == pytest.approx(9.5) and rows[1]["tree_step_ms"] == pytest.approx(10.0)
    assert rows[0]["projected"] == pytest.approx(1.25 * 8.25 / 9.5)
    assert rows[1]["projected"] == pytest.approx(1.5 * 8.25 / 10.0)


def test_missing_inputs_are_named(tmp_path, capsys):
    with pytest.raises(ValueError, match="no graphed chain verify of the block"):
        projection(STEPS, TAU, 1.0, block=8)
    with pytest.raises(ValueError, match="no tree budget in both files"):
        projection(STEPS, {"budgets": {"0": {"tau_vs_chain": 1.0}, "8": {"tau_vs_chain": 1.1}}}, 1.0)
    (tmp_path / "s.json").write_text(json.dumps(STEPS))
    (tmp_path / "t.json").write_text(json.dumps(TAU))
    assert main(["--steps", str(tmp_path / "s.json"), "--tau", str(tmp_path / "t.json"), "--other-ms", "2"]) == 0
    assert "| 16 | 1.250 | 8.00 | 9.50 | 1.053 |" in capsys.readouterr().out
