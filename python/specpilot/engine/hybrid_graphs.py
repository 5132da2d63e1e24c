"""CUDA-graphed steps of a hybrid recurrent target (models/hybrid.py): the AR step (T=1) and the
verify step (T=B), one graph per (T, features, kv span) as the dense target's steps (steps.py).

A hybrid forward starts with host work that a graph cannot hold: HybridCache.begin commits the
accepted prefix of the last forward (Python on its pending record, then copies of the accepted
snapshot and conv window into the committed state). So a step is split: `begin` runs eagerly, then
the graph replays the device work (HybridLM.forward_begun) over fixed memory only: the ids and
positions (GraphedStep's input buffers), the KV cache, the committed conv / recurrent states (both
updated in place), and the conv windows / per-position states the forward writes (the cache's
reserved step buffers for T, shared by every kv span's graph). A replay runs none of the forward's
Python, so afterwards the cache is pointed at those buffers (HybridCache.adopt).

Exactness: a replay runs the kernels of the eager forward_begun at the same kv span (the eager
path writes the same reserved buffers once they exist), so graphed and eager steps at one span
produce the same bits (tests/test_hybrid_graphs_gpu.py).
"""
from __future__ import annotations

import torch

from .recurrent_state import MAX_SNAPSHOT_T


class HybridGraphSteps:
    def __init__(self, runner):
        """runner: the engine's StepRunner (its target, cache, graphs dict, step factory and pool)."""
        self.runner = runner

    def graphable(self, t: int) -> bool:
        """Whether a t-token step is graphed (its per-position states fit the reserved buffers)."""
        return t <= MAX_SNAPSHOT_T

    def step(self, ids, start: int, with_features: bool):
        """ids [1, T] at positions start..start+T-1 -> (logits [1, T, V], features [1, T, F] or None),
        the outputs being the graph's static tensors (valid until its next replay)."""
        runner, t = self.runner, ids.shape[1]
        positions = torch.arange(start, start + t, device=ids.device)
        if not self.graphable(t):
            return runner.forward_target(ids, positions, start + t, with_features)
        runner.cache.begin(start, t)                     # host: commit the last forward's accepted prefix
        out = self._graph(ids, positions, start, with_features)(ids, positions)
        runner.cache.adopt(t)
        return out

    def warm(self, ids, start: int, with_features: bool) -> None:
        """Captures the graph a step of ids [1, T] at `start` would use, without a step: scratch K/V
        land in slots start.. (overwritten before they are visible, as the dense warmup's), and the
        cache is reset, so the next forward must be a prefill (position 0)."""
        t = ids.shape[1]
        if self.graphable(t):
            positions = torch.arange(start, start + t, device=ids.device)
            self._graph(ids, positions, start, with_features)
        self.runner.cache.reset()

    def _graph(self, ids, positions, start: int, with_features: bool):
        runner, t = self.runner, ids.shape[1]
        span = runner.kv_span(start + t)
        key = ("target", t, with_features, span)
        if key not in runner.graphs:
            runner.cache.reserve(t)
            layers = runner.feature_layers if with_features else ()
            target, cache = runner.target, runner.cache

            def fn(i, p):
                with runner.kernel_ctx(t):
                    return target.forward_begun(i, p, cache, span, True, layers)
            runner.graphs[key] = runner.step_factory(fn, (ids, positions), runner.pool)
        return runner.graphs[key]
