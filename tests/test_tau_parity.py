"""bench/tau_parity: the pooled statistics are right, bad input is named, and on the zoo pair (fp32) the
comparison reports parity for the honest engine and catches planted engines that lose acceptance or
change the output."""
import json

import numpy as np
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot import settings
from specpilot.bench import tau_parity as tp


def row(set_name, stock_acc, our_acc, stock_tokens=None, our_tokens=None, pid="p"):
    stock_tokens = stock_tokens if stock_tokens is not None else list(range(sum(stock_acc) + 1))
    our_tokens = our_tokens if our_tokens is not None else list(range(sum(our_acc) + 1))
    return tp.compare_prompt(set_name, pid, [1, 2, 3], stock_tokens, stock_acc, our_tokens, our_acc)


def test_first_difference():
    assert tp.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert tp.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert tp.first_difference([1, 2], [1, 2, 3]) == 2
    assert tp.first_difference([], [4]) == 0


def test_compare_prompt_rejects_an_inconsistent_record():
    with pytest.raises(ValueError, match="ours produced 4 tokens but its acceptance lengths sum to 2"):
        tp.compare_prompt("s", "p", [1], [0, 1, 2], [2], [0, 1, 2, 3], [1, 1])


def test_pooled_taus_by_hand():
    rows = [row("a", [1, 3], [2, 2]),          # taus 2 / 2, tokens 4 / 4 in 2 steps each
            row("a", [4], [2, 1, 1]),          # taus 4 / 1.333, tokens 4 / 4 in 1 / 3 steps
            row("b", [], [])]                  # first token was a stop token: no tau
    s = tp.pooled_stats(rows, seed=1)
    assert s["with_tau"] == 2 and s["no_step"] == 1
    assert s["stock_tau"]["value"] == pytest.approx(3.0)
    assert s["our_tau"]["value"] == pytest.approx((2 + 4 / 3) / 2)
    assert s["diff_tau"]["value"] == pytest.approx((2 + 4 / 3) / 2 - 3.0)
    assert s["stock_tau_weighted"]["value"] == pytest.approx(8 / 3)
    assert s["our_tau_weighted"]["value"] == pytest.approx(8 / 5)
    assert s["diff_tau_weighted"]["value"] == pytest.approx(8 / 5 - 8 / 3)
    # two prompts: every resample is (0,0), (0,1), (1,1) or (1,0); the CI spans the one-prompt taus
    assert s["stock_tau"]["lo"] == pytest.approx(2.0) and s["stock_tau"]["hi"] == pytest.approx(4.0)
    assert s["diff_tau"]["lo"] == pytest.approx(4 / 3 - 4) and s["diff_tau"]["hi"] == pytest.approx(0.0)


def test_bootstrap_is_seeded_and_paired():
    rng = np.random.default_rng(7)
    accs = [[int(x) for x in rng.integers(2, 9, size=rng.integers(3, 30))] for _ in range(60)]
    same = [row("a", a, a) for a in accs]
    s = tp.pooled_stats(same, seed=3)
    assert s == tp.pooled_stats(same, seed=3)
    assert s != tp.pooled_stats(same, seed=4)
    lo, hi = s["stock_tau"]["lo"], s["stock_tau"]["hi"]
    assert lo < s["stock_tau"]["value"] < hi
    # paired: identical sides give a difference of exactly 0 in every resample
    assert s["diff_tau"] == {"value": 0.0, "lo": 0.0, "hi": 0.0}
    # ours splits every prompt's first step in two (same tokens, one step more): the paired CI lies below 0
    worse = [row("a", a, [a[0] - 1, 1] + a[1:]) for a in accs]
    d = tp.pooled_stats(worse, seed=3)["diff_tau"]
    assert d["hi"] < 0 and d["lo"] <= d["value"] <= d["hi"]


def test_summary_counts_identical_outputs_and_acceptance_per_set():
    rows = [row("a", [2, 2], [2, 2]), row("a", [2, 2], [1, 1, 2]), row("b", [3], [3], our_tokens=[0, 1, 9, 3])]
    s = tp.summarize(rows)
    assert (s["all"]["prompts"], s["all"]["identical_outputs"], s["all"]["identical_acceptance"]) == (3, 2, 1)
    assert s["sets"]["a"]["identical_acceptance"] == 1 and s["sets"]["b"]["identical_outputs"] == 0
    only = s["identical_outputs_only"]
    assert (only["prompts"], only["identical_acceptance"]) == (2, 1)
    assert only["diff_tau"]["value"] == pytest.approx((4 / 3 - 2) / 2)
    assert rows[1]["first_step_difference"] == 0 and rows[2]["first_token_difference"] == 2
    text = tp.markdown(s, rows, {"seed": 0})
    assert "| a | p | 2 | 2 2 | 1 1 2 | 0 |" in text             # side by side, first differing step
    assert "| b | p | 4 | 4 | 2 | 3.00 | 3.00 |" in text          # the different output, first token 2
    late = row("c", [1] * 20 + [3, 1], [1] * 20 + [2, 2])
    assert "| c | p | 22 | … 1 1 3 1 | … 1 1 2 2 | 20 |" in tp.side_by_side([late], steps=12)


