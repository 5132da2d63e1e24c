"""The greedy DFlash loop with one fused step per block (fused_steps.py): the stock loop
(dflash 0.1.0 `dflash_generate`, see spec_loop.py) with every device op of a step in one graph.

Host work per step: read back [matched, block, posterior, start] (the only sync), the same
acceptance / stop / tail bookkeeping as stock, and the next launch. With early launch (the default,
fused_steps.set_early_launch) the step has already written the next step's control on the device,
so the host launches the next step as soon as it has seen no stop and no end in this one's tokens;
otherwise it uploads the control it computed itself first.
Exactness: the same tokens as spec_loop's stepwise path and as stock, up to kernel-rounding
near-ties (fp32 on the CPU: identical; tested against stock).
"""
from __future__ import annotations

import torch

from . import fused_steps
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
    early = fused_steps.early_launch()
    if replay is not None:
        fused.load_replay(replay, b, n, max_length)           # every step's drafts, before the clock

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=True)   # [1, 1, V], [1, n, F]
    tokens = [int(torch.argmax(logits[0, -1]).item())]
    t1 = engine.clock()

    acceptance, start = [], n
    stopped = tokens[0] in stop
    pending = None
    if not stopped and start + 1 < max_length:
        fused.write_prompt_context(features)                  # the first draft's context: the prompt
        fused.spec_send(b, start, 0, 0, tokens[-1], max_length, 0, replay)   # context: the prompt's
        pending = fused.spec_launch(b, start + min(b, max_length - start))
    while pending is not None:
        vs = min(b, max_length - start)
        packed = pending.values()                             # waits for the step
        if packed[-1] != start:
            raise RuntimeError(f"fused spec step ran at position {packed[-1]}, the host expected {start}")
        new = greedy_new_tokens(packed, b, replay, len(acceptance), vs)
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        ctx_start, ctx_count = start, produced                # anchor + accepted drafts
        start += produced
        acceptance.append(produced)
        pending = None
        if start + 1 < max_length and not stopped:
            if not early:                                     # the host's own control for the step
                fused.spec_send(b, start, ctx_start, ctx_count, tokens[-1], max_length, len(acceptance),
                                replay)
            pending = fused.spec_launch(b, start + min(b, max_length - start))

    t2 = engine.clock()
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(acceptance),
                            replay_shortfalls=replay.shortfalls if replay is not None else 0)
