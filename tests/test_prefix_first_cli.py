"""`--two-level prefix-first [--verify-prefix P]` on generate / verify with --concurrency N > 1 (a tiny
random pair, fp32, CPU), and its refusals."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.cli import main
from specpilot.models.random_ckpt import write_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("prefix_first_cli")
    t, d = write_pair(base, "tiny-llama", layer_ids=[1, 2], block_size=6, seed=fresh_seed())
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": "def f(x):\n"}, {"id": "b", "prompt": "hello there"}, {"id": "c", "prompt": "x"}]) + "\n")
    return ["--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--device", "cpu", "--dtype", "fp32"]


def generate(pair, tmp_path, *extra) -> list:
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.jsonl"
    assert main(["generate", *pair, "--max-new-tokens", "13", "--output", str(out), *extra]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_generate_prefix_first_equals_one_at_a_time(pair, tmp_path, capsys, temperature):
    sampling = ["--temperature", temperature, "--seed", "3"]
    alone = generate(pair, tmp_path, *sampling)
    for prefix in ([], ["--verify-prefix", "2"]):
        assert generate(pair, tmp_path, "--concurrency", "3", "--two-level", "prefix-first", *prefix, *sampling) == alone
    capsys.readouterr()


def test_verify_prefix_first_passes(pair, capsys):
    rc = main(["verify", *pair, "--limit", "3", "--max-new-tokens", "12", "--concurrency", "3",
               "--two-level", "prefix-first", "--verify-prefix", "1"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"] is True, printed[-3000:]
    assert out["batched"]["identical_all_mechanisms"] == 3


@pytest.mark.parametrize("args, message", [
    (["--two-level", "prefix-first"], "runs on the batched engine only"),
    (["--concurrency", "2", "--verify-prefix", "2"], "--verify-prefix sets the first pass of --two-level prefix-first"),
    (["--verify-prefix", "2"], "--verify-prefix sets the first pass of --two-level prefix-first"),
    (["--concurrency", "2", "--two-level", "prefix-first", "--verify-prefix", "0"], "--verify-prefix 0 must be >= 1"),
    (["--concurrency", "2", "--two-level", "prefix-first", "--verify-prefix", "6"],
     "verify_prefix=6 must be below the block size 6"),
])
def test_refusals(pair, capsys, args, message):
    assert main(["generate", *pair, "--max-new-tokens", "4", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_concurrency_has_a_prefix_first_row(tmp_path, capsys):
    datasets = tmp_path / "data"
    datasets.mkdir()
    (datasets / "gsm8k.jsonl").write_text("".join(json.dumps({"id": f"g{i}", "turns": [f"q{i}"]}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    rc = main(["bench", "--target", "random:tiny-qwen3", "--concurrency", "2", "--datasets", str(datasets),
               "--benchmarks", "gsm8k", "--limit", "2", "--max-new-tokens", "6", "--replay", "3",
               "--device", "cpu", "--dtype", "fp32", "--out", str(out), "--two-level", "prefix-first", "--verify-prefix", "2"])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, printed + captured.err[-3000:]
    rows = [json.loads(line) for line in (out / "concurrency.jsonl").read_text().splitlines()]
    prefix = [r for r in rows if r["method"] == "with_prefix_first"]
    assert len(prefix) == 1 and prefix[0]["info"]["verify prefix"] == 2 and prefix[0]["replay_shortfalls"] == 0
    assert "with prefix-first (verified rows)" in printed
