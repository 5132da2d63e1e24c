"""Wall-clock timing that is honest on a GPU: synchronize the device before reading the clock."""
from contextlib import contextmanager

import torch

from specpilot.timing import perf_counter


def sync(device) -> None:
    """Wait for queued GPU work on `device` (no-op on CPU) so a clock read covers it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device) -> float:
    """perf_counter after a device sync (the same clock dflash's `_cuda_time` reads)."""
    sync(device)
    return perf_counter()


@contextmanager
def dflash_clock(device):
    """dflash 0.1.0 times `return_stats` with `torch.cuda.synchronize()`, which raises on a CPU-only
    torch. While inside, its clock is `now(device)`: identical on CUDA, usable on CPU."""
    import dflash.model as dflash_model

    original = dflash_model._cuda_time
    dflash_model._cuda_time = lambda: now(device)
    try:
        yield
    finally:
        dflash_model._cuda_time = original


def capture_graph(calls) -> "torch.cuda.CUDAGraph":
    """`calls` (a list of closures) warmed up, captured in one CUDA graph and replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture (lazy init, cuBLAS workspaces)
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    return graph


def time_graph(calls, reps: int) -> float:
    """Seconds per call: `calls` (a list of closures) captured in one CUDA graph, replayed."""
    graph = capture_graph(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / (reps * len(calls))
