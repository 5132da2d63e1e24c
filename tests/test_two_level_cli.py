"""The two-level switches end to end on the CLI (CPU, fp32, a tiny random pair): `specpilot draft-vocab`
writes a ranking beside the drafter, `verify` / `bench` / `generate` run with --draft-vocab and
--two-level, `cost` prints the new terms; plus the reduced head's other paths (sampling, split12)."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot import cli
from specpilot.models.draft_vocab import RANKING_FILE, TokenRanking, head_weight

TEXTS = ["def add(a, b):\n    return a + b\n", "import os\nimport sys\nprint(os.getcwd())\n",
         "class Stack:\n    def push(self, x):\n        self.items.append(x)\n", "for i in range(10):\n    print(i)\n"]


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    from specpilot.models.random_ckpt import write_pair

    folder = tmp_path_factory.mktemp("two_level_cli")
    target, drafter = write_pair(folder / "pair", "tiny-qwen3", drafter_layers=2, block_size=4, seed=fresh_seed(),
                                 layer_ids=[0, 2])
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    counts = torch.randint(0, 100, (vocab,), generator=torch.Generator().manual_seed(fresh_seed()))
    TokenRanking.from_counts(counts, "random counts (test)").save(drafter / RANKING_FILE)
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    return target, drafter, prompts


def test_draft_vocab_command_writes_the_ranking_beside_the_drafter(pair_dirs, capsys):
    target, drafter, prompts = pair_dirs
    assert cli.main(["draft-vocab", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                     "--greedy-tokens", "8", "--device", "cpu", "--dtype", "fp32"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ranking = TokenRanking.load(drafter / RANKING_FILE)
    assert summary["out"] == str(drafter / RANKING_FILE) and ranking.vocab_size == summary["vocab_size"]
    assert summary["tokens_counted"] > sum(len(t) for t in TEXTS) // 4          # prompts and greedy tokens
    assert cli.main(["draft-vocab", "--target", str(target), "--prompts", str(prompts)]) == 2
    assert "give --out FILE or --drafter DIR" in capsys.readouterr().err
    assert cli.main(["draft-vocab", "--target", str(target), "--prompts", str(prompts), "--skip", "9",
                     "--out", "x.json"]) == 2
    assert "no prompts left after --skip 9" in capsys.readouterr().err


def test_verify_passes_with_a_reduced_draft_vocab(pair_dirs, capsys):
    target, drafter, prompts = pair_dirs
    args = ["verify", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--limit", "2",
            "--max-new-tokens", "16", "--device", "cpu", "--dtype", "fp32", "--draft-vocab", "24"]
    assert cli.main(args) == 0, capsys.readouterr().out[-2000:]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("verdict: PASS") and json.loads(lines[-1])["acceptance_judged"] is False


def test_generate_and_bench_take_the_switches(pair_dirs, tmp_path, capsys):
    target, drafter, prompts = pair_dirs
    assert cli.main(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", TEXTS[0],
                     "--max-new-tokens", "8", "--device", "cpu", "--dtype", "fp32", "--draft-vocab", "24",
                     "--two-level", "certified-head"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["draft_vocab"] == 24 and summary["certified_head"]["rows"] > 0
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    (datasets / "humaneval.jsonl").write_text(json.dumps({"id": "h/0", "turns": [TEXTS[1]]}) + "\n")
    out = tmp_path / "out"
    assert cli.main(["bench", "--target", str(target), "--drafter", str(drafter), "--datasets", str(datasets),
                     "--benchmarks", "humaneval", "--max-new-tokens", "8", "--dtype", "fp32", "--device", "cpu",
                     "--methods", "our_spec", "--draft-vocab", "24", "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "rows.jsonl").read_text().strip()


def test_cost_prints_the_two_level_terms(pair_dirs, capsys):
    target, drafter, _ = pair_dirs
    assert cli.main(["cost", "--target", str(target), "--drafter", str(drafter), "--tau", "2", "--quick",
                     "--device", "cpu", "--context", "32", "--draft-vocab", "64", "--two-level", "certified-head",
                     "--fallback-rate", "0.5", "--limit", "60"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    names = {r["name"]: r for r in report["rows"]}
    assert {"draft.vocab_expand", "lm_head.level1", "lm_head.shortlist", "lm_head.fallback"} <= set(names)
    assert names["lm_head.fallback"]["count"] == 0.5 and report["deployment"]["draft_vocab"] == 64
    assert cli.main(["cost", "--target", str(target), "--fallback-rate", "2"]) == 2


def test_sampling_with_a_reduced_draft_vocab_draws_only_valid_tokens(tmp_path):
    """Rejection sampling stays exact for any draft distribution; the kept set's -inf logits become
    draft probabilities of exactly 0, so the run must go through without NaNs and repeat per seed."""
    from test_engine_helpers import Pair
    from specpilot.config import EngineConfig
    from specpilot.engine import Engine

    pair = Pair(tmp_path, "tiny-qwen3", [0, 2], block_size=4, seed=fresh_seed())
    vocab = pair.target.config.vocab_size
    path = TokenRanking(tuple(range(vocab)), vocab, "identity").save(tmp_path / "r.json")
    engine = Engine(pair.target, pair.drafter, max_seq_len=128,
                    config=EngineConfig(draft_vocab=16, draft_vocab_ranking=str(path)))
    prompt = pair.random_prompt(6)
    first = engine.generate_spec(prompt, 24, stop_ids=(), temperature=0.9, seed=5)
    again = engine.generate_spec(prompt, 24, stop_ids=(), temperature=0.9, seed=5)
    assert first.tokens == again.tokens and len(first.tokens) == 24
    assert all(0 <= t < vocab for t in first.tokens)


def test_a_split12_heads_rows_are_decoded_exactly():
    from specpilot.formats.split12.linear import Split12Linear

    w = (torch.randn(64, 32, generator=torch.Generator().manual_seed(fresh_seed())) * 0.05).to(torch.bfloat16)
    assert torch.equal(head_weight(Split12Linear.from_weight(w)), w)
    with pytest.raises(TypeError, match="cannot read the rows"):
        head_weight(torch.nn.Identity())
