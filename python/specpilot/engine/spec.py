"""The speculative step: draft -> verify -> accept -> commit (the stock DFlash loop, dflash 0.1.0
`dflash_generate`, over static caches).

Per step, with `start` the position of the last committed token (the anchor):
  verify_size vs = min(B, max_length - start); block = [anchor, mask x (vs - 1)]
  draft  (context: target features of the rows committed last step) -> argmax / sample
  verify one vs-row target pass (greedy: a whole B-row block wherever the cache has room, so a
         tail block stays graphed; rows past max_length are computed, never committed)
  accept the longest matching prefix + bonus (greedy, engine/accept.py) or rejection sampling
  commit produced = min(accepted + 1, max_length - start - 1), cut after the first stop token.
Output: the prefill's token plus every produced token (stop token included), as stock.
Exactness: identical tokens to stock up to kernel-rounding near-ties (fp32: identical).

`run_spec` is that loop, step by step. Greedy decoding on the graphed engine runs the same step
as one captured call per block (`run_spec_graphed`, fused_steps.py), with the host left to read
the result and commit. `policy` is the acceptance policy: replay.GREEDY, or an AcceptanceReplay.
"""
from __future__ import annotations

import torch

from specpilot.verify.sampling import rejection_sample, sample, sample_probs, sampling_probs

from .accept import accepted_prefix, commit, new_tokens
from .ar_loop import _ignore
from .result import GenerationResult


def run_spec(engine, ids, max_new_tokens, stop_ids, temperature, block_size, policy, generator, on_tokens=None):
    # ids [1, n]; on_tokens(list of new token ids) is called after each commit (streaming)
    notify = on_tokens or _ignore
    certified = engine.certified_head                        # two_level "certified-head": None when off
    if temperature == 0 and block_size > 1 and engine.config.fused_steps and certified is None:
        return run_spec_graphed(engine, ids, max_new_tokens, stop_ids, block_size, policy, notify)
    runner, device, vocab = engine.runner, engine.device, engine.target.config.vocab_size
    n = ids.shape[1]
    max_length, stop = n + max_new_tokens, set(stop_ids)

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=block_size > 1)   # [1, 1, V], [1, n, F]
    tokens = [int(sample(logits, temperature, generator).item())]
    notify(tokens[-1:])
    ctx, ctx_start = features, 0                   # context features not yet in the draft cache
    t1 = engine.clock()

    acceptance, start = [], n
    mask_row = torch.full((1, block_size), engine.drafter.mask_token_id, dtype=torch.long, device=device)
    # Greedy runs whole blocks to the end where max_seq_len has room: an eager tail step costs more than
    # the rows it saves (on a hybrid target its attention reaches cuDNN, which plans each new shape:
    # ~60 ms on an H100). The drafter does not see the rows past max_length, so it drafts what the
    # shorter block of stock and the batched engine drafts.
    # Sampling keeps stock's shorter tail block, so that it draws the same random numbers.
    whole_blocks = temperature == 0 and certified is None
    stopped = tokens[0] in stop
    while start + 1 < max_length and not stopped:
        step = len(acceptance)
        vs = min(block_size, max_length - start)                            # rows that can be committed
        rows = block_size if whole_blocks and start + block_size <= engine.max_seq_len else vs
        block = mask_row[:, :rows].clone()                                  # [1, rows]
        block[0, 0] = tokens[-1]
        draft_probs = draft_logits = None
        if rows > 1:                                                        # draft
            draft_logits = runner.draft_step(ctx, ctx_start, block, start, block_size, visible=vs)  # [1, rows-1, V]
            if temperature > 0:
                draft_probs = sampling_probs(draft_logits, temperature)
                drafts = sample_probs(draft_probs, generator)
            else:
                drafts = torch.argmax(draft_logits, dim=-1)
            if vs > 1:
                block[:, 1:vs] = policy.step_drafts(step, start - n, drafts[:, :vs - 1], vocab)
            if rows > vs:                                                   # past max_length: never committed
                block[:, vs:] = drafts[:, vs - 1:]
        logits, features = runner.target_step(block, start, with_features=rows > 1,     # verify
                                              graphed=rows == block_size,  # [1, rows, V], [1, rows, F]
                                              head=certified.bind(block, draft_logits) if certified else None)
        if temperature > 0:                                                 # accept
            new = sampled_new_tokens(block, logits, draft_probs, temperature, generator)
        else:
            posterior = torch.argmax(logits[:, :vs], dim=-1)                # [1, vs]
            matched = accepted_prefix(block[:, 1:vs], posterior, vs - 1)   # [1]
            packed = torch.cat([matched, block[0, :vs], posterior[0]]).tolist()  # the one host transfer
            new = new_tokens(packed[1:1 + vs], packed[1 + vs:], policy.accepted(step, vs, packed[0]))
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)   # commit
        notify(tokens[-produced:])
        if vs > 1:
            ctx, ctx_start = features[:, :produced], start                  # anchor + accepted drafts
        start += produced
        acceptance.append(produced)

    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=engine.clock() - t1, steps=len(acceptance), replay_shortfalls=policy.shortfalls)


