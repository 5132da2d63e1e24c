"""Scale tier: a tree verify step of N nodes against a chain verify step of N tokens (issue 34's
target: the tree step at most 1.1x the chain step), random weights at a target's shape:

    python -m specpilot.bench.tree_steps --preset qwen3-8b --nodes 16,32 [--context 512] [--out F.json]
    python -m specpilot.bench.tree_steps --preset qwen3.5-9b --nodes 16,32

The tree is built best-first (engine/tree/build.py) from random draft logits over 15 depths, so its
shape is a bushy one. Reported per N: chain_ms (eager, as the hybrid loop runs it), tree_ms (the tree
forward, eager: SDPA with the ancestor mask, and on hybrids the GDN tree path below), commit_ms (K/V
compaction + hybrid state gather of a mid-depth path), tree_over_chain; with CUDA graphs also
chain_graphed_ms (the graphed verify the chain loop uses), tree_graphed_ms (engine/tree/graphs.py
tree_step, as the tree loop runs it: one graph that builds the tree from the draft logits, packs it,
runs the target over it and takes the greedy accepted path) and
tree_graphed_over_chain_graphed (issue 34's target, graphed against graphed: at most 1.1; the tree's
figure also holds its build and accept) and
commit_graphed_ms (the commit with its K/V move graphed, as the tree loop runs it), and the build and
packing alone, graphed (build_graphed_ms: {torch: build.grow_tree + layout.pack_tensors, kernel: their
one kernel, kernels/tree_build.py}; the step uses the kernel while fused_kernels is on). On hybrids
with EngineConfig.fused_kernels on, both run the GDN CUDA kernels: the chain the recurrence kernel
(kernels/gdn_chain.py), the tree its parent-indexed form and the tree conv (kernels/gdn_tree.py);
gdn_tree_kernels says whether the tree forward ran them (false: the torch node-by-node reference).
CUDA events on the GPU; on the CPU (tiny presets, a smoke run) wall-clock.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


def timed_ms(fn, iters: int) -> float:
    if torch.cuda.is_available():
        from specpilot.bench.step_times import _event_ms
        return _event_ms(fn, iters)
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e3


def ran_tree_kernels(forward) -> bool:
    """Whether one call of `forward` ran the GDN tree recurrence kernel."""
    from specpilot.kernels import gdn_tree

    real, calls = gdn_tree.tree_recurrence, []
    gdn_tree.tree_recurrence = lambda *a: calls.append(1) or real(*a)
    try:
        forward()
    finally:
        gdn_tree.tree_recurrence = real
    return bool(calls)


@torch.inference_mode()
def tree_step_times(engine, context: int, nodes: int, iters: int, seed: int = 0) -> dict:
    from specpilot.engine.tree.build import grow_tree
    from specpilot.engine.tree.commit import commit_path, move_kv
    from specpilot.engine.tree.graphs import kv_mover, tree_forward, tree_step
    from specpilot.engine.tree.layout import TreeLayout

    target, runner, cache = engine.target, engine.runner, engine.cache
    device, vocab = target.device, target.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab - 2, (1, context), generator=g).to(device)
    runner.prefill(prompt, with_features=False)
    block = prompt[:, -nodes:].clone()
    draft_logits = (torch.randn(15, vocab, generator=g) * 4).to(device=device, dtype=target.dtype)
    anchor = int(prompt[0, -1])
    tree = grow_tree(draft_logits, anchor, nodes).to_host()
    layout = TreeLayout(tree, context, device)

    def eager_forward():
        tree_forward(runner, layout, False)

    out = {"nodes": nodes, "tree_depth": max(tree.depth), "gdn_tree_kernels": ran_tree_kernels(eager_forward),
           "chain_ms": timed_ms(lambda: runner.target_step(block, context, with_features=False, graphed=False), iters),
           "tree_ms": timed_ms(eager_forward, iters)}

    def graphed_step():                          # as the tree loop runs it
        tree_step(runner, context, draft_logits, anchor, nodes, 16, False)[0].tree = tree   # for the hybrid commit
    if engine.use_graphs:
        out["chain_graphed_ms"] = timed_ms(lambda: runner.target_step(block, context, with_features=False), iters)
        out["tree_graphed_ms"] = timed_ms(graphed_step, iters)
        out["tree_graphed_over_chain_graphed"] = out["tree_graphed_ms"] / out["chain_graphed_ms"]
        out["build_graphed_ms"] = build_times(runner, draft_logits, anchor, context, nodes, iters)
    path = tree.path_to(max(range(len(tree)), key=lambda i: (tree.depth[i] == max(tree.depth) // 2, -i)))

    def then_commit(forward, move=move_kv):
        def step():
            forward()
            commit_path(cache, layout, path, move)
            if hasattr(cache, "committed_len"):
                cache.committed_len = context                   # rewind (same state sizes)
        return step
    out["commit_ms"] = timed_ms(then_commit(eager_forward), iters) - out["tree_ms"]
    if engine.use_graphs:                                       # the K/V move graphed (the hybrid state eager)
        out["commit_graphed_ms"] = (timed_ms(then_commit(graphed_step, kv_mover(runner, nodes)), iters)
                                    - timed_ms(graphed_step, iters))
    out["tree_over_chain"] = out["tree_ms"] / out["chain_ms"]
    return out


def build_times(runner, draft_logits, anchor: int, context: int, nodes: int, iters: int) -> dict:
    """The tree's build and packing alone as one graph each way (the runner's step factory):
    {"torch": ms, "kernel": ms} (the kernel's where it takes the call)."""
    from specpilot.config import current, use
    from specpilot.engine.tree.layout import grown_and_packed
    from specpilot.kernels import tree_build

    meta = torch.tensor([anchor, context, draft_logits.shape[0]], device=draft_logits.device)
    out = {}
    for name, fused in (("torch", False), ("kernel", True)):
        with use(dataclasses.replace(current(), fused_kernels=fused)):
            if fused and not tree_build.takes(draft_logits, nodes, nodes):
                continue
            step = runner.step_factory(lambda x, m: grown_and_packed(x, m, nodes)[1], (draft_logits, meta), None)
        out[name] = timed_ms(lambda: step(draft_logits, meta), iters)
    return out


def main(argv=None) -> int:
    from specpilot.engine import Engine
    from specpilot.models.random_ckpt import TARGET_PRESETS, random_target

    p = argparse.ArgumentParser(prog="python -m specpilot.bench.tree_steps", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b", choices=sorted(TARGET_PRESETS))
    p.add_argument("--nodes", default="16,32")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",")]
    if any(not 1 <= n <= 64 for n in sizes):
        raise SystemExit(f"--nodes {args.nodes}: each must be in 1..64")
    cuda = torch.cuda.is_available()
    target = random_target(TARGET_PRESETS[args.preset], "cuda" if cuda else "cpu",
                           torch.bfloat16 if cuda else torch.float32, seed=0)
    engine = Engine(target, None, max_seq_len=args.context + 2 * max(sizes) + 64)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "preset": args.preset, "context": args.context,
           "steps": [tree_step_times(engine, args.context, n, args.iters) for n in sizes]}
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
