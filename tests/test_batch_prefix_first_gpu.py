"""Prefix-first verification (BatchConfig.verify_prefix) on a CUDA GPU (the coordinator runs these:
pytest -m gpu tests/test_batch_prefix_first_gpu.py).

fp32 on CUDA, both passes through CUDA graphs (T = P and T = block - P): tokens and acceptance lengths
equal the batched engine's one-pass verify (greedy and sampled: the same draws from each request's
generator) and, greedy, the single-request engine's. bf16 on the zoo pair: `specpilot verify
--concurrency 8 --two-level prefix-first` must PASS."""
import json

import pytest

from batch_helpers import random_prompts, tiny_pair
from conftest import requires_gpu
from specpilot import settings
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request

ZOO = settings.get().zoo            # $SPECPILOT_ZOO or ../shared/zoo


def _cuda_pair():
    target, drafter = tiny_pair(10, 6, 11)
    target.cuda()
    drafter.cuda()                       # its own layers; the embedding and LM head are the target's
    target.ensure_rope(4096, device=target.device)
    drafter.ensure_rope(4096)
    return target, drafter


def _run(target, drafter, requests, prefix):
    batch = BatchEngine(target, drafter, BatchConfig(verify_prefix=prefix), max_batch=4, kv_pages=64)
    assert batch.graphs is not None, "CUDA graphs are off: the graphed passes are not tested"
    ids = [batch.submit(r) for r in requests]
    results = {r.request_id: r for r in batch.run_until_done()}
    return [results[i] for i in ids], batch


@requires_gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("prefix", [1, 2, 4])
def test_fp32_cuda_prefix_first_equals_one_pass(prefix, temperature):
    target, drafter = _cuda_pair()
    prompts = random_prompts(10, (5, 19, 9, 30), 11)
    requests = [Request(tuple(p), m, temperature=temperature, seed=7 + i if temperature else None)
                for i, (p, m) in enumerate(zip(prompts, (25, 9, 40, 17)))]
    one_pass, _ = _run(target, drafter, requests, 0)
    staged, batch = _run(target, drafter, requests, prefix)
    for a, b in zip(staged, one_pass):
        assert a.error is None and a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths
    assert {key[2] for key in batch.graphs.steps if key[0] == "target"} >= {prefix}
    if temperature == 0:
        engine = Engine(target, drafter, max_seq_len=128)
        for r, got in zip(requests, staged):
            assert got.tokens == engine.generate_spec(r.prompt_ids, r.max_new_tokens).tokens


@requires_gpu
def test_zoo_bf16_verify_prefix_first_passes(capsys):
    if not (ZOO / "code-tiny" / "config.json").exists():
        pytest.skip("the zoo pair is absent")
    from specpilot.cli import main

    rc = main(["verify", "--target", str(ZOO / "code-tiny"), "--drafter", str(ZOO / "code-tiny-dflash-b16"),
               "--prompts", str(ZOO / "prompts" / "humaneval.jsonl"), "--limit", "8", "--max-new-tokens", "96",
               "--device", "cuda", "--dtype", "bf16", "--concurrency", "8", "--two-level", "prefix-first"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"], printed[-3000:]
    assert out["batched"]["prompts"] == 8
