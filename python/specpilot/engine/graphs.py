"""CUDA-graph capture of one step function with static input and output buffers.

A captured step replays its whole kernel sequence with one launch: no per-layer Python on the hot
path. Inputs are copied into the static buffers before each replay; outputs are the static output
tensors (valid until the next replay of the same graph). All graphs of an engine share one memory
pool. Exactness: a replay runs the very kernels of the eager call it captured (bit-identical to that
eager call with the same shapes).
"""
from __future__ import annotations

import gc

import torch


class GraphedStep:
    def __init__(self, fn, example_inputs: tuple, pool=None, warmup: int = 2):
        """fn(*inputs) -> tensor or tuple of tensors; example_inputs: CUDA tensors (copied)."""
        self.fn = fn
        self.inputs = tuple(t.clone() for t in example_inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):                 # lazy inits (cuBLAS handles, workspaces) outside capture
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # No automatic garbage collection inside the capture: a collected object's finalizer (an event,
        # a pinned buffer) may call a CUDA API that invalidates a capture in progress.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = fn(*self.inputs)
        finally:
            if collecting:
                gc.enable()

    def __call__(self, *inputs):
        for static, new in zip(self.inputs, inputs):
            if static.shape != new.shape:
                raise ValueError(f"graphed step input shape {tuple(new.shape)} != captured {tuple(static.shape)}")
            static.copy_(new, non_blocking=True)
        self.graph.replay()
        return self.outputs


SMALLEST_SPAN = 256


def kv_bucket(needed: int, capacity: int, step: int = 0) -> int:
    """Attention span of a graphed step over `needed` cache slots, capped at `capacity`: the next power
    of two >= needed (>= SMALLEST_SPAN) for step 0, else the next multiple of `step`
    (EngineConfig.graph_kv_step). A graph attends to its whole span, so a span closer to `needed`
    reads less; each distinct span is one more graph."""
    if step:
        span = -(-needed // step) * step
    else:
        span = SMALLEST_SPAN
        while span < needed:
            span *= 2
    return min(span, capacity)


def kv_spans(capacity: int, step: int = 0) -> list:
    """Every span kv_bucket(n, capacity, step) returns for n in 1..capacity: the graphs warmup captures.
    Sampling n every 64 slots sees every bucket: each bucket is an interval of at least 64 slots
    starting after a multiple of 64 (powers of two from 256, multiples of a 64-aligned step)."""
    return sorted({kv_bucket(n, capacity, step) for n in range(1, capacity + 1, 64)} | {capacity})


class KVBuckets:
    """The kv span rule of one engine's graphed steps (its cache capacity and EngineConfig.graph_kv_step),
    shared by every step that captures graphs so warmup and the steps agree."""

    def __init__(self, capacity: int, step: int = 0):
        self.capacity, self.step = capacity, step

    def span(self, needed: int) -> int:
        return kv_bucket(needed, self.capacity, self.step)

    def spans(self) -> list:
        return kv_spans(self.capacity, self.step)


class StaticShapeStep:
    """CPU stand-in for GraphedStep with the same contract (static input buffers, outputs reused and
    overwritten by every call), so the graphed code path (padding, trash slot, kv buckets, output
    aliasing) is exercised by the CPU tests. Runs the function eagerly."""

    def __init__(self, fn, example_inputs: tuple, pool=None, warmup: int = 0):
        self.fn = fn
        self.inputs = tuple(t.clone() for t in example_inputs)
        self.outputs = None

    def __call__(self, *inputs):
        for static, new in zip(self.inputs, inputs):
            if static.shape != new.shape:
                raise ValueError(f"static step input shape {tuple(new.shape)} != captured {tuple(static.shape)}")
            static.copy_(new)
        result = self.fn(*self.inputs)
        if result is None:                          # a step that only writes (e.g. K/V into a cache)
            return None
        single = isinstance(result, torch.Tensor)
        result = (result,) if single else tuple(result)
        if self.outputs is None:
            self.outputs = tuple(r.clone() if r is not None else None for r in result)
        else:
            for out, r in zip(self.outputs, result):
                if out is not None:
                    out.copy_(r)
        return self.outputs[0] if single else self.outputs
