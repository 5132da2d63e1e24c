"""Times of the engine's graphed steps and of a whole replayed generation, for the engine A/B.

- `step_times(engine, block, iters, context)`: ms per graphed AR step, verify(block) step and draft
  step at `context` tokens of context (CUDA events, back to back, no host in between).
- `replayed_generation(engine, prompt, tokens, tau)`: whole greedy generations, host time between
  steps included: AR, then spec replaying a fixed tau over the AR transcript (scale tier: random
  weights accept ~nothing, so DFlash's published Qwen3-8B tau 6.49 is replayed).
"""
from __future__ import annotations

import torch

CONTEXT = 512                 # tokens already in the cache when the steps are timed


def _event_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


@torch.inference_mode()
def step_times(engine, block: int = 16, iters: int = 30, context: int = CONTEXT) -> dict:
    """{ar_ms, verify_ms, draft_ms}: the steps the speculative loop runs, each timed alone."""
    runner, dev, cfg = engine.runner, engine.device, engine.target.config
    prompt = torch.randint(0, cfg.vocab_size - 2, (1, context), device=dev)
    runner.prefill(prompt, with_features=True)
    one, blk = prompt[:, -1:], prompt[:, -block:].clone()
    out = {"ar_ms": _event_ms(lambda: runner.target_step(one, context, with_features=False), iters),
           "verify_ms": _event_ms(lambda: runner.target_step(blk, context, with_features=True), iters)}
    if engine.drafter is not None:
        feats = torch.zeros(1, 4, len(runner.feature_layers) * cfg.hidden_size, device=dev, dtype=engine.target.dtype)
        out["draft_ms"] = _event_ms(lambda: runner.draft_step(feats, context - 4, blk, context, block), iters)
    return out


@torch.inference_mode()
def replayed_generation(engine, prompt: list, tokens: int, tau: float) -> dict:
    """AR ms per token, spec ms per step and spec tokens/s over whole generations (decode time: after
    the prefill's token). The spec run replays `tau` over this engine's own AR transcript. Each loop
    first runs once untimed (WARMUP_TOKENS), as `specpilot bench` does: a first generation pays
    first-use costs that graph capture does not (the Qwen3.5-9B shape's spec step measured 11.05 ms
    unwarmed against 9.75 ms in the bench)."""
    from specpilot.engine.replay import AcceptanceReplay

    from .e2e import WARMUP_TOKENS

    engine.warmup(engine.drafter.block_size)
    warm = min(tokens, WARMUP_TOKENS)
    engine.generate_spec(prompt, warm, replay=AcceptanceReplay(engine.generate_ar(prompt, warm).tokens, tau))
    ar = engine.generate_ar(prompt, tokens)
    spec = engine.generate_spec(prompt, tokens, replay=AcceptanceReplay(ar.tokens, tau))
    return {"e2e_ar_ms_per_token": ar.decode_s / max(1, len(ar.tokens) - 1) * 1e3,
            "e2e_spec_ms_per_step": spec.decode_s / max(1, spec.steps) * 1e3,
            "e2e_spec_tokens_per_s": spec.tokens_per_s, "e2e_tau": spec.tau,
            "e2e_shortfalls": spec.replay_shortfalls, "e2e_tokens": ar.tokens + spec.tokens}
