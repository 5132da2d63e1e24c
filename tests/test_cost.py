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
    # qkv (2 + 2*1 heads of 32), o, gate_up, down, lm_head of the tiny target at M = 1; the drafter's
    # fc runs at the block's 8 rows (the graphed draft step pads the context to the block)
    assert gemv == {(128, 64), (64, 64), (192, 64), (64, 96)}
    shapes = {(row["step"], row["name"]): row["shape"] for row in r.rows}
    assert {("verify", "qkv"), ("draft", "draft.down"), ("verify", "accept"), ("decode", "attention"),
            ("verify", "launches")} <= set(shapes)
    assert shapes[("draft", "fc")] == [8, 64, 128]           # two target layers' features in
    assert shapes[("draft", "draft.ctx_kv")] == [8, 64, 64]  # the context's K and V (1 KV head of 32)
    for row in r.rows:
        assert row["ceiling_s"] > 0 and row["measured_s"] >= 0
        assert row["lost_per_token_s"] >= 0
    assert any(row["op"] == "engine.block_size" for row in r.actionable())
    from specpilot.cost.shapes import untimed_kernels

    launches = {row["step"]: row["shape"] for row in r.rows if row["kind"] == "launches"}
    assert launches["decode"] == [untimed_kernels("decode", "split12", 2)]     # the tiny target's 2 layers


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


def test_step_bounds_by_hand():
    """decode 1 + 2 = 3 us; verify 4 x 2 = 8 us; draft 1 us (ceilings); measured twice each."""
    from specpilot.cost.gaps import step_bounds

    def row(step, ceiling, count=1, kind="linear"):
        return {"step": step, "kind": kind, "count": count, "ceiling_s": ceiling, "measured_s": 2 * ceiling}

    rows = [row("decode", 1e-6), row("decode", 2e-6), row("verify", 4e-6, count=2), row("draft", 1e-6),
            row("spec", 5.0, kind="knob")]                       # the block-size knob is not a component
    b = step_bounds(rows, tau=3.0)
    assert b["steps"]["decode"] == {"measured_s": 6e-6, "ceiling_s": 3e-6}
    assert abs(b["verify_over_ar_at_ceiling"] - 8 / 3) < 1e-12
    assert abs(b["draft_over_verify_at_ceiling"] - 1 / 8) < 1e-12
    assert abs(b["spec_over_ar_at_ceiling"] - 3.0 * 3 / 9) < 1e-12
    assert abs(b["spec_over_ar_measured"] - 3.0 * 6 / 18) < 1e-12
    assert step_bounds([row("decode", 1e-6)], tau=None) == {"steps": {"decode": {"measured_s": 2e-6, "ceiling_s": 1e-6}}}


def test_cost_cli_prints_the_ceiling_bounds_of_a_pair(tmp_path, capsys):
    t, d = tiny_target(tmp_path / "t"), tiny_drafter(tmp_path / "d", block_size=8)
    assert cli.main(["cost", "--target", str(t), "--drafter", str(d), "--tau", "3", "--quick", "--device", "cpu",
                     "--context", "32"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    bounds = json.loads(out[-1])["bounds"]
    assert set(bounds["steps"]) == {"decode", "draft", "verify"}
    assert 0 < bounds["spec_over_ar_at_ceiling"] <= 3.0 * bounds["steps"]["decode"]["ceiling_s"] / \
        bounds["steps"]["verify"]["ceiling_s"]
    line = next(x for x in out if x.startswith("# every component at its ceiling"))
    assert f"spec / AR <= {bounds['spec_over_ar_at_ceiling']:.2f}x at tau 3.0" in line


def test_cost_cli_draws_the_steps(tmp_path, capsys):
    t, d = tiny_target(tmp_path / "t"), tiny_drafter(tmp_path / "d", block_size=8)
    png = tmp_path / "cost.png"
    assert cli.main(["cost", "--target", str(t), "--drafter", str(d), "--quick", "--device", "cpu",
                     "--context", "32", "--plot", str(png)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert f"# plot: {png}" in out and json.loads(out[-1])["bounds"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
