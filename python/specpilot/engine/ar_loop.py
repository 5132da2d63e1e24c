"""Target-only (AR) decoding: prefill, then one graphed T=1 step per token.

Exactness: greedy output equals HF `generate(do_sample=False)` / dflash_generate(block_size=1) token
for token up to kernel rounding near-ties; sampled output draws exactly as stock's `sample`.
"""
from __future__ import annotations

from specpilot.verify.sampling import sample

from .result import GenerationResult


def run_ar(engine, ids, max_new_tokens: int, stop_ids: tuple, temperature: float, generator) -> GenerationResult:
    # ids [1, n]
    runner, n = engine.runner, ids.shape[1]
    t0 = engine.clock()
    logits, _ = runner.prefill(ids, with_features=False)          # [1, 1, V]
    token = sample(logits, temperature, generator)                # [1, 1]
    first = int(token.item())
    t1 = engine.clock()
    tokens = [first]
    stop = set(stop_ids)
    while first not in stop and len(tokens) < max_new_tokens:
        logits, _ = runner.target_step(token.view(1, 1), n + len(tokens) - 1, with_features=False)
        token = sample(logits, temperature, generator)            # [1, 1]
        tokens.append(int(token.item()))                          # the one host sync per token
        if tokens[-1] in stop:
            break
    t2 = engine.clock()
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=[], prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(tokens) - 1)
