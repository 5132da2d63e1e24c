"""`specpilot verify` with a drafter of each new kind (tiny random pairs, fp32, CPU): forced against
the kind's reference (stock dflash_generate for DFlash2, the reference loops for DSpark and PARD, and
the JSON names which; on a hybrid target the target's greedy AR for every kind), and the batched
engine's output at --concurrency 2 judged beside it."""
import json

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.bench.random_checkpoint import main as write_checkpoint
from specpilot.cli import main
from specpilot.verify.target_greedy import REFERENCE_LOOPS, STOCK, TARGET_GREEDY


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen3.5"])
@pytest.mark.parametrize("kind", ["dflash2", "dspark", "pard"])
def test_verify_names_the_kind_reference_and_judges_the_batch(kind, preset, tmp_path, capsys):
    hybrid = preset == "tiny-qwen3.5"
    assert write_checkpoint(["--preset", preset, "--drafter-kind", kind, "--out", str(tmp_path / "pair"),
                             "--dtype", "fp32"]) == 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": p}) for i, p in enumerate(["def f(x):", "abc"])))
    rc = main(["verify", "--target", str(tmp_path / "pair" / "target"), "--drafter", str(tmp_path / "pair" / "drafter"),
               "--prompts", str(prompts), "--max-new-tokens", "16", "--device", "cpu", "--dtype", "fp32",
               "--concurrency", "2"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"], printed[-3000:]
    assert out["reference"] == (TARGET_GREEDY if hybrid else REFERENCE_LOOPS.get(kind, STOCK))
    assert f"reference: {out['reference']}" in printed
    assert out["acceptance_judged"] is not hybrid and out["acceptance_mismatches"] == 0   # greedy AR has no acceptance
    batched = out["batched"]
    assert batched["judged"] and batched["concurrency"] == 2
    assert batched["identical_full_verify"] == batched["identical_all_mechanisms"] == 2
