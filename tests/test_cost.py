"""The cost model on the CPU for a tiny config: components by shape, CPU ceilings, ranked gaps."""
import json

from agents_helpers import tiny_drafter, tiny_target

from specpilot import cli
from specpilot.cost import cost_report


def test_cost_report_ranks_gaps_and_lists_each_gemm(tmp_path):
    t, d = tiny_target(tmp_path / "t"), tiny_drafter(tmp_path / "d", block_size=8)
    r = cost_report(t, d, batch=1, tau=3.0, context=64, device="cpu", quick=True)
    lost = [row["lost_per_token_s"] for row in r.rows]
    assert lost == sorted(lost, reverse=True)
    assert r.ceilings.device == "cpu" and r.ceilings.copy_bandwidth > 0 and r.ceilings.launch_s > 0
    gemv = {tuple(row["shape"]) for row in r.actionable(["split12_gemv"])}
    # qkv (2 + 2*1 heads of 32), o, gate_up, down, lm_head of the tiny target at M = 1, and the
    # drafter's fc (two target layers' features in) at M = batch
    assert gemv == {(128, 64), (64, 64), (192, 64), (64, 96), (64, 128)}
    names = {(row["step"], row["name"]) for row in r.rows}
    assert {("verify", "qkv"), ("draft", "fc"), ("draft", "draft.down"), ("verify", "accept"),
            ("decode", "attention"), ("verify", "launches")} <= names
    for row in r.rows:
        assert row["ceiling_s"] > 0 and row["measured_s"] >= 0
        assert row["lost_per_token_s"] >= 0
    assert any(row["op"] == "engine.block_size" for row in r.actionable())


def test_cost_cli_prints_a_table_and_one_json_line(tmp_path, capsys):
    t = tiny_target(tmp_path / "t")
    assert cli.main(["cost", "--target", str(t), "--quick", "--device", "cpu", "--context", "32"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "CPU times against CPU ceilings" in out[1]
    payload = json.loads(out[-1])
    assert payload["deployment"]["target"] == "t" and payload["rows"]


def test_cost_cli_names_a_bad_folder(tmp_path, capsys):
    assert cli.main(["cost", "--target", str(tmp_path / "missing")]) == 2
    assert "config.json" in capsys.readouterr().err
