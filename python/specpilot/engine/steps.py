"""The engine's forward steps, eager or CUDA-graphed: prefill, AR decode, B-token verify, draft.

Graphed steps have fixed shapes: the AR step (T=1), the full-block verify (T=B) and the full-block
draft step (context padded to B rows, padding written to the cache's trash slot). Odd shapes (the
prefill, the tail block `verify_size < B`, the first draft after the prefill with the whole prompt as
context) run eagerly with the same modules. Attention spans the cache slots [0, kv_len); graphs use
a power-of-two bucket of kv_len (masked slots add nothing), eager calls the exact length.
"""
from __future__ import annotations

import contextlib

import torch

from .cache import KVCache
from .graphs import GraphedStep, kv_bucket
from .linear_kernels import cuda_switchable, linear_kernel_for_rows


@contextlib.contextmanager
def compiled(model):
    """Use the model's compiled layer forwards (if any) while a fixed-shape step is traced."""
    model.use_compiled = True
    try:
        yield
    finally:
        model.use_compiled = False


class StepRunner:
    def __init__(self, target, drafter, cache: KVCache, draft_cache: KVCache | None, use_graphs: bool,
                 step_factory=None):
        """step_factory: GraphedStep (default, CUDA) or graphs.StaticShapeStep (CPU tests of the path)."""
        self.target, self.drafter = target, drafter
        self.cache, self.draft_cache = cache, draft_cache
        self.use_graphs = use_graphs
        self.feature_layers = tuple(drafter.target_layer_ids) if drafter is not None else ()
        self.capacity = cache.slots
        self.graphs = {}
        self.step_factory = step_factory or GraphedStep
        self.pool = torch.cuda.graph_pool_handle() if use_graphs and self.step_factory is GraphedStep else None
        from .fused_steps import FusedSteps
        self._switchable = None                               # split12 linears whose kernel we pick
        self.fused = FusedSteps(self)                         # whole greedy steps, one graph each

    def compiled_ctx(self, model):
        return compiled(model)

    def kernel_ctx(self, rows: int):
        """split12 / bf16-twin linears: the M=1 kernel for one row, tensor cores for more (CUDA)."""
        if self._switchable is None:
            self._switchable = cuda_switchable((self.target, self.drafter))
        return linear_kernel_for_rows(self._switchable, rows)

    # -- target ---------------------------------------------------------------------------------
    def _target(self, ids, positions, kv_len: int, with_features: bool, logits_rows=None):
        layers = self.feature_layers if with_features else ()
        with self.kernel_ctx(ids.shape[1]):
            return self.target(ids, positions, self.cache, kv_len, layers, logits_rows)

    def prefill(self, ids, with_features: bool):
        """ids [1, T] at positions 0..T-1 -> (last logits [1, 1, V], features [1, T, F] or None)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self._target(ids, positions, ids.shape[1], with_features, logits_rows=1)

    def target_step(self, ids, start: int, with_features: bool, graphed: bool = True):
        """ids [1, T] at positions start..start+T-1 -> (logits [1, T, V], features [1, T, F] or None).

        T == 1 is the AR decode step, T == B the verify step; both are graphed on CUDA (a tail block,
        graphed=False, runs eagerly)."""
        t = ids.shape[1]
        positions = torch.arange(start, start + t, device=ids.device)
        if not self.use_graphs or not graphed:
            return self._target(ids, positions, start + t, with_features)
        span = kv_bucket(start + t, self.capacity)
        key = ("target", t, with_features, span)
        if key not in self.graphs:
            def fn(i, p):
                with compiled(self.target):
                    return self._target(i, p, span, with_features)
            self.graphs[key] = self.step_factory(fn, (ids, positions), self.pool)
        return self.graphs[key](ids, positions)

    # -- drafter --------------------------------------------------------------------------------
    def _draft(self, ctx_features, ctx_positions, block_ids, block_positions, kv_len: int):
        with self.kernel_ctx(ctx_features.shape[1]):
            self.drafter.write_context(ctx_features, ctx_positions, self.draft_cache)
        with self.kernel_ctx(block_ids.shape[1]):
            return self.drafter.forward_block(block_ids, block_positions, self.draft_cache, kv_len)

    def draft_step(self, ctx_features, ctx_start: int, block_ids, start: int, full_block: int):
        """Injects ctx_features [1, C, F] (target features at positions ctx_start..ctx_start+C-1) and
        drafts block_ids [1, T] at positions start..start+T-1 -> draft logits [1, T-1, V].

        Graphed when T == full_block and C <= T: the context is padded to T rows (padding -> trash)."""
        c, t = ctx_features.shape[1], block_ids.shape[1]
        device = block_ids.device
        block_positions = torch.arange(start, start + t, device=device)
        if not self.use_graphs or t != full_block or c > t:
            ctx_positions = torch.arange(ctx_start, ctx_start + c, device=device)
            return self._draft(ctx_features, ctx_positions, block_ids, block_positions, start + t)
        rows = torch.arange(t, device=device)
        ctx_positions = torch.where(rows < c, ctx_start + rows, torch.full_like(rows, self.draft_cache.trash_slot))
        if c < t:
            pad = ctx_features.new_zeros(1, t - c, ctx_features.shape[2])
            ctx_features = torch.cat([ctx_features, pad], dim=1)
        span = kv_bucket(start + t, self.capacity)
        key = ("draft", t, span)
        if key not in self.graphs:
            def fn(f, cp, b, bp):
                with compiled(self.drafter):
                    return self._draft(f, cp, b, bp, span)
            self.graphs[key] = self.step_factory(fn, (ctx_features, ctx_positions, block_ids, block_positions),
                                                 self.pool)
        return self.graphs[key](ctx_features, ctx_positions, block_ids, block_positions)
