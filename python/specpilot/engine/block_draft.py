"""Greedy draft steps of the block drafters behind sessions (DFlash2, DSpark), CUDA-graphed as
StepRunner.draft_step graphs DFlash's: a full-size block with its context padded to the block's rows
(padding written to the draft cache's trash slot, which no query sees) and a bucketed kv span.
Odd shapes (the first draft with the whole prompt as context, tail blocks) and sampled drafts (they
draw from a host generator) run eagerly with the same function. `warm_block_drafts` captures every
span ahead of a timed run, as Engine.warmup does for DFlash."""
from __future__ import annotations

import torch


def block_draft(engine, key: str, draft_fn, ctx, ctx_start: int, block, start: int, full_block: int):
    """draft_fn(ctx_features [1, C, F], ctx_positions [C], block_ids [1, T], block_positions [T], kv_len)
    -> a tensor or tuple of tensors (the drafts); graphed when the engine graphs, T == full_block and
    C <= T."""
    runner = engine.runner
    c, t = ctx.shape[1], block.shape[1]
    device = block.device
    block_positions = torch.arange(start, start + t, device=device)
    if not runner.use_graphs or t != full_block or c > t:
        ctx_positions = torch.arange(ctx_start, ctx_start + c, device=device)
        return draft_fn(ctx, ctx_positions, block, block_positions, start + t)
    rows = torch.arange(t, device=device)
    ctx_positions = torch.where(rows < c, ctx_start + rows, torch.full_like(rows, engine.draft_cache.trash_slot))
    if c < t:
        ctx = torch.cat([ctx, ctx.new_zeros(1, t - c, ctx.shape[2])], dim=1)
    span = runner.kv_span(start + t)
    graph_key = (key, t, span)
    if graph_key not in runner.graphs:
        def fn(f, cp, b, bp):
            return draft_fn(f, cp, b, bp, span)
        runner.graphs[graph_key] = runner.step_factory(fn, (ctx, ctx_positions, block, block_positions), runner.pool)
    return runner.graphs[graph_key](ctx, ctx_positions, block, block_positions)


def warm_block_drafts(engine, block_size: int) -> None:
    """Captures the greedy draft graph of every kv span of a DFlash2 / DSpark / PARD drafter (scratch
    K/V, overwritten before it is seen)."""
    if not engine.runner.use_graphs or block_size < 2:
        return
    pard = engine.drafter.kind == "pard"
    if pard and engine.drafter.config.pard2:
        return                                                # PARD-2 drafts eagerly (its features vary)
    rows = 2 * (block_size - 1) if pard else block_size       # PARD: the padded input (models/drafters/pard.py)
    width = len(engine.runner.feature_layers) * engine.target.config.hidden_size
    for span in engine.runner.kv_spans():
        start = span - rows
        if start < 1:
            continue
        session = engine.drafter.session(engine, block_size)
        if pard:
            session.pending = [0]
        else:
            session.begin(None, 0, torch.zeros(1, 1, width, device=engine.device, dtype=engine.target.dtype))
            session.ctx_start = start - 1
        session.propose(0, start, block_size - 1, 0.0, None)
