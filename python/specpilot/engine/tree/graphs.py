"""The tree verify forward, eager or CUDA-graphed: one graph per (nodes N, features, kv span), in the
runner's graph dict and memory pool beside the chain steps (engine/steps.py), captured by the same
step factory (engine/graphs.py: GraphedStep on CUDA, StaticShapeStep in the CPU tests).

A graph's only input is the tree packed as int64 [4N + N*N] (engine/tree/layout.py: tokens, parents,
slots, rope positions, ancestors): the forward derives its ancestor mask and conv windows from it on
the device, so one graph serves every tree of N nodes at any anchor whose slots fit its span. Hybrid
targets (as engine/hybrid_graphs.py) run the cache's host bookkeeping (begin_tree) eagerly, and the
graph writes the per-node states into the cache's reserved buffers of N (shared with the chain steps
of N tokens and with every span's tree graph); since a replay runs no Python, the conv windows and
states the capture stashed (graph outputs, fixed memory) are stashed again after each replay.

Exactness: a replay runs the kernels of the eager forward at the same kv span (the eager tree forward
writes the same reserved buffers once they exist), so graphed and eager steps at one span give the same
bits (tests/test_tree_graphs_gpu.py). The commit's K/V move (engine/tree/commit.py) is graphed per N
too (kv_mover); the hybrid state commit stays eager (HybridCache.commit_path).
"""
from __future__ import annotations

import torch

from ..recurrent_state import MAX_SNAPSHOT_T
from .build import DraftTree
from .commit import move_kv
from .layout import TreeInputs, TreeLayout


def tree_forward(runner, layout: TreeLayout, with_features: bool, graphed: bool = True):
    """The target over the tree `layout` -> (logits [1, N, V], features [1, N, F] or None); graphed when
    the runner graphs and `graphed` (the outputs are then the graph's: valid until its next replay)."""
    n, cache = layout.size, runner.cache
    if not (runner.use_graphs and graphed):
        layers = runner.feature_layers if with_features else ()
        with runner.kernel_ctx(n):
            return runner.target(layout.tokens, layout.slots, cache, layout.start + n, layers, tree=layout)
    hybrid = getattr(runner.target, "is_hybrid", False)
    if hybrid:
        cache.begin_tree(layout)                        # host: commit the last forward's accepted part
    out = _graph(runner, n, runner.kv_span(layout.start + n), with_features)(layout.packed)
    if hybrid:
        _restash(cache, out[2:])
    return out[0], out[1]


def kv_mover(runner, n: int):
    """commit.move_kv for trees of n nodes, as one graph replay when the runner graphs. Its capture runs
    on a no-op move (every slot onto itself): a real move run twice would move moved K/V."""
    if not runner.use_graphs:
        return move_kv
    key = ("tree_commit", n)
    if key not in runner.graphs:
        cache = runner.cache
        identity = torch.arange(n, device=runner.target.device).repeat(2)
        runner.graphs[key] = runner.step_factory(lambda moves: move_kv(cache, moves), (identity,), runner.pool)
    return lambda cache, moves: runner.graphs[key](moves)


def warm_tree_graphs(runner, nodes: int, with_features: bool) -> int:
    """Captures the tree graphs of `nodes` nodes for every kv span (Engine.warmup), without a step:
    their example trees write scratch K/V into a span's last slots, which later writes overwrite
    before they are visible; a hybrid cache is reset (the next forward must be a prefill). Returns
    how many spans have a graph."""
    if getattr(runner.target, "is_hybrid", False) and nodes > MAX_SNAPSHOT_T:
        return 0                                        # refused by the first tree forward (begin_tree)
    spans = [span for span in runner.kv_spans() if span - nodes >= 1]
    for span in spans:
        _graph(runner, nodes, span, with_features)
    kv_mover(runner, nodes)
    if getattr(runner.target, "is_hybrid", False):
        runner.cache.reset()
    return len(spans)


def _graph(runner, n: int, span: int, with_features: bool):
    key = ("tree", n, with_features, span)
    if key not in runner.graphs:
        target, cache = runner.target, runner.cache
        layers = runner.feature_layers if with_features else ()
        hybrid = getattr(target, "is_hybrid", False)
        if hybrid:
            cache.reserve(n)

        def fn(packed):
            tree = TreeInputs(packed, n)
            with runner.kernel_ctx(n):
                if not hybrid:
                    return target(tree.tokens, tree.slots, cache, span, layers, tree=tree)
                logits, features = target.forward_begun(tree.tokens, tree.slots, cache, span, True, layers, tree=tree)
            return (logits, features, *cache.windows, *cache.snapshots)

        example = TreeLayout(_chain(n), span - n, runner.target.device).packed
        runner.graphs[key] = runner.step_factory(fn, (example,), runner.pool)
    return runner.graphs[key]


def _chain(n: int) -> DraftTree:
    """The capture's example tree (any tree of n nodes would do: a replay takes each step's)."""
    return DraftTree([0] * n, list(range(-1, n - 1)), list(range(n)))


def _restash(cache, records) -> None:
    """The conv windows and per-node states the graph wrote (records: windows then states, in the cache's
    GDN layer order) become the cache's record of the forward, as the eager forward's stash leaves it."""
    layers = sorted(cache.gdn_index, key=cache.gdn_index.get)
    windows, states = records[:len(layers)], records[len(layers):]
    for layer, window, snapshot in zip(layers, windows, states):
        cache.stash(layer, window, snapshot)
