"""The batched engine drafting with PARD on a CUDA GPU (the coordinator runs it:
pytest -m gpu tests/test_batch_pard_gpu.py). engine_config defaults: the verify CUDA-graphed, the PARD
draft eager. fp32: every request's tokens and acceptance lengths equal the single-request engine's
(which runs its own graphed PARD draft step); bf16: the batched greedy output equals the batched AR
output. Plain PARD and PARD-2."""
import pytest
import torch

from batch_helpers import random_prompts
from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.models import load_drafter, load_target
from specpilot.models.drafters.random_kinds import write_kind_pair

pytestmark = requires_gpu
OPTIONS = {"pard": {}, "pard2": {"pard2_layers": [1, 3], "pard2_scale": 1.0}}


def cuda_pair(folder, variant, dtype):
    t, d = write_kind_pair(folder, "pard", "tiny-llama", drafter_layers=2, block_size=8, seed=fresh_seed(),
                           layer_ids=[0, 2], two_token_head=True, **OPTIONS[variant])
    target = load_target(t, device="cuda", dtype=dtype)
    return target, load_drafter(d, target)


def four_requests(vocab, seed):
    prompts = random_prompts(vocab, (5, 19, 9, 30), seed)
    return [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17))]


def run_batch(target, drafter, requests, config=BatchConfig()):
    engine = BatchEngine(target, drafter, config, max_batch=4, kv_pages=64)
    assert engine.graphs is not None, "the CUDA engine runs its verify graphed"
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))
    ids = [engine.submit(r) for r in requests]
    results = {r.request_id: r for r in engine.run_until_done()}
    assert engine.pool.free_pages == 64
    return [results[i] for i in ids]


@pytest.mark.parametrize("variant", sorted(OPTIONS))
@pytest.mark.parametrize("name", ["all-on", "all-off"])
def test_fp32_cuda_batched_equals_single(tmp_path, variant, name):
    target, drafter = cuda_pair(tmp_path, variant, torch.float32)
    requests = four_requests(target.config.vocab_size, fresh_seed())
    config = BatchConfig() if name == "all-on" else BatchConfig(ragged_verify=False, batched_draft=False)
    single = Engine(target, drafter, max_seq_len=128)
    refs = [single.generate_spec(r.prompt_ids, r.max_new_tokens) for r in requests]
    for got, ref in zip(run_batch(target, drafter, requests, config), refs):
        assert got.error is None and got.tokens == ref.tokens
        assert got.acceptance_lengths == ref.acceptance_lengths


@pytest.mark.parametrize("variant", sorted(OPTIONS))
def test_bf16_cuda_batched_equals_batched_ar(tmp_path, variant):
    target, drafter = cuda_pair(tmp_path, variant, torch.bfloat16)
    requests = four_requests(target.config.vocab_size, fresh_seed())
    spec, ar = run_batch(target, drafter, requests), run_batch(target, None, requests)
    for i, (s, a) in enumerate(zip(spec, ar)):
        assert s.error is None and a.error is None
        assert s.tokens == a.tokens, f"request {i}"
    assert any(n > 1 for s in spec for n in s.acceptance_lengths), "no step accepted a draft"
