"""Adaptive verify on a CUDA GPU (the coordinator runs it: pytest -m gpu tests/test_batch_adaptive_gpu.py):
between a step's draft and its verify forward nothing synchronises the device. CUDA's sync debug mode
is set to "error" for exactly that span, so a read-back there (the old draft-margin read, an .item(),
a blocking copy to the host) raises; greedy tokens equal the single-request engine's. And warmup prices
the verify lengths on the card: a step-cost table of the engine's own graphed forwards."""
import pytest
import torch

from batch_helpers import EAGER_ADAPTIVE, random_prompts, single, tiny_pair
from conftest import requires_gpu
from specpilot.engine.batch import BatchConfig, BatchEngine, Request, StepCostTable, forward, step


@requires_gpu
def test_no_device_sync_between_draft_and_verify(monkeypatch):
    target, drafter = tiny_pair(10, 4, 11)
    target.cuda()
    drafter.cuda()
    target.ensure_rope(4096, device=target.device)
    drafter.ensure_rope(4096)
    prompts = random_prompts(10, (5, 19, 9, 30), 11)
    requests = [Request(tuple(p), m) for p, m in zip(prompts, (25, 9, 40, 17))]
    # the roofline's 6-row ridge makes the tiny pair trim (a measured table of its flat costs would not)
    engine = BatchEngine(target, drafter, EAGER_ADAPTIVE, max_batch=4, kv_pages=64,
                         step_costs=StepCostTable.roofline(EAGER_ADAPTIVE.cost_ridge_tokens))
    assert engine.graphs is not None, "the CUDA engine runs its decode forwards graphed"
    engine.warmup(max(len(r.prompt_ids) + r.max_new_tokens for r in requests))   # no capture inside the span

    windows = []
    draft_all, target_forward, graphed_target = step.draft_all, forward.target_forward, engine.graphs.target

    def drafting(*args):
        windows.append(0)
        torch.cuda.set_sync_debug_mode("error")
        return draft_all(*args)

    def closing(call):
        def closed(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("default")
            return call(*args, **kwargs)
        return closed
    monkeypatch.setattr(step, "draft_all", drafting)
    monkeypatch.setattr(forward, "target_forward", closing(target_forward))
    engine.graphs.target = closing(graphed_target)
    engine.graphs.prefill = closing(engine.graphs.prefill)
    engine.graphs.mixed = closing(engine.graphs.mixed)
    try:
        ids = [engine.submit(r) for r in requests]
        results = {r.request_id: r for r in engine.run_until_done()}
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert windows, "no step drafted"
    assert engine.verify_rows < engine.block_rows, "adaptive verify never trimmed: the test would miss its choice"
    for i, req in zip(ids, requests):
        assert results[i].error is None and results[i].tokens == single(target, drafter, req).tokens, i


@requires_gpu
def test_warmup_measures_the_step_costs_of_its_own_graphs():
    target, drafter = tiny_pair(10, 4, 11)
    target.cuda()
    drafter.cuda()
    target.ensure_rope(4096, device=target.device)
    drafter.ensure_rope(4096)
    engine = BatchEngine(target, drafter, BatchConfig(), max_batch=4, kv_pages=64)
    assert engine.config.adaptive and not engine.costs_measured
    captured = engine.warmup(64)
    assert engine.costs_measured and engine.costs.fixed_s > 0          # the draft forward, timed
    # one point per request bucket x verify length: rows 1..4 requests x the block's quarters
    choices = engine.verify_row_choices
    assert set(engine.costs.tokens) == {r * t for r in (1, 2, 4) for t in choices}
    assert all(s > 0 for s in engine.costs.seconds)
    assert len(engine.graphs.steps) == captured, "timing the table captured graphs warmup had not"
    full = BatchEngine(target, drafter, BatchConfig(adaptive_verify=False), max_batch=4, kv_pages=64)
    full.warmup(64)
    assert not full.costs_measured                                     # nothing to price without adaptive verify


@requires_gpu
def test_sync_debug_mode_catches_a_read_back():
    """The control: in "error" mode a device value read to the host raises."""
    x = torch.ones(4, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchronizing"):
            x.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")