def test_resolve_sets_first_folder_wins_and_names_a_missing_set(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    for folder in ("x", "y"):
        (tmp_path / folder / "s.jsonl").write_text('{"id": "1", "prompt": "a"}\n')
    folders = [tmp_path / "x", tmp_path / "y"]
    assert tp.resolve_sets(folders, ["s"]) == [("s", tmp_path / "x" / "s.jsonl")]
    with pytest.raises(FileNotFoundError, match="prompt set 'nope': no nope.jsonl"):
        tp.resolve_sets(folders, ["s", "nope"])
    with pytest.raises(ValueError, match="--sets names s more than once"):
        tp.resolve_sets(folders, ["s", "s"])


def test_bad_arguments_are_named(capsys):
    common = ["--target", "t", "--drafter", "d", "--datasets", "x", "--sets", "s", "--out", "o", "--device", "cpu"]
    for extra, message in ((["--limit", "0"], "--limit must be >= 1"),
                           (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
                           (["--time-budget", "-1"], "--time-budget must be > 0")):
        with pytest.raises(SystemExit):
            tp.parse_args(common + extra)
        assert message in capsys.readouterr().err


zoo = pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair (SPECPILOT_ZOO) is not present")


def zoo_argv(out, tokens=24, limit=2):
    tdir, ddir = settings.zoo_pair()
    prompts = tdir.parent / "prompts"
    return ["--target", str(tdir), "--drafter", str(ddir), "--datasets", str(prompts),
            "--sets", "humaneval,pystdlib", "--limit", str(limit), "--max-new-tokens", str(tokens),
            "--device", "cpu", "--dtype", "fp32", "--out", str(out), "--plot"]


def read_rows(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


@zoo
def test_zoo_pair_fp32_reports_parity_and_prompts_as_verify_encodes_them(tmp_path, capsys):
    from specpilot.models import load_tokenizer
    from specpilot.models.prompts import encode_prompt, read_prompts

    assert tp.main(zoo_argv(tmp_path)) == 0
    rows = read_rows(tmp_path)
    assert [r["set"] for r in rows] == ["humaneval", "pystdlib", "humaneval", "pystdlib"]      # round-robin
    tok = load_tokenizer(settings.zoo_pair()[0])
    prompts = settings.zoo_pair()[0].parent / "prompts"
    want = [len(encode_prompt(tok, p)) for i in range(2) for s in ("humaneval", "pystdlib")
            for p in [read_prompts(prompts / f"{s}.jsonl", 2)[i]]]
    assert [r["prompt_len"] for r in rows] == want
    assert all(r["identical"] and r["acceptance_identical"] for r in rows), [r["id"] for r in rows]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert summary["all"]["diff_tau"] == {"value": 0.0, "lo": 0.0, "hi": 0.0}
    assert summary["all"]["identical_acceptance"] == 4
    with_tau = sum(bool(r["stock_acceptance"]) for r in rows)     # HumanEval/1 starts with the stop token
    assert summary["all"]["with_tau"] == with_tau and summary["all"]["no_step"] == 4 - with_tau
    assert f"| all | 4 | {with_tau} | 4 | 4 |" in capsys.readouterr().out
    assert (tmp_path / "scatter.png").stat().st_size > 0


@pytest.fixture
def host_control(monkeypatch):
    """The graphed step takes its next control from the host (no early launch), so a planted host-side
    accept rule steers the run instead of tripping the position check."""
    from test_verify_planted import host_control as engines_take_host_control

    engines_take_host_control(monkeypatch)


@zoo
def test_zoo_pair_catches_an_engine_that_accepts_too_few_drafts(tmp_path, monkeypatch, host_control):
    """Lossless output, fewer tokens per step: outputs identical, acceptance not, our tau below stock's."""
    from specpilot.engine.replay import GreedyAcceptance

    monkeypatch.setattr(GreedyAcceptance, "accepted", lambda self, step, verify_size, matched: min(matched, 1))
    assert tp.main(zoo_argv(tmp_path, limit=1)) == 0
    rows = read_rows(tmp_path)
    assert all(r["identical"] for r in rows) and not any(r["acceptance_identical"] for r in rows)
    assert all(max(r["our_acceptance"]) <= 2 < max(r["stock_acceptance"]) for r in rows)
    diff = json.loads((tmp_path / "summary.json").read_text())["summary"]["all"]["diff_tau"]
    assert diff["hi"] < 0


@zoo
def test_zoo_pair_catches_a_wrong_bonus_token(tmp_path, monkeypatch, host_control):
    from specpilot.engine import accept, spec

    def shifted_bonus(block, posterior, accepted):
        new = accept.new_tokens(block, posterior, accepted)
        return new[:-1] + [new[-1] + 1]

    monkeypatch.setattr(spec, "new_tokens", shifted_bonus)
    assert tp.main(zoo_argv(tmp_path, limit=1)) == 0
    rows = read_rows(tmp_path)
    assert not any(r["identical"] for r in rows)
    assert all(r["first_token_difference"] == r["stock_acceptance"][0] for r in rows)   # the first bonus
    assert "## Different outputs" in (tmp_path / "report.md").read_text()


def test_compare_drafts_finds_the_first_flipped_row_and_its_margins():
    from specpilot.bench.tau_parity_probe import bf16_ulp, compare_drafts

    stock = torch.tensor([[5.0, 1.0, 0.0], [8.5, 8.4375, 0.0], [0.0, 3.0, 2.0]])
    ours = stock.clone()
    ours[1, 1] = 8.5625                       # row 1's top two swap by two bf16 ulps (0.0625 at 8.5)
    ours[2, 2] = 3.5                          # row 2 flips too, later
    d = compare_drafts(stock, ours)
    assert (d["row"], d["differing_rows"], d["draft_rows"]) == (1, 2, 3)
    assert d["stock_top2"]["ids"] == [0, 1] and d["our_top2"]["ids"] == [1, 0]
    assert d["stock_gap"] == pytest.approx(0.0625) and d["our_gap"] == pytest.approx(0.0625)
    assert d["stock_gap_ulps"] == pytest.approx(1.0) and d["choices_noise"] == pytest.approx(0.125)
    assert d["max_abs_logit_diff"] == pytest.approx(1.5)
    assert compare_drafts(stock, stock)["row"] is None
    assert bf16_ulp(8.5) == 0.0625 and bf16_ulp(1.0) == 2 ** -7
    tie = torch.tensor([[1.0, 7.0, 7.0, 2.0]])   # an exact tie: argmax takes the first index, both sides alike
    d = compare_drafts(tie, torch.tensor([[1.0, 7.0, 7.0625, 2.0]]))
    assert d["stock_top2"] == {"ids": [1, 2], "logits": [7.0, 7.0], "margin": 0.0}
    assert d["our_top2"]["ids"] == [2, 1] and (d["stock_gap"], d["stock_gap_ulps"]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="draft logits of different shapes"):
        compare_drafts(stock, stock[:2])


def test_step_of_token():
    from specpilot.bench.tau_parity_probe import step_of_token

    acc = [3, 1, 2]                           # tokens 1-3 from step 0, 4 from step 1, 5-6 from step 2
    assert [step_of_token(acc, t) for t in range(8)] == [-1, 0, 0, 0, 1, 2, 2, 3]
    assert step_of_token(acc, None) is None


@zoo
def test_zoo_pair_probe_clears_the_drafter_when_the_accept_rule_is_broken(tmp_path, monkeypatch, host_control):
    """The planted short acceptance leaves the drafts alone: the probe finds them equal at the first
    differing step (fp32: not one logit moved) instead of blaming the drafter."""
    from specpilot.engine.replay import GreedyAcceptance

    monkeypatch.setattr(GreedyAcceptance, "accepted", lambda self, step, verify_size, matched: min(matched, 1))
    assert tp.main(zoo_argv(tmp_path, limit=1) + ["--probe", "1"]) == 0
    probed = [r for r in read_rows(tmp_path) if "draft_probe" in r]
    assert len(probed) == 1
    p = probed[0]["draft_probe"]
    assert p["stock_reproduced"] and p["stepwise_reproduced"] and p["step"] == probed[0]["first_step_difference"]
    assert p["row"] is None and p["max_abs_logit_diff"] == 0.0
    assert "the drafts agree" in (tmp_path / "report.md").read_text()


@zoo
def test_zoo_pair_time_budget_stops_cleanly(tmp_path):
    assert tp.main(zoo_argv(tmp_path, tokens=8) + ["--time-budget", "0.001"]) == 0
    assert len(read_rows(tmp_path)) == 1                     # the first prompt always runs
    info = json.loads((tmp_path / "summary.json").read_text())["info"]
    assert info["prompts run"] == "1 of 4 (stopped by --time-budget)"
    assert "stopped by --time-budget" in (tmp_path / "report.md").read_text()


def test_device_cuda_without_one_is_named(capsys):
    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    with pytest.raises(SystemExit):
        tp.parse_args(["--target", "t", "--drafter", "d", "--datasets", "x", "--sets", "s", "--out", "o",
                       "--device", "cuda"])
    assert "--device cuda: this torch sees no CUDA device" in capsys.readouterr().err
