"""Tree verification on the zoo's trained pairs (code-tiny and hybrid-tiny with their DFlash
drafters, fp32 CPU): real drafts, real sibling acceptance; every tree run's tokens equal the
target's greedy AR output and the chain loop's. Skipped when the zoo is absent."""
import json

import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from tree_helpers import tree_budget
from specpilot import settings

ZOO = settings.get().zoo


@pytest.fixture(scope="module", params=["code-tiny", "hybrid-tiny"])
def zoo(request):
    target_dir, drafter_dir = ZOO / request.param, ZOO / f"{request.param}-dflash-b16"
    if not (target_dir / "config.json").exists() or not (drafter_dir / "config.json").exists():
        pytest.skip(f"the zoo pair {request.param} is not at {ZOO}")
    from specpilot.engine import Engine
    from specpilot.models.loading import load_pair

    target, drafter, tok = load_pair(target_dir, drafter_dir, "cpu", torch.float32)
    rows = [json.loads(line) for line in (ZOO / "prompts" / "pystdlib.jsonl").read_text().splitlines()[:2]]
    prompts = [tok.encode(r["prompt"], add_special_tokens=False)[-64:] for r in rows]
    return Engine(target, drafter, max_seq_len=256), prompts, tuple(target.eos_token_ids)


def test_zoo_tree_equals_ar_and_chain(zoo):
    engine, prompts, stop = zoo
    gained = 0
    for prompt in prompts:
        ar = engine.generate_ar(prompt, 40, stop)
        chain = engine.generate_spec(prompt, 40, stop)
        assert chain.tokens == ar.tokens and len(ar.tokens) > 10
        for budget in (8, 32):
            with tree_budget(engine, budget):
                tree = engine.generate_spec(prompt, 40, stop)
            assert tree.tokens == ar.tokens, f"budget {budget}"
        gained += tree.tau > chain.tau                 # budget 32: the trained drafter's siblings pay
    assert gained >= 1
