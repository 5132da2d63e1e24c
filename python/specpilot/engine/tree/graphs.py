"""The tree step's device part, eager or as one CUDA graph: build the tree from the draft logits and
pack it (layout.grown_and_packed: build.grow_tree and layout.pack_tensors, or their one kernel), run
the target over it, take the target's argmax and the greedy accepted path (accept.accepted_on_device).
Its outputs are one int64 tensor the host reads once a step (the path, the bonus and the tree), the
logits (sampling reads them) and the features. One graph per (nodes N, depths, features, kv span),
in the runner's graph dict and memory pool beside the chain steps (engine/steps.py), captured by the
same step factory (engine/graphs.py: GraphedStep on CUDA, StaticShapeStep in the CPU tests) and by
Engine.warmup for the drafter's block.

A graph's inputs are the draft logits [block - 1, V] and int64 [3] (anchor token, anchor position,
depths drafted): a tail block drafts fewer depths, whose rows past them are padding that
grow_tree(depths=) keeps out of the tree, so one graph serves every anchor whose slots fit its span
and every tail whose tree still fills the budget (tree_size); a smaller tree runs the same function
eagerly. Hybrid targets (as engine/hybrid_graphs.py) run the cache's host bookkeeping (begin_tree)
eagerly, and the graph writes the per-node states into the cache's reserved buffers of N (shared with
the chain steps of N tokens and with every span's tree graph); since a replay runs no Python, the
conv windows and states the capture stashed (graph outputs, fixed memory) are stashed again after
each replay.

Exactness: a replay runs the kernels of the eager function at the same kv span (the eager tree forward
writes the same reserved buffers once they exist), so graphed and eager steps at one span give the same
bits (tests/test_tree_graphs_gpu.py). The commit's K/V move (engine/tree/commit.py) is graphed per N
too (kv_mover); the hybrid state commit stays eager (HybridCache.commit_path).
"""
from __future__ import annotations

import torch

from ..recurrent_state import MAX_SNAPSHOT_T
from .accept import accepted_on_device
from .build import tree_size
from .commit import move_kv
from .layout import PendingTree, TreeInputs, TreeLayout


def tree_step(runner, start: int, draft_logits: torch.Tensor, anchor: int, budget: int, block: int,
              with_features: bool):
    """One tree step's device part at anchor position `start`; draft_logits [depths, V] (depths may be
    0). Returns (record: the PendingTree of its tree_size(depths, V, budget) nodes, for the commit;
    read: int64 [2 + W + 3N], the accepted drafts a, the bonus, the path padded with N to W = block
    width, then the tree's tokens, parents and depths; logits [1, N, V]; features [1, N, F] or None).
    Graphed when the runner graphs and the tree fills the budget (the outputs are then the graph's:
    valid until its next replay), at the width of `block` rows (a tail's draft logits padded)."""
    cache = runner.cache
    depths, vocab = draft_logits.shape
    record = PendingTree(start, tree_size(depths, vocab, budget), runner.target.device)
    n = record.size
    meta = runner.tree_meta.copy_(torch.tensor((anchor, start, depths)))   # pinned on CUDA: no wait for the draft
    meta = meta.to(runner.target.device, non_blocking=True)
    hybrid = getattr(runner.target, "is_hybrid", False)
    if hybrid:
        cache.begin_tree(record)                         # host: commit the last forward's accepted part
    if not (runner.use_graphs and n == budget and depths < block):
        return (record, *_step_fn(runner, budget, start + n, with_features)(draft_logits, meta)[:3])
    if depths + 1 < block:                               # a tail block: padding rows, kept out of the tree
        draft_logits = torch.cat([draft_logits, draft_logits.new_zeros(block - 1 - depths, vocab)])
    out = _graph(runner, budget, block - 1, runner.kv_span(start + n), with_features,
                 draft_logits.dtype)(draft_logits, meta)
    if hybrid:
        _restash(cache, out[3:])
    return record, out[0], out[1], out[2]


