"""Batched DSpark drafting on a CUDA GPU (the coordinator runs these: pytest -m gpu tests/test_batch_dspark_gpu.py).

bf16 with the engine_config defaults (the verify CUDA-graphed, the DSpark drafting eager): every
request's batched speculative output equals the batched AR output of the same target. The pair has a
two-token head (random_kinds: the target's top logit stands far above the rest), so bf16 rounding
differences between a block verify and an AR step do not meet a near-tie. fp32: the batched tokens
equal the single-request engine's (its greedy draft CUDA-graphed)."""
import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request

pytestmark = requires_gpu


def _pair(tmp_path, dtype):
    from specpilot.models import load_drafter, load_target
    from specpilot.models.drafters.random_kinds import write_kind_pair

    t, d = write_kind_pair(tmp_path, "dspark", "tiny-qwen3", layer_ids=[0, 2], block_size=8, seed=fresh_seed(),
                           two_token_head=True)
    target = load_target(t, device="cuda", dtype=dtype)
    return target, load_drafter(d, target)


def _requests(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [Request(tuple(torch.randint(0, 318, (n,), generator=g).tolist()), m)
            for n, m in ((5, 40), (37, 25), (12, 60), (90, 33))]


def _run(engine: BatchEngine, requests: list) -> list:
    ids = [engine.submit(r) for r in requests]
    results = {r.request_id: r for r in engine.run_until_done()}
    assert all(results[i].error is None for i in ids), [results[i].error for i in ids]
    return [results[i] for i in ids]


def test_bf16_batched_dspark_equals_batched_ar(tmp_path):
    target, drafter = _pair(tmp_path, torch.bfloat16)
    requests = _requests(fresh_seed())
    spec = BatchEngine(target, drafter, BatchConfig(), max_batch=4, kv_pages=64)
    assert spec.graphs is not None and spec.kind_drafting is not None
    ar = BatchEngine(target, None, BatchConfig(), max_batch=4, kv_pages=64)
    got, ref = _run(spec, requests), _run(ar, requests)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert a.tokens == b.tokens, f"request {i}"
    assert any(x > 1 for r in got for x in r.acceptance_lengths), "no draft accepted: the drafting went unchecked"
    assert {key[0] for key in spec.graphs.steps} == {"target", "prefill", "mixed"}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fp32_batched_dspark_equals_single(tmp_path, temperature):
    target, drafter = _pair(tmp_path, torch.float32)
    seed = fresh_seed()
    requests = [Request(r.prompt_ids, r.max_new_tokens, temperature=temperature, seed=seed + i if temperature else None)
                for i, r in enumerate(_requests(seed))]
    single = Engine(target, drafter, max_seq_len=256)
    refs = [single.generate_spec(r.prompt_ids, r.max_new_tokens, temperature=r.temperature, seed=r.seed)
            for r in requests]
    got = _run(BatchEngine(target, drafter, BatchConfig(adaptive_verify=False), max_batch=4, kv_pages=64), requests)
    for i, (a, b) in enumerate(zip(got, refs)):
        assert a.tokens == b.tokens, f"request {i}"
