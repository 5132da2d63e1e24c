"""The speculative loop with tree verification (EngineConfig.tree_budget > 0). Greedy dense trees take
the fused step instead (tree/fused.py: the same step as one captured call); this loop runs the rest.

Per step, anchor at position `start` (as engine/spec.py's chain loop):
  draft  the block [anchor, mask x (vs - 1)] -> draft logits at depths 1..vs-1
  tree   best-first under the node budget, on the device (build.py)
  verify one target forward over the tree's nodes (ancestor mask; hybrid: per-node conv / state),
         CUDA-graphed per node budget when the engine graphs (graphs.py)
  accept greedy: the longest path of target-argmax tokens + bonus, on the device, read back with the
         tree in one copy (accept.py); temperature > 0:
         recursive rejection sampling over each node's children (sampling.py); commit / stop as chain
  commit the path's K/V into its positional slots, the hybrid state at its last node (commit.py);
         the path's target features become the next draft's context
Output (greedy): identical tokens to the chain loop and to AR decoding (fp32); only the steps differ.
Sampled: the target's distribution exactly (a different random stream from the chain loop's).
"""
from __future__ import annotations

import torch

from specpilot.verify.sampling import sample, sampling_probs

from ..accept import commit
from ..result import GenerationResult
from .accept import read_step
from .commit import commit_path, move_kv
from .fused import fused_tree_usable, run_tree_fused
from .graphs import kv_mover, tree_step
from .sampling import sampled_path

TREE_EAGER = ("tree verification: greedy trees on dense targets run one fused step a block (tree/fused.py); "
              "sampled and hybrid trees run the stepwise loop, its tree step (build + verify + accept) graphed "
              "per node budget, one host read a step")


def check_tree_request(engine, temperature, replay) -> None:
    """The tree loop's refusals, each naming what to change."""
    if replay is not None:
        raise ValueError("replay forces chain acceptance counts: use tree_budget=0 with replay")
    if engine.certified_head is not None:
        raise ValueError("two_level='certified-head' runs on the chain loop only: use tree_budget=0 with it")


def run_tree_spec(engine, ids, max_new_tokens, stop_ids, block_size, budget, temperature=0.0,
                  generator=None) -> GenerationResult:
    # ids [1, n]
    if fused_tree_usable(engine, temperature, block_size, budget):
        return run_tree_fused(engine, ids, max_new_tokens, stop_ids, block_size, budget)
    runner, device, target = engine.runner, engine.device, engine.target
    n = ids.shape[1]
    max_length, stop = n + max_new_tokens, set(stop_ids)

    t0 = engine.clock()
    logits, features = runner.prefill(ids, with_features=block_size > 1)   # [1, 1, V], [1, n, F]
    tokens = [int(sample(logits, temperature, generator).item())]
    ctx, ctx_start = features, 0                   # context features not yet in the draft cache
    t1 = engine.clock()

    acceptance, start = [], n
    mask_row = torch.full((1, block_size), engine.drafter.mask_token_id, dtype=torch.long, device=device)
    stopped = tokens[0] in stop
    while start + 1 < max_length and not stopped:
        vs = min(block_size, max_length - start)
        draft_logits = torch.empty(0, target.config.vocab_size, device=device)
        if vs > 1:                                                          # draft
            block = mask_row[:, :vs].clone()                                # [1, vs]
            block[0, 0] = tokens[-1]
            draft_logits = runner.draft_step(ctx, ctx_start, block, start, block_size)[0]   # [vs-1, V]
        record, read, logits, feats = tree_step(runner, start, draft_logits, tokens[-1], budget, block_size, vs > 1)
        path, bonus, tree = read_step(read, record.size)                   # the one host read of the step
        if temperature > 0:                                                 # accept: sampled on the host
            path, bonus = sampled_path(tree, sampling_probs(logits[0], temperature), generator)
        record.tree = tree
        new = [tree.tokens[i] for i in path[1:]] + [bonus]
        produced, stopped = commit(new, max_length - start - 1, stop, tokens)
        if vs > 1:       # before the commit: a graph's outputs are only valid until another graph replays
            ctx = feats[:, torch.tensor(path[:produced], device=device)]   # anchor + accepted drafts
            ctx_start = start
        full = record.size == budget
        commit_path(runner.cache, record, path[:produced], kv_mover(runner, budget) if full else move_kv)
        start += produced
        acceptance.append(produced)

    return GenerationResult(prompt_len=n, tokens=tokens, acceptance_lengths=acceptance, prefill_s=t1 - t0,
                            decode_s=engine.clock() - t1, steps=len(acceptance))
