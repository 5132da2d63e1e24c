"""`specpilot generate / verify --concurrency N` on a tiny random pair (fp32, CPU)."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.cli import main
from specpilot.models.random_ckpt import write_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("batch_cli")
    t, d = write_pair(base, "tiny-llama", layer_ids=[1, 2], block_size=4, seed=fresh_seed())
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": "def f(x):\n"}, {"id": "b", "turns": ["hello there", "second turn"]},
        {"id": "c", "prompt": "import os"}, {"id": "d", "prompt": "x"}]) + "\n")
    return t, d, prompts


def test_generate_concurrency_writes_input_order_and_equals_one_at_a_time(pair, tmp_path, capsys):
    t, d, prompts = pair
    outs = {}
    for n in (1, 3):
        out = tmp_path / f"out{n}.jsonl"
        assert main(["generate", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--device", "cpu",
                     "--dtype", "fp32", "--max-new-tokens", "13", "--concurrency", str(n), "--output", str(out)]) == 0
        outs[n] = [json.loads(line) for line in out.read_text().splitlines()]
    capsys.readouterr()
    assert [r["id"] for r in outs[3]] == ["a", "b", "c", "d"]
    assert outs[3] == outs[1]
    assert all(set(r) == {"id", "tokens", "text"} and r["tokens"] for r in outs[3])


def test_generate_ar_concurrency(pair, tmp_path, capsys):
    t, _, prompts = pair
    outs = {}
    for n in (1, 4):
        out = tmp_path / f"ar{n}.jsonl"
        assert main(["generate", "--target", str(t), "--ar", "--prompts", str(prompts), "--device", "cpu",
                     "--dtype", "fp32", "--max-new-tokens", "9", "--concurrency", str(n), "--output", str(out)]) == 0
        outs[n] = out.read_text()
    capsys.readouterr()
    assert outs[1] == outs[4]


def test_generate_bad_concurrency(pair, capsys):
    t, d, prompts = pair
    assert main(["generate", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--device", "cpu",
                 "--concurrency", "0"]) == 2
    assert "--concurrency 0 must be an int >= 1" in capsys.readouterr().err


def test_verify_concurrency_passes_and_reports(pair, capsys):
    t, d, prompts = pair
    rc = main(["verify", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--limit", "3",
               "--max-new-tokens", "12", "--device", "cpu", "--dtype", "fp32", "--concurrency", "3"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"] is True, printed[-3000:]
    assert out["batched"]["identical_full_verify"] == out["batched"]["identical_all_mechanisms"] == 3
    assert out["batched"]["judged"] is True and out["spec_identical"] == 3
    assert "batched at concurrency 3: identical to the single-request engine on 3/3 prompts" in printed


def test_verify_fails_a_batched_output_that_differs_in_fp32():
    """judge_batched's verdict can fail: a batched run whose tokens differ from the single engine's."""
    from types import SimpleNamespace

    import torch

    from specpilot.verify.batched import judge_batched

    single = SimpleNamespace(tokens=[1, 2, 3])
    engine = SimpleNamespace(target=SimpleNamespace(dtype=torch.float32), generate_spec=lambda *a, **k: single)
    report = SimpleNamespace(reasons=[], passed=True)
    other = SimpleNamespace(tokens=[1, 2, 4], tau=1.0)
    summary = judge_batched(report, engine, [[5]], ["p"], 3, 2, [single], [other], (), None)
    assert report.passed is False and "all-mechanisms" in report.reasons[0] and "['p']" in report.reasons[0]
    assert summary["identical_full_verify"] == 1 and summary["identical_all_mechanisms"] == 0
