"""The batched engine on a hybrid recurrent target through the CLI (a tiny random Qwen3.5-layout pair,
fp32, CPU): `verify --concurrency` judges it against the target's own greedy AR and the single-request
engine, `generate --concurrency` writes what one request at a time writes, `bench --concurrency` runs
every ablation."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.cli import main
from specpilot.models.random_ckpt import write_pair
from specpilot.verify.target_greedy import TARGET_GREEDY


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("batch_hybrid_cli")
    t, d = write_pair(base, "tiny-qwen3.5", layer_ids=[1, 2], block_size=4, seed=fresh_seed())
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "turns": [p]}) for i, p in
                                 enumerate(["def f(x):\n", "hello there", "import os"])) + "\n")
    return t, d, prompts


def test_verify_concurrency_on_a_hybrid(pair, capsys):
    t, d, prompts = pair
    rc = main(["verify", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--max-new-tokens", "14",
               "--device", "cpu", "--dtype", "fp32", "--concurrency", "2"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"] and out["reference"] == TARGET_GREEDY, printed[-3000:]
    assert out["batched"]["judged"] and out["batched"]["identical_full_verify"] == 3
    assert out["batched"]["identical_all_mechanisms"] == 3


def test_generate_concurrency_on_a_hybrid(pair, tmp_path, capsys):
    t, d, prompts = pair
    texts = []
    for n in (1, 3):
        out = tmp_path / f"out{n}.jsonl"
        assert main(["generate", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--device", "cpu",
                     "--dtype", "fp32", "--max-new-tokens", "11", "--concurrency", str(n), "--output", str(out)]) == 0
        texts.append([json.loads(line)["tokens"] for line in out.read_text().splitlines()])
    assert texts[0] == texts[1] and len(texts[0]) == 3


def test_bench_concurrency_on_a_hybrid(pair, tmp_path, capsys):
    t, d, prompts = pair
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    (datasets / "tiny.jsonl").write_text(prompts.read_text())
    assert main(["bench", "--target", str(t), "--drafter", str(d), "--concurrency", "2", "--datasets", str(datasets),
                 "--benchmarks", "tiny", "--limit", "3", "--max-new-tokens", "6", "--device", "cpu", "--dtype", "fp32",
                 "--two-level", "prefix-first", "--verify-prefix", "2", "--out", str(tmp_path / "out")]) == 0
    methods = {json.loads(line)["method"] for line in (tmp_path / "out" / "concurrency.jsonl").read_text().splitlines()}
    assert methods == {"ar", "spec", "no_ragged_verify", "no_batched_draft", "no_adaptive_verify", "with_prefix_first"}
