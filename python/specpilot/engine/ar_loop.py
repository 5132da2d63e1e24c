"""Target-only (AR) decoding: prefill, then one graphed T=1 step per token.

Exactness: greedy output equals HF `generate(do_sample=False)` / dflash_generate(block_size=1) token
for token up to kernel rounding near-ties; sampled output draws exactly as stock's `sample`.
"""
from __future__ import annotations

import torch

from specpilot.verify.sampling import sample

from .result import GenerationResult


def _ignore(new_tokens) -> None:
    """The on_tokens callback when none is given."""


def run_ar(engine, ids, max_new_tokens: int, stop_ids: tuple, temperature: float, generator,
           on_tokens=None) -> GenerationResult:
    # ids [1, n]; on_tokens(list of new token ids) is called as tokens are produced (streaming)
    notify = on_tokens or _ignore
    if temperature == 0 and engine.config.fused_steps:
        return run_ar_fused(engine, ids, max_new_tokens, stop_ids, notify)
    runner, n = engine.runner, ids.shape[1]
    t0 = engine.clock()
    logits, _ = runner.prefill(ids, with_features=False)          # [1, 1, V]
    token = sample(logits, temperature, generator)                # [1, 1]
    first = int(token.item())
    t1 = engine.clock()
    tokens = [first]
    notify(tokens[-1:])
    stop = set(stop_ids)
    while first not in stop and len(tokens) < max_new_tokens:
        logits, _ = runner.target_step(token.view(1, 1), n + len(tokens) - 1, with_features=False)
        token = sample(logits, temperature, generator)            # [1, 1]
        tokens.append(int(token.item()))                          # the one host sync per token
        notify(tokens[-1:])
        if tokens[-1] in stop:
            break
    t2 = engine.clock()
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=[], prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(tokens) - 1)


def run_ar_fused(engine, ids, max_new_tokens: int, stop_ids: tuple, notify=_ignore) -> GenerationResult:
    """Greedy: each token is one replay of a graph that embeds, runs the target, takes the argmax and
    advances its own position; the host only reads the token (one sync per token). With early launch
    (EngineConfig.early_launch) the next token's step is launched before this one is read, so the
    GPU never waits for the host; a stop token then leaves one launched step unused."""
    runner, n = engine.runner, ids.shape[1]
    fused = runner.fused
    fused.capture_all(None)                                   # no-op once captured; before the clock
    ahead = 1 if engine.config.early_launch else 0
    t0 = engine.clock()
    logits, _ = runner.prefill(ids, with_features=False)      # [1, 1, V]
    first = int(torch.argmax(logits[0, -1]).item())
    t1 = engine.clock()
    tokens = [first]
    notify(tokens[-1:])
    stop = set(stop_ids)
    if first not in stop and max_new_tokens > 1:
        fused.ar_begin(first, n)
        launched = 0                                          # steps launched; each makes one token
        while True:
            while launched < max_new_tokens - 1 and launched - (len(tokens) - 1) <= ahead:
                fused.ar_launch()
                launched += 1
            tokens.append(fused.ar_collect())
            notify(tokens[-1:])
            if tokens[-1] in stop or len(tokens) >= max_new_tokens:
                break
    t2 = engine.clock()                                       # (waits for a step launched past a stop)
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=[], prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(tokens) - 1)
