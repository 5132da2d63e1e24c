"""--tree-budget on the CLI (CPU, fp32, the zoo's dense pair: real acceptance, so tree steps differ
from stock's): `verify` passes (the steps are not judged against stock's, the tokens are), `generate`
reports the budget and tau, and the batched engine refuses trees."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot import cli, settings

ZOO = settings.get().zoo


@pytest.fixture(scope="module")
def pair_args():
    target, drafter = ZOO / "code-tiny", ZOO / "code-tiny-dflash-b16"
    if not (target / "config.json").exists():
        pytest.skip(f"the zoo pair is not at {ZOO}")
    return ["--target", str(target), "--drafter", str(drafter), "--prompts", str(ZOO / "prompts" / "pystdlib.jsonl"),
            "--limit", "1", "--max-new-tokens", "32", "--device", "cpu", "--dtype", "fp32"]


def test_verify_passes_with_a_tree(pair_args, capsys):
    assert cli.main(["verify", *pair_args, "--tree-budget", "16"]) == 0, capsys.readouterr().out[-2000:]
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert lines[-2].startswith("verdict: PASS") and report["spec_identical"] == 1
    assert report["acceptance_judged"] is False


def test_generate_reports_the_budget_and_tau(pair_args, capsys):
    assert cli.main(["generate", *pair_args, "--tree-budget", "32"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tree_budget"] == 32 and summary["tau"] > 1


def test_batched_runs_refuse_trees(pair_args, capsys):
    assert cli.main(["generate", *pair_args, "--tree-budget", "8", "--concurrency", "2"]) != 0
    assert "--tree-budget" in capsys.readouterr().err
