"""CUDA graphs of the batched engine's decode forwards: the drafter's block forward and the target's
verify (or AR) forward, captured per (kind, request bucket, rows per request, key bucket).

A graphed forward runs over a padded layout (forward.padded): R requests x T rows, request r's rows at
[r*T, (r+1)*T), R the next request bucket >= the running count, T the block (1 for AR; prefix-first's
passes: P and block - P; adaptive verify's quarters of the block), the attention's key columns the
longest context's bucket (graphs.kv_bucket, EngineConfig.graph_kv_step). Padding rows and padding requests write
their K/V to the engine's trash slot and nobody reads it, so a real row's result is the eager
forward's (same kernels, same shapes per request: tests/test_batch_graphs.py checks tokens against
the eager engine). What stays eager: the prefill chunks (their own forward beside the graphed decode
rows), a draft context append whose rows are not the last graphed verify's, the mechanisms'
ablations, and the drafting of kinds other than DFlash (kind_drafting.py; their verify is graphed).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from specpilot.engine.graphs import GraphedStep, kv_bucket
from specpilot.kernels import paged_attention

from . import forward

REQUEST_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Prompt rows per tile of a graphed prefill chunk: the paged kernel's rows per request (T <= 32); at
# 16 a 256-row chunk is 16 tiles, and the chunk's K/V is read once per tile.
PREFILL_TILE = 16


def request_bucket(n: int) -> int:
    for b in REQUEST_BUCKETS:
        if b >= n:
            return b
    return -(-n // 64) * 64


def buckets_up_to(top: int) -> list:
    """Every request bucket up to the bucket `top` (itself included past REQUEST_BUCKETS)."""
    return [b for b in REQUEST_BUCKETS if b <= top] + ([top] if top > REQUEST_BUCKETS[-1] else [])


class DecodeGraphs:
    def __init__(self, engine, step_factory=None):
        """step_factory: GraphedStep (CUDA) or graphs.StaticShapeStep (the CPU tests of this path)."""
        self.engine = engine
        self.factory = step_factory or GraphedStep
        self.pool = torch.cuda.graph_pool_handle() if self.factory is GraphedStep else None
        self.steps = {}
        self.slots = engine.pool.num_pages * engine.page_size       # the trash slot's index = the last real + 1
        # the paged kernel's page table covers keys // page_size pages: a step's spans are whole pages
        step = engine.engine_config.graph_kv_step
        self.kv_step = math.lcm(step, engine.page_size) if step else 0
        self.paged = self._paged_kernel_runs(engine)
        self.prefill_tile = PREFILL_TILE
        self.feature_width = len(engine.feature_layers) * engine.target.config.hidden_size

    @staticmethod
    def _paged_kernel_runs(engine) -> bool:
        """Whether the attention of the graphed forwards is the paged kernel (CUDA, bf16, its head dims)
        for the target and the drafter alike; else SDPA over gathered K/V."""
        rows = max(engine.block_size, 1)
        for model, cache in ((engine.target, engine.cache), (engine.drafter, engine.draft_cache)):
            if model is None:
                continue
            c = model.config
            q = torch.empty((1, c.num_heads, rows, c.head_dim), dtype=cache.k[0].dtype, device=cache.k[0].device)
            if not paged_attention.uses_kernel(q, cache.k[0]):
                return False
        return True

    def shape(self, segments: list) -> tuple:
        """(request bucket, key bucket) of a forward over `segments`."""
        keys = max(s.start + s.rows for s in segments)
        return request_bucket(len(segments)), self.key_bucket(keys)

    def key_bucket(self, keys: int) -> int:
        """The key columns of a graphed forward whose longest context is `keys` positions."""
        return kv_bucket(keys, max(self.slots, keys), self.kv_step)

    def padded(self, segments: list, rows: int, last=None) -> tuple:
        """(R, S, host arrays) of forward.padded for `segments` padded to the buckets."""
        requests, keys = self.shape(segments)
        return requests, keys, forward.padded(segments, requests, rows, keys, self.engine.page_size,
                                              self.engine.trash_slot, last, self.paged)

    def layout(self, positions, slots, keys, padded_last):
        """The PaddedLayout over uploaded arrays (keys: the page table with the paged kernel)."""
        if self.paged:
            return forward.PaddedLayout(positions, slots, keys.int(), padded_last, self.engine.page_size)
        return forward.PaddedLayout(positions, slots, keys, padded_last)

    def warmup(self, max_context: int) -> int:
        """Captures the decode forwards for every request bucket up to the engine's max_batch and the
        prefill forwards for every tile bucket up to a whole chunk's, each at every key bucket a request
        of at most `max_context` positions (prompt + max_new_tokens) can reach, on an all-padding layout
        (only the trash page is written), so no capture lands inside a run.
        Returns the number of graphs."""
        from . import prefill_tiles      # it builds on this module

        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
            raise ValueError(f"warmup: max_context={max_context!r} must be an int >= 1 (prompt + max_new_tokens)")
        t, top = self.engine.block_size, request_bucket(self.engine.max_batch)
        prefix = self.engine.config.verify_prefix if self.engine.drafter is not None else 0
        target_rows = (prefix, t - prefix) if prefix else self.engine.verify_row_choices   # prefix-first's two passes
        keys = sorted({self.key_bucket(n) for n in range(1, max_context + 1)})
        for requests in buckets_up_to(top):
            for key_count in keys:
                for rows in sorted({t} | set(target_rows)):
                    arrays = forward.padded([], requests, rows, key_count, self.engine.page_size,
                                            self.engine.trash_slot, paged=self.paged)
                    positions, slots, key_array, padded_last, ids = self.engine.staging.upload(
                        arrays + [np.zeros(requests * rows, dtype=np.int64)])
                    key_array, padded_last = key_array.view(requests, -1), padded_last.view(requests, rows)
                    if rows == t and self.engine.drafter is not None and self.engine.kind_drafting is None:
                        if key_count == keys[0]:         # the context append has no key axis: one per bucket
                            self.context(self.engine.draft_cache.k[0].new_zeros(requests * t, self.feature_width),
                                         positions, slots)
                        self.draft(ids, positions, slots, key_array, padded_last)
                    if rows in target_rows:
                        self.target(ids, positions, slots, key_array, padded_last)
                        for tiles in self.tile_buckets():
                            self.mixed(ids, positions, slots, key_array, padded_last,
                                       prefill_tiles.upload(self.engine, prefill_tiles.EMPTY, tiles, key_count))
        for requests in buckets_up_to(self.prefill_requests):      # the prefill tiles' forwards
            for key_count in keys:
                self.prefill(*prefill_tiles.upload(self.engine, prefill_tiles.EMPTY, requests, key_count))
        return len(self.steps)

    @property
    def prefill_requests(self) -> int:
        """The tiles of one graphed prefill forward at most: a whole chunk's (BatchConfig.prefill_chunk)."""
        return request_bucket(-(-self.engine.config.prefill_chunk // self.prefill_tile))

    def context(self, features, positions, slots) -> None:
        """The drafter's context append over R requests x T rows: features [R*T, F] -> K/V at `slots`
        (padding rows: the trash slot)."""
        r = features.shape[0] // self.engine.block_size
        key = ("context", r, self.engine.block_size)
        if key not in self.steps:
            drafter, cache = self.engine.drafter, self.engine.draft_cache

            def fn(features, positions, slots):
                forward.draft_context(drafter, cache, forward.Rows(positions, slots), features)
            self.steps[key] = self._capture(fn, (features, positions, slots), features.shape[0], key)
        self.steps[key](features, positions, slots)

    def draft(self, ids, positions, slots, keys, padded_last) -> torch.Tensor:
        """The drafter's block forward: ids [R*T] -> logits [R*(T-1), V] (the rows after each anchor)."""
        r, t = padded_last.shape
        key = ("draft", r, t, keys.shape[1])
        if key not in self.steps:
            keep = torch.arange(r * t, device=ids.device).view(r, t)[:, 1:].reshape(-1)
            drafter, cache = self.engine.drafter, self.engine.draft_cache

            def fn(ids, positions, slots, keys, padded_last):
                layout = self.layout(positions, slots, keys, padded_last)
                return forward.draft_block(drafter, cache, layout, ids, keep)
            self.steps[key] = self._capture(fn, (ids, positions, slots, keys, padded_last), r * t, key)
        return self.steps[key](ids, positions, slots, keys, padded_last)

    def target(self, ids, positions, slots, keys, padded_last) -> tuple:
        """The target's forward: ids [R*T] -> (logits [R*T, V], features [R*T, F] or None)."""
        r, t = padded_last.shape

        def layout_ids(positions, slots, keys, padded_last):
            return self.layout(positions, slots, keys, padded_last), None
        return self._target_forward(("target", r, t, keys.shape[1]), (ids, positions, slots, keys, padded_last),
                                    r * t, layout_ids)

    def prefill(self, ids, positions, slots, keys, padded_last, logit_rows) -> tuple:
        """The target over prompt tiles (R tiles x prefill_tile rows): ids [R*T] -> (logits [R, V] at
        `logit_rows` [R] (each tile's last real row), features [R*T, F] or None)."""
        r, t = padded_last.shape

        def layout_ids(positions, slots, keys, padded_last, logit_rows):
            return self.layout(positions, slots, keys, padded_last), logit_rows
        return self._target_forward(("prefill", r, t, keys.shape[1]),
                                    (ids, positions, slots, keys, padded_last, logit_rows), r * t, layout_ids)

    def mixed(self, ids, positions, slots, keys, padded_last, tiles: tuple) -> tuple:
        """The target's forward over a step's decode rows (R x T, as `target`) and prefill tiles in one
        pass (forward.SplitLayout): tiles = (ids [P*tile], positions, slots, keys [P, K], last [P, tile],
        logit_rows [P] within the tiles) -> (logits [R*T + P, V]: every decode row, then each tile's
        `logit_rows` row; features [R*T + P*tile, F] or None)."""
        r, t = padded_last.shape
        p, tile = tiles[4].shape
        decode_rows = torch.arange(r * t, device=ids.device)

        def layout_ids(positions, slots, keys, padded_last, t_ids, t_positions, t_slots, t_keys, t_last, t_rows):
            layout = forward.SplitLayout(self.layout(positions, slots, keys, padded_last),
                                         self.layout(t_positions, t_slots, t_keys, t_last))
            return layout, torch.cat([decode_rows, t_rows + r * t]), t_ids
        return self._target_forward(("mixed", r, t, p, keys.shape[1]),
                                    (ids, positions, slots, keys, padded_last) + tuple(tiles), r * t + p * tile,
                                    layout_ids)

    def _target_forward(self, key: tuple, inputs: tuple, rows: int, layout_of) -> tuple:
        """forward.target_forward graphed once per key and replayed: inputs[0] the ids; layout_of(*the
        rest) -> (layout, logit rows or None[, ids appended after inputs[0]]). Returns (logits,
        features or None)."""
        if key not in self.steps:
            target, cache, taps = self.engine.target, self.engine.cache, self.engine.feature_layers

            def fn(ids, *rest):
                layout, logit_rows, *more_ids = layout_of(*rest)
                logits, features = forward.target_forward(target, cache, layout, torch.cat([ids, *more_ids])
                                                          if more_ids else ids, taps, logit_rows)
                return (logits, features) if features is not None else (logits,)
            self.steps[key] = self._capture(fn, inputs, rows, key)
        out = self.steps[key](*inputs)
        return (out[0], out[1]) if len(out) == 2 else (out[0], None)

    def tile_buckets(self) -> list:
        """The tile counts a mixed forward is captured for: a whole chunk's, and a quarter of it (a short
        prompt's chunk then pads to fewer rows)."""
        top = self.prefill_requests
        return sorted({top, request_bucket(max(1, top // 4))})

    def _capture(self, fn, inputs: tuple, rows: int, key: tuple):
        """The step for `fn` over `rows` token rows, its linears' kernel chosen for that many rows inside
        the function, so a capture bakes the choice in and a replay sets nothing on the host. A failed
        capture names its graph (kind, requests, rows per request, keys): CUDA's own error does not."""
        def with_kernels(*args):
            with self.engine.kernels(rows):
                return fn(*args)
        try:
            return self.factory(with_kernels, inputs, pool=self.pool)
        except RuntimeError as e:
            raise RuntimeError(f"capturing the batched engine's {key[0]} graph {key[1:]} ({len(self.steps)} "
                               f"captured before it) failed: {e}") from e
