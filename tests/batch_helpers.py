"""Tiny in-memory pairs and a reference runner for the batched engine's tests (fp32, CPU)."""
from dataclasses import replace

import torch

from specpilot.engine import Engine
from specpilot.engine.batch import BatchConfig, BatchEngine, Request
from specpilot.models.random_ckpt import TARGET_PRESETS, drafter_config_for, random_drafter, random_target

# Each mechanism off alone, all on, all off.
CONFIGS = {
    "all-on": BatchConfig(adaptive_verify=True),
    "per-request-verify": BatchConfig(ragged_verify=False, adaptive_verify=True),
    "per-request-draft": BatchConfig(batched_draft=False, adaptive_verify=True),
    "full-verify": BatchConfig(adaptive_verify=False),
    "all-off": BatchConfig(ragged_verify=False, batched_draft=False, adaptive_verify=False),
}
# Adaptive verify with a budget that really trims (a ridge of a few rows).
EAGER_ADAPTIVE = BatchConfig(adaptive_verify=True, cost_ridge_tokens=6)


def tiny_pair(vocab: int, block_size: int, seed: int, preset: str = "tiny-llama"):
    """A random target and drafter in memory (a small vocab: the random drafter sometimes agrees with
    the target, so some steps accept several drafts)."""
    cfg = replace(TARGET_PRESETS[preset], vocab_size=vocab)
    target = random_target(cfg, seed=seed)
    drafter = random_drafter(drafter_config_for(cfg, 2, block_size=block_size, layer_ids=[0, 2]), target, seed + 1)
    return target, drafter


def accepting_pair(vocab: int, block_size: int, seed: int, requests_for, tries: int = 30):
    """tiny_pair from the first seed >= `seed` whose single-request outputs on requests_for(seed)
    accept several drafts in at least 3 steps (random pairs mostly accept nothing, and a test of the
    batched accept bookkeeping must see multi-token steps). Returns (target, drafter, seed)."""
    for s in range(seed, seed + tries):
        target, drafter = tiny_pair(vocab, block_size, s)
        multi = sum(a > 1 for req in requests_for(s) for a in single(target, drafter, req).acceptance_lengths)
        if multi >= 3:
            return target, drafter, s
    raise RuntimeError(f"no pair seed in [{seed}, {seed + tries}) accepts drafts; vocab {vocab} too large?")


def check_equal(target, drafter, requests, results, seed, acceptance=True):
    """Every batched result has the tokens (and with `acceptance`, the acceptance lengths) that the
    single-request engine gives its request alone."""
    for i, req in enumerate(requests):
        ref, got = single(target, drafter, req), results[i]
        assert got.error is None, got.error
        assert got.tokens == ref.tokens, f"seed {seed}, request {i}"
        if acceptance:
            assert got.acceptance_lengths == ref.acceptance_lengths, f"seed {seed}, request {i}"


def random_prompts(vocab: int, lengths, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 2, (n,), generator=g).tolist() for n in lengths]   # no eos / mask ids



def five_requests(vocab: int, seed: int, temperature: float = 0.0) -> list:
    """Five requests (three decode beside each other: a padded bucket of 4), tails shorter than a block
    of 4."""
    prompts = random_prompts(vocab, (3, 21, 9, 14, 6), seed)
    return [Request(tuple(p), m, temperature=temperature, seed=seed + i if temperature else None)
            for i, (p, m) in enumerate(zip(prompts, (17, 5, 30, 2, 11)))]

def single(target, drafter, request: Request):
    """The single-request engine's output for `request` alone."""
    engine = Engine(target, drafter, max_seq_len=len(request.prompt_ids) + request.max_new_tokens + 8)
    if drafter is None:
        return engine.generate_ar(request.prompt_ids, request.max_new_tokens, request.stop_ids,
                                  request.temperature, seed=request.seed)
    return engine.generate_spec(request.prompt_ids, request.max_new_tokens, request.stop_ids, request.temperature,
                                seed=request.seed)


def run_staggered(engine: BatchEngine, requests: list, every: int = 2) -> dict:
    """Submits one request every `every` steps (the rest arrive while others run); id -> result."""
    results, pending, ids, step = {}, list(requests), [], 0
    while pending or not engine.idle:
        if pending and step % every == 0:
            ids.append(engine.submit(pending.pop(0)))
        for r in engine.step():
            results[r.request_id] = r
        step += 1
    return {i: results[i] for i in ids}
