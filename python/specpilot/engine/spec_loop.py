"""The stock DFlash loop (dflash 0.1.0 `dflash_generate`), step for step, over static caches.

Per step, with `start` the position of the last committed token (the anchor):
  verify_size = min(B, max_length - start); block = [anchor, mask x (verify_size - 1)]
  draft (context = target features of the positions committed last step) -> argmax / sample
  one verify_size-token target pass -> longest accepted prefix + bonus (or rejection sampling)
  produced = min(accepted + 1, max_length - start - 1), cut after the first stop token.
Output: the prefill's token plus every produced token (stop token included), as stock.
Exactness: identical tokens to stock up to kernel-rounding near-ties (fp32: identical).
"""
from __future__ import annotations

import torch

from specpilot.verify.sampling import rejection_sample, sample, sample_probs, sampling_probs

from .accept import commit, new_tokens  # noqa: F401 (spec_fused imports commit from here)
from .result import GenerationResult


def run_spec(engine, ids, max_new_tokens, stop_ids, temperature, block_size, replay, generator):
    # ids [1, n]
    if temperature == 0 and block_size > 1 and engine.fused_steps:
        from .spec_fused import run_spec_fused
        return run_spec_fused(engine, ids, max_new_tokens, stop_ids, block_size, replay)
    runner, drafter, device = engine.runner, engine.drafter, engine.device
    n = ids.shape[1]
    max_length = n + max_new_tokens
    stop = set(stop_ids)
    vocab = engine.target.config.vocab_size

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=block_size > 1)   # [1, 1, V], [1, n, F]
    tokens = [int(sample(logits, temperature, generator).item())]
    ctx, ctx_start = features, 0                                  # context features not yet in the draft cache
    t1 = engine.clock()

    acceptance, start = [], n
    mask_row = torch.full((1, block_size), drafter.mask_token_id, dtype=torch.long, device=device)
    stopped = tokens[0] in stop
    while start + 1 < max_length and not stopped:
        vs = min(block_size, max_length - start)
        block = mask_row[:, :vs].clone()                          # [1, vs]
        block[0, 0] = tokens[-1]
        draft_probs = None
        if vs > 1:
            draft_logits = runner.draft_step(ctx, ctx_start, block, start, block_size)   # [1, vs-1, V]
            if temperature > 0:
                draft_probs = sampling_probs(draft_logits, temperature)
                block[:, 1:] = sample_probs(draft_probs, generator)
            else:
                block[:, 1:] = torch.argmax(draft_logits, dim=-1)
            if replay is not None:
                want = replay.produced_at(len(acceptance), vs)
                drafts = replay.drafts(start - n, want - 1, vs - 1, vocab)
                block[0, 1:] = torch.tensor(drafts, dtype=torch.long, device=device)
        logits, features = runner.target_step(block, start, with_features=vs > 1,       # [1, vs, V], [1, vs, F]
                                              graphed=vs == block_size)

        if temperature > 0:
            target_probs = sampling_probs(logits, temperature)
            if vs > 1:
                acc, bonus = rejection_sample(block[:, 1:], target_probs, draft_probs, generator)
                bonus = int(bonus)
            else:
                acc, bonus = 0, int(sample_probs(target_probs[:, -1], generator)[0])
            new = block[0, 1:acc + 1].tolist() + [bonus]
        else:
            posterior = torch.argmax(logits, dim=-1)              # [1, vs]
            matched = (block[:, 1:] == posterior[:, :-1]).cumprod(dim=1).sum(dim=1)  # [1]
            # One host transfer per step: the accepted count, the block and the posterior.
            packed = torch.cat([matched, block[0], posterior[0]]).tolist()
            new = greedy_new_tokens(packed, vs, replay if vs > 1 else None, len(acceptance), vs)

        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        if vs > 1:
            ctx, ctx_start = features[:, :produced], start        # anchor + accepted drafts
        start += produced
        acceptance.append(produced)

    t2 = engine.clock()
    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=t2 - t1, steps=len(acceptance),
                            replay_shortfalls=replay.shortfalls if replay is not None else 0)


def greedy_new_tokens(packed: list, width: int, replay, step: int, verify_size: int) -> list:
    """packed = [matched, block (width), posterior (width), ...] read back from the device (width
    >= verify_size: the fused step pads the tail block) -> the accepted drafts + the bonus token. Under replay the trace's planned count is used, and a step
    where the target disagreed with the transcript is counted in `replay.shortfalls`."""
    acc = packed[0]
    if replay is not None:
        planned = replay.produced_at(step, verify_size) - 1
        replay.shortfalls += acc < planned
        acc = planned
    return new_tokens(packed[1:1 + width], packed[1 + width:1 + 2 * width], acc)
