"""The greedy tree step as one captured call: dense targets, DFlash drafters, EngineConfig.fused_steps.

The fused chain step (engine/fused_steps.py) with the verify replaced by a tree's. Control is the
chain step's (step_kernels.CONTROL, on the device); per step, with no host value in between:
  1. draft context: the features of the last step's committed path -> draft cache (padding -> trash).
  2. draft block [anchor, mask x (B-1)] at positions start.. (rows >= vs at the trash slot, unseen).
  3. tree of N nodes from the B-1 depths' logits (build.grow_tree; depths past vs - 1 stay out),
     packed (slots start.., rope start + depth), the target over it, its argmax, the greedy path
     (graphs.verify_tree, as the stepwise step; every tree fills the budget, build.fills_budget, so
     no node lies deeper than vs - 1).
  4. commit by the rule of engine/accept.py (a + 1 tokens, capped by max_length; a stop token is
     the host's to see): the path's K/V into slots start.. (commit.move_kv), its features into the
     next draft's context, the next step's control.
  Output (int64 [3 + B]): [accepted drafts a, bonus, the path's tokens (root first, B), start].
So the host reads one small tensor a step and, with early launch, launches the next step at once, as
for the chain. The same arithmetic as the stepwise tree loop (tree/loop.py) except the draft of a tail
block, which runs padded to B rows as in the fused chain step.
"""
from __future__ import annotations

import torch

from ..accept import commit, produced_count
from ..result import GenerationResult
from ..step_kernels import ANCHOR, MAX_LENGTH, START, STEP
from .build import fills_budget
from .commit import move_kv
from .graphs import verify_tree


def fused_tree_usable(engine, temperature: float, block_size: int, budget: int) -> bool:
    """Whether a tree run takes the fused step: greedy, a dense target with fused steps (the engine
    turns them off for hybrids), a DFlash drafter, and every step's tree fills the budget."""
    from ..engine import drafter_kind                      # engine.py imports the tree loops

    return (temperature == 0 and engine.config.fused_steps and block_size > 1
            and drafter_kind(engine.drafter) == "dflash" and fills_budget(engine.target.config.vocab_size, budget))


def tree_step_fn(fused, b: int, n: int, span: int):
    """The step function of the module docstring for block b, N = n nodes, kv span `span`."""
    ctl, feats = fused._spec_buffers(b)
    trash, cache, device = fused.trash, fused.cache, fused.device
    # constants and outputs, made outside the graph
    rows = torch.arange(b, device=device)
    nodes = torch.arange(n, device=device)
    mask_block = torch.full((1, b), fused.drafter.mask_token_id, dtype=torch.long, device=device)
    out = torch.zeros(3 + b, dtype=torch.long, device=device)

    def fn():
        forwards = fused.forwards                               # looked up per call: tests swap the drafter's
        start, ctx_start, ctx_count, vs, anchor = (ctl[i:i + 1] for i in range(START, ANCHOR + 1))
        max_length = ctl[MAX_LENGTH:MAX_LENGTH + 1]
        ctx_pos = torch.where(rows < ctx_count, ctx_start + rows, trash)
        blk_pos = torch.where(rows < vs, start + rows, trash)
        mask_block[:, :1].copy_(anchor.view(1, 1))
        forwards.write_context(feats, ctx_pos)
        draft_logits = forwards.draft(mask_block, blk_pos, span, start + vs - 1)          # [1, B-1, V]
        meta = torch.cat([anchor, start, vs - 1])
        grown, accepted, logits, new_feats = verify_tree(forwards.tree_build, forwards.tree_target, draft_logits[0],
                                                         meta, n, span, True)
        a, bonus, path = accepted[0:1], accepted[1:2], accepted[2:]                        # path [B], padded with N
        produced = produced_count(a, max_length - start - 1)
        on_path = path.clamp(max=n - 1)
        # K/V: slot start + d takes node path[d]'s for d < produced; every other slot stays
        src = torch.where(nodes < produced, torch.cat([on_path, nodes[b:]]) if n > b else on_path[:n], nodes)
        move_kv(cache, torch.cat([start + src, start + nodes]))
        feats.copy_(new_feats[:, on_path])                      # rows past `produced` are not read
        path_tokens = grown.tokens.index_select(0, on_path)
        last = torch.where(produced <= a, path_tokens.gather(0, produced.clamp(max=b - 1)), bonus)
        after = start + produced
        out.copy_(torch.cat([a, bonus, path_tokens, start]))
        ctl[START:ANCHOR + 1].copy_(torch.cat([after, start, produced, (max_length - after).clamp(max=b), last]))
        ctl[STEP:STEP + 1].add_(1)
        return out
    return fn


def run_tree_fused(engine, ids, max_new_tokens, stop_ids, block_size, budget) -> GenerationResult:
    """Greedy tree decoding with the fused step (fused_tree_usable): the host reads [a, bonus, path
    tokens, start] a step, commits by the same rule and launches the next step."""
    fused, b = engine.runner.fused, block_size
    n = ids.shape[1]
    max_length, stop = n + max_new_tokens, set(stop_ids)
    fused.capture_all(b, budget)                            # no-op once captured; before the clock

    t0 = engine.clock()
    logits, features = engine.runner.prefill(ids, with_features=True)      # [1, 1, V], [1, n, F]
    tokens = [int(torch.argmax(logits[0, -1]).item())]
    t1 = engine.clock()

    acceptance, start, pending = [], n, None
    if tokens[0] not in stop and start + 1 < max_length:
        fused.write_prompt_context(features)
        fused.spec_send(b, start, 0, 0, tokens[-1], max_length, 0, False)
        pending = fused.tree_launch(b, budget, start)
    while pending is not None:
        packed = pending.values()                           # waits for the step
        if packed[-1] != start:
            raise RuntimeError(f"fused tree step ran at position {packed[-1]}, the host expected {start}")
        accepted = packed[0]
        new = packed[3:3 + accepted] + [packed[1]]
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        ctx_start, start, pending = start, start + produced, None
        acceptance.append(produced)
        if start + 1 < max_length and not stopped:
            if not engine.config.early_launch:              # the host's own control for the step
                fused.spec_send(b, start, ctx_start, produced, tokens[-1], max_length, len(acceptance), False)
            pending = fused.tree_launch(b, budget, start)

    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=engine.clock() - t1, steps=len(acceptance))
