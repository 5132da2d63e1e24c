"""The batched engine on hybrid recurrent targets on a CUDA GPU (the coordinator runs these:
pytest -m gpu tests/test_batch_hybrid_gpu.py). The batched hybrid runs eagerly (no CUDA graphs: asked for, it says why in eager_reason).

fp32 on CUDA: batched == single-request tokens and acceptance lengths exactly. bf16 at the widths our
GDN kernels take (the conv prologue, the chain, the gated norm, over each request's row slice of the
batch's projection): every request runs to its length with no error and gives back its page and slot
(bf16 rounding differs between the batched and single-request forwards, so tokens are not compared)."""
import dataclasses

import pytest
import torch

from batch_helpers import CONFIGS, random_prompts, run_staggered, tiny_pair
from conftest import requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.config import EngineConfig
from specpilot.engine import Engine
from specpilot.engine.batch import BatchEngine, Request, hybrid_state

pytestmark = requires_gpu
EAGER = EngineConfig(cuda_graphs=False)


def _to_cuda(target, drafter):
    target.cuda()
    drafter.cuda()
    target.ensure_rope(4096, device=target.device)
    drafter.ensure_rope(4096)
    return target, drafter


def _requests(seed):
    prompts = random_prompts(10, (5, 19, 9, 30, 70), seed)
    return [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17, 12))]


@pytest.mark.parametrize("name", ["all-on", "all-off"])
@pytest.mark.parametrize("drafted", [True, False])
def test_fp32_cuda_batched_hybrid_equals_single(name, drafted):
    seed = fresh_seed()
    target, drafter = _to_cuda(*tiny_pair(10, 4, seed, "tiny-qwen3.5"))
    drafter = drafter if drafted else None
    requests = _requests(seed)
    engine = Engine(target, drafter, max_seq_len=128)
    refs = [engine.generate_spec(r.prompt_ids, r.max_new_tokens) if drafted else
            engine.generate_ar(r.prompt_ids, r.max_new_tokens) for r in requests]
    batch = BatchEngine(target, drafter, CONFIGS[name], max_batch=3, kv_pages=64, engine_config=EAGER)
    results = run_staggered(batch, requests)
    for i, ref in enumerate(refs):
        assert results[i].error is None and results[i].tokens == ref.tokens, f"seed {seed}, request {i}"
        if drafted:
            assert results[i].acceptance_lengths == ref.acceptance_lengths, f"seed {seed}, request {i}"


def test_bf16_kernel_widths_run_through():
    from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

    seed = fresh_seed()
    cfg = dataclasses.replace(TARGET_PRESETS["tiny-qwen3.5"], vocab_size=10, linear_key_head_dim=64,
                              linear_value_head_dim=64, head_dim=64)
    target = random_target(cfg, "cuda", torch.bfloat16, seed=seed)
    drafter = random_drafter(drafter_config_for(cfg, 2, block_size=4, layer_ids=[0, 2]), target, seed + 1)
    target, drafter = _to_cuda(target, drafter)
    requests = _requests(seed)
    graphed = BatchEngine(target, drafter, CONFIGS["all-on"], max_batch=3, kv_pages=64)   # graphs asked for: eager
    assert graphed.graphs is None and graphed.eager_reason == hybrid_state.EAGER
    del graphed
    for name in ("all-on", "all-off"):
        batch = BatchEngine(target, drafter, CONFIGS[name], max_batch=3, kv_pages=64, engine_config=EAGER)
        results = run_staggered(batch, requests)
        for i, r in enumerate(requests):
            assert results[i].error is None and len(results[i].tokens) == r.max_new_tokens, f"seed {seed}, request {i}"
        assert batch.pool.free_pages == 64 and batch.recurrent.free_slots == 3