def verify_tree(build, forward, draft_logits, meta, budget: int, span: int, with_features: bool) -> tuple:
    """A step's tree on the device: grown from the draft logits and packed by `build` (the runner's
    grow_tree: layout.grown_and_packed; meta: int64 [3] anchor token, anchor position, depths drafted), `forward(tree, span, with_features)` over it, the greedy path
    -> (grown TreeTensors, accepted_on_device's tensor, logits, features). Shared by the stepwise
    step (below) and the fused step (tree/fused.py)."""
    grown, packed = build(draft_logits, meta, budget)
    logits, features = forward(TreeInputs(packed, len(grown)), span, with_features)
    return grown, accepted_on_device(grown, torch.argmax(logits[0], dim=-1)), logits, features


def tree_forward(runner, layout: TreeLayout, with_features: bool):
    """The target over a host-made tree `layout`, eagerly -> (logits [1, N, V], features or None): the
    verify forward alone (bench/tree_steps.py, the GPU tests' reference)."""
    return runner.forward_tree(layout, layout.start + layout.size, with_features)


def _step_fn(runner, budget: int, span: int, with_features: bool):
    target, cache = runner.target, runner.cache
    layers = runner.feature_layers if with_features else ()

    def hybrid_forward(tree, kv_len, _):
        with runner.kernel_ctx(tree.size):
            return target.forward_begun(tree.tokens, tree.slots, cache, kv_len, True, layers, tree=tree)

    hybrid = getattr(target, "is_hybrid", False)

    def fn(draft_logits, meta):
        forward = hybrid_forward if hybrid else runner.forward_tree
        grown, accepted, logits, features = verify_tree(runner.grow_tree, forward, draft_logits, meta, budget, span,
                                                        with_features)
        records = (*cache.windows, *cache.snapshots) if hybrid else ()
        return (torch.cat([accepted, grown.tokens, grown.parents, grown.depth]), logits, features, *records)
    return fn


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


def warm_tree_graphs(runner, nodes: int, block: int, dtype) -> int:
    """Captures the tree step graphs of `nodes` nodes for drafts of `block` rows (draft logits of
    `dtype`), for every kv span (Engine.warmup), without a step: their example trees write scratch K/V
    into a span's last slots, which later writes overwrite before they are visible; a hybrid cache is
    reset (the next forward must be a prefill). Returns how many spans have a graph."""
    if getattr(runner.target, "is_hybrid", False) and nodes > MAX_SNAPSHOT_T:
        return 0                                        # refused by the first tree forward (begin_tree)
    if tree_size(block - 1, runner.target.config.vocab_size, nodes) < nodes:
        return 0                                        # every tree of this block is smaller: eager
    spans = [span for span in runner.kv_spans() if span - nodes >= 1]
    for span in spans:
        _graph(runner, nodes, block - 1, span, block > 1, dtype)
    kv_mover(runner, nodes)
    if getattr(runner.target, "is_hybrid", False):
        runner.cache.reset()
    return len(spans)


def _graph(runner, n: int, depths: int, span: int, with_features: bool, dtype):
    key = ("tree", n, depths, with_features, span, dtype)
    if key not in runner.graphs:
        device = runner.target.device
        if getattr(runner.target, "is_hybrid", False):
            runner.cache.reserve(n)
        example = (torch.zeros(depths, runner.target.config.vocab_size, dtype=dtype, device=device),
                   torch.tensor([0, span - n, depths], dtype=torch.long, device=device))
        runner.graphs[key] = runner.step_factory(_step_fn(runner, n, span, with_features), example, runner.pool)
    return runner.graphs[key]


def _restash(cache, records) -> None:
    """The conv windows and per-node states the graph wrote (records: windows then states, in the cache's
    GDN layer order) become the cache's record of the forward, as the eager forward's stash leaves it."""
    layers = sorted(cache.gdn_index, key=cache.gdn_index.get)
    windows, states = records[:len(layers)], records[len(layers):]
    for layer, window, snapshot in zip(layers, windows, states):
        cache.stash(layer, window, snapshot)
