"""The batched engine on a CUDA GPU (the coordinator runs these: pytest -m gpu tests/test_batch_gpu.py).

fp32 on CUDA: batched == single-request tokens exactly (both eager torch arithmetic; the single engine
also runs its graphs). bf16 on the zoo pair: `specpilot verify --concurrency 8` must PASS (the batched
output judged against stock and the referee, near-ties by the rule). The pool sized by memory_fraction."""
import json

import pytest
import torch

from batch_helpers import CONFIGS, random_prompts, tiny_pair
from conftest import requires_gpu
from specpilot import settings
from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.engine.batch.paged import page_bytes

ZOO = settings.get().zoo            # $SPECPILOT_ZOO or ../shared/zoo


def _to_cuda(target, drafter):
    target.cuda()
    drafter.cuda()                       # its own layers; the embedding and LM head are the target's
    target.ensure_rope(4096, device=target.device)
    drafter.ensure_rope(4096)
    return target, drafter


@requires_gpu
@pytest.mark.parametrize("name", ["all-on", "all-off"])
def test_fp32_cuda_batched_equals_single(name):
    target, drafter = _to_cuda(*tiny_pair(10, 4, 11))
    prompts = random_prompts(10, (5, 19, 9, 30), 11)
    requests = [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17))]
    engine = Engine(target, drafter, max_seq_len=128)
    refs = [engine.generate_spec(r.prompt_ids, r.max_new_tokens) for r in requests]
    batch = BatchEngine(target, drafter, CONFIGS[name], max_batch=4, kv_pages=64)
    ids = [batch.submit(r) for r in requests]
    results = {r.request_id: r for r in batch.run_until_done()}
    for i, ref in zip(ids, refs):
        assert results[i].error is None and results[i].tokens == ref.tokens


@requires_gpu
def test_fp32_cuda_batched_ar_equals_single():
    """Batched AR on CUDA runs its graphed steps launched ahead of the host (ar_lookahead.py: pinned
    copies, events): tokens equal the single-request engine's, with a request stopping on a stop id
    mid-run and others at their lengths."""
    target, _ = _to_cuda(*tiny_pair(10, 4, 11))
    prompts = random_prompts(10, (5, 19, 9, 30), 12)
    engine = Engine(target, None, max_seq_len=128)
    requests = [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17))]
    stop = engine.generate_ar(requests[2].prompt_ids, 40).tokens[10]
    requests[2] = Request(requests[2].prompt_ids, 40, stop_ids=(stop,))
    refs = [engine.generate_ar(r.prompt_ids, r.max_new_tokens, r.stop_ids) for r in requests]
    batch = BatchEngine(target, None, BatchConfig(), max_batch=4, kv_pages=64)
    ids = [batch.submit(r) for r in requests]
    results = {r.request_id: r for r in batch.run_until_done()}
    for i, ref in zip(ids, refs):
        assert results[i].error is None and results[i].tokens == ref.tokens
    assert batch.graphs is not None and batch.ar_in_flight is None


@requires_gpu
def test_memory_fraction_sizes_the_pool():
    target, drafter = _to_cuda(*tiny_pair(10, 4, 12))
    free, _ = torch.cuda.mem_get_info()
    batch = BatchEngine(target, drafter, BatchConfig(), max_batch=2, memory_fraction=0.01)
    expect = int(free * 0.01) // page_bytes(target, drafter, 16)
    assert abs(batch.pool.num_pages - expect) <= expect // 50 + 1          # free memory moves a little


@requires_gpu
def test_zoo_bf16_verify_concurrency_passes(capsys):
    if not (ZOO / "code-tiny" / "config.json").exists():
        pytest.skip("the zoo pair is absent")
    from specpilot.cli import main

    rc = main(["verify", "--target", str(ZOO / "code-tiny"), "--drafter", str(ZOO / "code-tiny-dflash-b16"),
               "--prompts", str(ZOO / "prompts" / "humaneval.jsonl"), "--limit", "8", "--max-new-tokens", "96",
               "--device", "cuda", "--dtype", "bf16", "--concurrency", "8"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert rc == 0 and out["passed"], printed[-3000:]
    assert out["batched"]["prompts"] == 8
