"""Batched DFlash2 drafting on a CUDA GPU (engine_config defaults: the verify CUDA-graphed, the drafting
eager), on a tiny random pair with a sliding-window layer. fp32: every request's tokens and acceptance
lengths equal the single-request engine's. bf16: the batched speculative output equals the batched AR
output of the same engine. Skipped without a GPU:
    pytest -m gpu tests/test_batch_dflash2_gpu.py"""
import pytest
import torch

from batch_helpers import random_prompts
from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed

pytestmark = requires_gpu

SLIDING = {"layer_types": ("full_attention", "sliding_attention"), "sliding_window": 3, "conv_kernel_size": 4}


def cuda_pair(tmp_path, dtype):
    from specpilot.models import load_drafter, load_target
    from specpilot.models.drafters.random_kinds import write_kind_pair

    t, d = write_kind_pair(tmp_path, "dflash2", "tiny-llama", layer_ids=[0, 2], block_size=8, seed=fresh_seed(),
                           two_token_head=True, **SLIDING)
    target = load_target(t, device="cuda", dtype=dtype)
    return target, load_drafter(d, target)


def requests(seed):
    from specpilot.engine.batch import Request

    prompts = random_prompts(318, (5, 19, 9, 30), seed)
    return [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17))]


def run_batch(target, drafter, reqs):
    from specpilot.engine.batch import BatchEngine

    engine = BatchEngine(target, drafter, max_batch=4, kv_pages=64)
    assert engine.graphs is not None                     # engine_config defaults: graphs on
    ids = [engine.submit(r) for r in reqs]
    results = {r.request_id: r for r in engine.run_until_done()}
    assert all(results[i].error is None for i in ids)
    return [results[i] for i in ids]


def test_fp32_batched_equals_single_request(tmp_path):
    from specpilot.engine import Engine

    target, drafter = cuda_pair(tmp_path, torch.float32)
    reqs = requests(fresh_seed())
    single = Engine(target, drafter, max_seq_len=128)
    for got, req in zip(run_batch(target, drafter, reqs), reqs):
        ref = single.generate_spec(req.prompt_ids, req.max_new_tokens)
        assert got.tokens == ref.tokens and got.acceptance_lengths == ref.acceptance_lengths


def test_bf16_batched_equals_batched_ar(tmp_path):
    target, drafter = cuda_pair(tmp_path, torch.bfloat16)
    reqs = requests(fresh_seed())
    spec, ar = run_batch(target, drafter, reqs), run_batch(target, None, reqs)
    for s, a in zip(spec, ar):
        assert s.tokens == a.tokens
    assert max(x for s in spec for x in s.acceptance_lengths) > 1, "no draft accepted: the drafts went unchecked"
