"""One timing helper for the cost model: CUDA-graph replays timed with events (median) on the GPU,
perf_counter on the CPU."""
import statistics

import torch

from specpilot.timing import hold_stream, perf_counter

HOLD_S = 1e-3   # the stream is held this long before each timed replay (far longer than queueing one)


def time_call(fn, device: str, reps: int = 10, warmup: int = 2, batch: int = 1) -> float:
    """Median seconds of one call of fn (batch calls per sample, for ops near the launch floor).

    On the GPU the batch calls are captured in one CUDA graph, and each timed replay is queued behind
    a 1 ms stream hold: the events then time the device's work only, as the engine's graphed steps
    run it, not the host's dispatch of a Python op (tens of us, more than many kernels here). The hold
    is the package timer's (specpilot.timing.hold_stream). An fn that cannot be captured is timed eagerly."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        return statistics.median(_graph_samples(fn, reps, batch))
    samples = []
    for _ in range(reps):
        t0 = perf_counter()
        for _ in range(batch):
            fn()
        samples.append((perf_counter() - t0) / batch)
    return statistics.median(samples)


def _graph_samples(fn, reps: int, batch: int) -> list:
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(batch):
                fn()
        run = graph.replay
    except RuntimeError:           # not capturable: eager launches (host dispatch included)
        torch.cuda.synchronize()

        def run():
            for _ in range(batch):
                fn()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_stream(HOLD_S)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / batch)
    return samples
