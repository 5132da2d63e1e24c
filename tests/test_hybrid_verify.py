"""`specpilot verify` / `generate` on a hybrid recurrent target (tiny random Qwen3.5 pair, fp32, CPU):
the transcript forced against is the target's own greedy AR (stock is not lossless there), the output
says so, the verdict passes an exact engine and fails one whose state rollback is wrong."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import Pair, fresh_seed
from specpilot.cli import main
from specpilot.engine.recurrent_state import HybridCache
from specpilot.verify.forcing import token_force
from specpilot.verify.target_greedy import TARGET_GREEDY


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return Pair(tmp_path_factory.mktemp("hybrid_verify"), "tiny-qwen3.5", [0, 2], block_size=4, seed=fresh_seed())


def test_verify_cli_forces_against_the_target_greedy(pair, tmp_path, capsys):
    """4 prompts x 32 tokens: the precision rule compares fp32 RMS logit errors of about 1e-6, and over
    2 x 20 positions their ratio to stock's is noise enough to fail an honest engine (seed 754590648)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": p}) for i, p in
                                 enumerate(["def f(x):\n", "import os", "class A:\n", "for i in"])) + "\n")
    rc = main(["verify", "--target", str(pair.target_dir), "--drafter", str(pair.drafter_dir), "--prompts",
               str(prompts), "--max-new-tokens", "32", "--device", "cpu", "--dtype", "fp32"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"] is True, printed[-3000:]
    assert out["reference"] == TARGET_GREEDY and 4 <= out["tokens"] <= 128 and out["spec_identical"] == 4  # eos may stop
    assert printed.startswith(f"reference: {TARGET_GREEDY}")
    assert "identical to the target's greedy AR" in printed


def test_verify_fails_a_wrong_state_rollback(pair, monkeypatch):
    """Committing the whole verify block's recurrent state (what a cache crop leaves) must FAIL.
    4 prompts x 32 tokens: with fewer positions the fp32 RMS errors behind the precision rule are too
    noisy (2 x 24 put an honest decode path at 2.85x stock's in about 1 run of 10)."""
    prompts = [pair.random_prompt(6) for _ in range(4)]
    ok = token_force(pair.engine, pair.stock, prompts, 32)
    assert ok.passed and ok.reference == TARGET_GREEDY, ok.reasons
    original = HybridCache.commit

    def commit_whole_block(self, length):
        saved = [s[:, -1].clone() for s in self.snapshots] if self.pending and self.pending[2] else None
        original(self, length)
        if saved is not None:
            for state, s in zip(self.state, saved):
                state.copy_(s)

    monkeypatch.setattr(HybridCache, "commit", commit_whole_block)
    bad = token_force(pair.engine, pair.stock, prompts, 32)
    assert not bad.passed and bad.spec_mismatches > 0, bad.reasons


def test_generate_on_a_hybrid_pair(pair, capsys):
    common = ["--target", str(pair.target_dir), "--prompt", "x = 1\n", "--max-new-tokens", "12", "--device", "cpu",
              "--dtype", "fp32"]
    assert main(["generate", "--drafter", str(pair.drafter_dir), *common]) == 0
    printed = capsys.readouterr()
    spec = json.loads(printed.out.strip().splitlines()[-1])
    assert "hybrid recurrent target: a CUDA graph per AR / verify step" in printed.err   # the engine says why
    assert main(["generate", "--ar", *common]) == 0
    ar = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert spec["mode"] == "spec" and ar["mode"] == "ar"
    assert spec["tokens"] == ar["tokens"] and 1 <= ar["tokens"] <= 12          # the random target's eos may stop both
