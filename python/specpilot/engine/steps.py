"""The engine's forward steps, eager or CUDA-graphed: prefill, AR decode, B-token verify, draft.

Graphed steps have fixed shapes: the AR step (T=1), the full-block verify (T=B) and the full-block
draft step (context padded to B rows, padding written to the cache's trash slot). Odd shapes (the
prefill, the tail block `verify_size < B`, the first draft after the prefill with the whole prompt as
context) run eagerly with the same modules. Attention spans the cache slots [0, kv_len); graphs use
a bucket of kv_len (masked slots add nothing; EngineConfig.graph_kv_step picks the buckets:
StepRunner.kv_span), eager calls the exact length.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from specpilot import config as config_module
from specpilot.config import EngineConfig

from .cache import KVCache
from .graphs import GraphedStep, KVBuckets
from .linear_kernels import cuda_switchable, linear_kernel_for_rows


@contextlib.contextmanager
def compiled_layers(model, on: bool = True):
    """Use the model's compiled layer forwards (if any) while a fixed-shape step is traced."""
    if not on:
        yield
        return
    model.use_compiled = True
    try:
        yield
    finally:
        model.use_compiled = False


@dataclass(frozen=True)
class StepForwards:
    """The model forwards over the engine's caches that the fused steps (fused_steps.py) call, with
    the models' compiled layers (if any) in use: what a whole-step graph is traced from."""
    target: Callable          # (ids [1, T], positions [T], kv_len, with_features) -> (logits, features)
    write_context: Callable   # (features [1, C, F], positions [C]) -> None: into the draft cache
    draft: Callable           # (block_ids [1, T], positions [T], kv_len, last_visible) -> logits [1, T-1, V]
    tree_target: Callable     # (tree: tree.layout.TreeInputs, kv_len, with_features) -> (logits, features)
    tree_build: Callable      # (draft_logits [D, V], meta int64 [3], budget) -> (TreeTensors, packed)