def sampled_new_tokens(block, logits, draft_probs, temperature, generator) -> list:
    """Rejection sampling (stock's): the accepted drafts, then the residual / bonus sample."""
    target_probs = sampling_probs(logits, temperature)
    if draft_probs is None:                                                 # no drafts: sample the bonus
        return [int(sample_probs(target_probs[:, -1], generator)[0])]
    accepted, bonus = rejection_sample(block[:, 1:], target_probs, draft_probs, generator)
    return block[0, 1:accepted + 1].tolist() + [int(bonus)]


def run_spec_graphed(engine, ids, max_new_tokens, stop_ids, block_size, policy, notify=_ignore) -> GenerationResult:
    """Greedy: each step is one call of the fused step (draft, verify, accept on the device; the next
    step's control written by the step itself). The host reads [matched, block, posterior, start]
    (the only sync), commits by the same rule and, with early launch, launches the next step as soon
    as it has seen no stop and no end; otherwise it first uploads the control it computed itself."""
    fused, b = engine.runner.fused, block_size
    n = ids.shape[1]
    max_length, stop = n + max_new_tokens, set(stop_ids)
    fused.capture_all(b)                                    # no-op once captured; before the clock
    fused.load_plan(policy, b, n, max_length)               # replay's tables, before the clock

    t0 = engine.clock()
    logits, features = engine.runner.prefill(ids, with_features=True)      # [1, 1, V], [1, n, F]
    tokens = [int(torch.argmax(logits[0, -1]).item())]
    t1 = engine.clock()
    notify(tokens[-1:])

    acceptance, start, pending = [], n, None
    if tokens[0] not in stop and start + 1 < max_length:
        fused.write_prompt_context(features)                # the first draft's context: the prompt
        fused.spec_send(b, start, 0, 0, tokens[-1], max_length, 0, policy.replays)
        pending = fused.spec_launch(b, start + min(b, max_length - start))
    while pending is not None:
        step, vs = len(acceptance), min(b, max_length - start)
        packed = pending.values()                           # waits for the step
        if packed[-1] != start:
            raise RuntimeError(f"fused spec step ran at position {packed[-1]}, the host expected {start}")
        new = new_tokens(packed[1:1 + b], packed[1 + b:1 + 2 * b], policy.accepted(step, vs, packed[0]))
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        notify(tokens[-produced:])
        ctx_start, start, pending = start, start + produced, None
        acceptance.append(produced)
        if start + 1 < max_length and not stopped:
            if not engine.config.early_launch:              # the host's own control for the step
                fused.spec_send(b, start, ctx_start, produced, tokens[-1], max_length, step + 1, policy.replays)
            pending = fused.spec_launch(b, start + min(b, max_length - start))

    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=engine.clock() - t1, steps=len(acceptance), replay_shortfalls=policy.shortfalls)
