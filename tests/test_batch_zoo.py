"""The batched engine on the zoo's trained pair (code-tiny + its DFlash drafter, fp32 CPU): real
multi-token acceptance; every request's tokens equal the single-request engine's. Skipped when the
zoo is absent."""
import json

import pytest
import torch

from batch_helpers import CONFIGS, EAGER_ADAPTIVE, run_staggered, single
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot import settings
from specpilot.engine.batch import BatchEngine, Request

ZOO = settings.get().zoo            # $SPECPILOT_ZOO or ../shared/zoo
TARGET, DRAFTER = ZOO / "code-tiny", ZOO / "code-tiny-dflash-b16"


@pytest.fixture(scope="module")
def zoo():
    if not (TARGET / "config.json").exists() or not (DRAFTER / "config.json").exists():
        pytest.skip(f"the zoo pair is not at {ZOO}")
    from transformers import AutoTokenizer

    from specpilot.models import load_drafter, load_target

    target = load_target(TARGET, dtype=torch.float32)
    drafter = load_drafter(DRAFTER, target)
    tok = AutoTokenizer.from_pretrained(TARGET)
    rows = [json.loads(line) for line in (ZOO / "prompts" / "humaneval.jsonl").read_text().splitlines()[:4]]
    prompts = [tok.encode(r["prompt"], add_special_tokens=False)[:48] for r in rows]
    stop = tuple(target.eos_token_ids)
    requests = [Request(tuple(p), m, stop_ids=stop) for p, m in zip(prompts, (40, 24, 48, 32))]
    return target, drafter, requests, [single(target, drafter, r) for r in requests]


@pytest.mark.parametrize("name, concurrency", [("full-verify", 4), ("full-verify", 1), ("all-off", 4),
                                               ("eager-adaptive", 4)])
def test_zoo_batched_equals_single(zoo, name, concurrency):
    target, drafter, requests, refs = zoo
    config = EAGER_ADAPTIVE if name == "eager-adaptive" else CONFIGS[name]
    engine = BatchEngine(target, drafter, config, max_batch=concurrency, kv_pages=32)
    results = run_staggered(engine, requests)
    for i, ref in enumerate(refs):
        assert results[i].error is None and results[i].tokens == ref.tokens, f"request {i}"
        if not config.adaptive_verify:
            assert results[i].acceptance_lengths == ref.acceptance_lengths, f"request {i}"
    assert max(a for r in refs for a in r.acceptance_lengths) > 2, "the trained pair accepted no run of drafts"
    assert engine.pool.free_pages == 32
