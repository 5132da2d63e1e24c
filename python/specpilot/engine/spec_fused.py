"""The greedy DFlash loop with one fused step per block (fused_steps.py): the stock loop
(dflash 0.1.0 `dflash_generate`, see spec_loop.py) with every device op of a step in one graph.

Host work per step: build the control scalars, one replay, read back [matched, block, posterior]
(the only sync), then the same acceptance / stop / tail bookkeeping as stock.
Exactness: the same tokens as spec_loop's stepwise path and as stock, up to kernel-rounding
near-ties (fp32 on the CPU: identical; tested against stock).
"""
from __future__ import annotations

import torch

from .result import GenerationResult
from .spec_loop import commit, greedy_new_tokens


def run_spec_fused(engine, ids, max_new_tokens, stop_ids, block_size, replay) -> GenerationResult:
    # ids [1, n]
    runner, b = engine.runner, block_size
    fused = runner.fused
    fused.capture_all(b)                                      # no-op once captured; before the clock
    n = ids.shape[1]
    max_length = n + max_new_tokens
    stop = set(stop_ids)
    vocab = engine.target.config.vocab_size

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=True)   # [1, 1, V], [1, n, F]
    tokens = [int(torch.argmax(logits[0, -1]).item())]
    t1 = engine.clock()

    acceptance, start = [], n
    stopped = tokens[0] in stop
    if not stopped and start + 1 < max_length:
        fused.write_prompt_context(features)                  # the first draft's context: the prompt
    ctx_start, ctx_count = 0, 0                               # context rows not yet in the draft cache
    while start + 1 < max_length and not stopped:
        vs = min(b, max_length - start)
        forced = None
        if replay is not None:
            want = replay.produced_at(len(acceptance), vs)
            forced = replay.drafts(start - n, want - 1, vs - 1, vocab)
        packed = fused.spec_step(b, start, ctx_start, ctx_count, vs, tokens[-1], forced)
        new = greedy_new_tokens(packed, b, replay, len(acceptance), vs)
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        ctx_start, ctx_count = start, produced                # anchor + accepted drafts
        start += produced
        acceptance.append(produced)

    t2 = engine.clock()
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(acceptance),
                            replay_shortfalls=replay.shortfalls if replay is not None else 0)