class StepRunner:
    def __init__(self, target, drafter, cache: KVCache, draft_cache: KVCache | None, use_graphs: bool,
                 step_factory=None, config: EngineConfig = config_module.DEFAULT):
        """step_factory: GraphedStep (default, CUDA) or graphs.StaticShapeStep (CPU tests of the path);
        config: the engine's, handed to the models' op dispatch around every forward (kernel_ctx)."""
        self.target, self.drafter = target, drafter
        self.config = config
        self.cache, self.draft_cache = cache, draft_cache
        self.use_graphs = use_graphs
        self.feature_layers = tuple(drafter.target_layer_ids) if drafter is not None else ()
        self.capacity = cache.slots
        self.kv_buckets = KVBuckets(cache.slots, config.graph_kv_step)
        self.graphs = {}
        # a tree step's (anchor, position, depths) on its way to the device (engine/tree/graphs.py): pinned,
        # so the copy does not wait for the draft in flight; reused, the last copy done by the step's read
        self.tree_meta = torch.zeros(3, dtype=torch.long, pin_memory=target.device.type == "cuda")
        self.step_factory = step_factory or GraphedStep
        self.pool = torch.cuda.graph_pool_handle() if use_graphs and self.step_factory is GraphedStep else None
        from .hybrid_graphs import HybridGraphSteps
        # a hybrid target's graphed steps first commit its recurrent state on the host (hybrid_graphs.py)
        self.hybrid = HybridGraphSteps(self) if use_graphs and getattr(target, "is_hybrid", False) else None
        from .fused_steps import FusedSteps
        self._switchable = None                               # split12 linears whose kernel we pick
        forwards = StepForwards(target=functools.partial(self.forward_target, compiled=True),
                                write_context=functools.partial(self.write_draft_context, compiled=True),
                                draft=functools.partial(self.forward_draft, compiled=True),
                                tree_target=self.forward_tree, tree_build=self.grow_tree)
        self.fused = FusedSteps(forwards, cache, draft_cache, drafter, target.dtype,   # whole greedy steps
                                len(self.feature_layers) * target.config.hidden_size, use_graphs,
                                self.step_factory, self.pool, config.step_kernels, self.kv_buckets)

    def kv_span(self, needed: int) -> int:
        """The kv span of a graphed step over cache slots [0, needed), by the config's bucket rule."""
        return self.kv_buckets.span(needed)

    def kv_spans(self) -> list:
        """Every span kv_span can return: the spans warmup captures graphs for."""
        return self.kv_buckets.spans()

    @contextlib.contextmanager
    def kernel_ctx(self, rows: int):
        """The engine's config for the models' op dispatch, and the split12 / bf16-twin linears'
        kernel for `rows` token rows (the M=1 kernel for one row, tensor cores for more; CUDA)."""
        if self._switchable is None:
            self._switchable = cuda_switchable((self.target, self.drafter))
        with config_module.use(self.config), linear_kernel_for_rows(self._switchable, rows):
            yield

    # -- target ---------------------------------------------------------------------------------
    def grow_tree(self, draft_logits, meta, budget: int):
        """A step's tree grown from its draft logits and packed on the device (tree.layout.
        grown_and_packed), by the engine's config (fused_kernels: the one-kernel build)."""
        from .tree.layout import grown_and_packed

        with config_module.use(self.config):
            return grown_and_packed(draft_logits, meta, budget)

    def forward_tree(self, tree, kv_len: int, with_features: bool):
        """The target over a draft tree's nodes (tree.layout.TreeInputs: slots, rope positions and the
        ancestor mask from its packed tensor), attending to cache slots [0, kv_len)."""
        layers = self.feature_layers if with_features else ()
        with self.kernel_ctx(tree.size):
            return self.target(tree.tokens, tree.slots, self.cache, kv_len, layers, tree=tree)

    def forward_target(self, ids, positions, kv_len: int, with_features: bool, logits_rows=None,
                       compiled: bool = False, head=None):
        """The target over ids [1, T] at `positions`, attending to cache slots [0, kv_len); head: an LM
        head replacement (TargetLM.forward's)."""
        layers = self.feature_layers if with_features else ()
        with self.kernel_ctx(ids.shape[1]), compiled_layers(self.target, compiled):
            return self.target(ids, positions, self.cache, kv_len, layers, logits_rows, head=head)

    def prefill(self, ids, with_features: bool):
        """ids [1, T] at positions 0..T-1 -> (last logits [1, 1, V], features [1, T, F] or None)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.forward_target(ids, positions, ids.shape[1], with_features, logits_rows=1)

    def target_step(self, ids, start: int, with_features: bool, graphed: bool = True, head=None):
        """ids [1, T] at positions start..start+T-1 -> (logits [1, T, V], features [1, T, F] or None).

        T == 1 is the AR decode step, T == B the verify step; both are graphed on CUDA (a tail block,
        graphed=False, runs eagerly, as does a step with an LM head replacement `head`)."""
        t = ids.shape[1]
        positions = torch.arange(start, start + t, device=ids.device)
        if not self.use_graphs or not graphed or head is not None:
            return self.forward_target(ids, positions, start + t, with_features, head=head)
        if self.hybrid is not None:
            return self.hybrid.step(ids, start, with_features)
        span = self.kv_span(start + t)
        key = ("target", t, with_features, span)
        if key not in self.graphs:
            def fn(i, p):
                return self.forward_target(i, p, span, with_features, compiled=True)
            self.graphs[key] = self.step_factory(fn, (ids, positions), self.pool)
        return self.graphs[key](ids, positions)

    def warm_target_step(self, ids, start: int, with_features: bool) -> None:
        """Captures the graph of target_step(ids, start, with_features) (Engine.warmup); a hybrid
        target's capture skips its host bookkeeping and resets its cache (hybrid_graphs.py)."""
        if self.hybrid is not None:
            self.hybrid.warm(ids, start, with_features)
        else:
            self.target_step(ids, start, with_features)

    # -- drafter --------------------------------------------------------------------------------
    def write_draft_context(self, features, positions, compiled: bool = False):
        """Target features [1, C, F] at `positions` [C] into the draft cache."""
        with self.kernel_ctx(features.shape[1]), compiled_layers(self.drafter, compiled):
            self.drafter.write_context(features, positions, self.draft_cache)

    def forward_draft(self, block_ids, positions, kv_len: int, last_visible=None, compiled: bool = False):
        """The drafter over block_ids [1, T] at `positions` -> draft logits [1, T-1, V]."""
        with self.kernel_ctx(block_ids.shape[1]), compiled_layers(self.drafter, compiled):
            return self.drafter.forward_block(block_ids, positions, self.draft_cache, kv_len,
                                              last_visible=last_visible)

    def _draft(self, ctx_features, ctx_positions, block_ids, block_positions, kv_len: int, last_visible,
               compiled: bool = False):
        self.write_draft_context(ctx_features, ctx_positions, compiled)
        return self.forward_draft(block_ids, block_positions, kv_len, last_visible, compiled=compiled)

    def draft_step(self, ctx_features, ctx_start: int, block_ids, start: int, full_block: int,
                   visible: int | None = None):
        """Injects ctx_features [1, C, F] (target features at positions ctx_start..ctx_start+C-1) and
        drafts block_ids [1, T] at positions start..start+T-1 -> draft logits [1, T-1, V].

        visible < T: a tail block run at full size whose rows from `visible` on lie past max_length.
        Those rows sit at the trash slot, unseen, as in the fused step, so the real rows draft what
        stock's shorter block drafts (up to kernel rounding).

        Graphed when T == full_block: the context is padded to T rows (padding -> trash); a longer one
        (the prompt's, at the first draft) has its leading rows written eagerly first (no attention in
        a context write, so no new attention shape to plan)."""
        c, t = ctx_features.shape[1], block_ids.shape[1]
        device = block_ids.device
        visible = t if visible is None else visible
        if not 1 <= visible <= t:
            raise ValueError(f"draft_step: visible rows {visible} must be in [1, block rows {t}]")
        if self.use_graphs and t == full_block and c > t:
            lead = c - t
            self.write_draft_context(ctx_features[:, :lead], torch.arange(ctx_start, ctx_start + lead, device=device))
            ctx_features, ctx_start, c = ctx_features[:, lead:], ctx_start + lead, t
        rows = torch.arange(t, device=device)
        trash = torch.full_like(rows, self.draft_cache.trash_slot)
        block_positions = torch.where(rows < visible, start + rows, trash)
        last_visible = block_positions[visible - 1:visible]                 # on the device: no copy
        if not self.use_graphs or t != full_block:
            ctx_positions = torch.arange(ctx_start, ctx_start + c, device=device)
            return self._draft(ctx_features, ctx_positions, block_ids, block_positions, start + t, last_visible)
        ctx_positions = torch.where(rows < c, ctx_start + rows, trash)
        if c < t:
            pad = ctx_features.new_zeros(1, t - c, ctx_features.shape[2])
            ctx_features = torch.cat([ctx_features, pad], dim=1)
        span = self.kv_span(start + t)
        key = ("draft", t, span)
        if key not in self.graphs:
            def fn(f, cp, b, bp, lv):
                return self._draft(f, cp, b, bp, span, lv, compiled=True)
            self.graphs[key] = self.step_factory(
                fn, (ctx_features, ctx_positions, block_ids, block_positions, last_visible), self.pool)
        return self.graphs[key](ctx_features, ctx_positions, block_ids, block_positions, last_visible)
