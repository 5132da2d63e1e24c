"""One timing helper for the cost model: CUDA events (median) on the GPU, perf_counter on the CPU."""
import statistics
import time

import torch


def time_call(fn, device: str, reps: int = 10, warmup: int = 2, batch: int = 1) -> float:
    """Median seconds of one call of fn (batch calls per sample, for ops near the launch floor)."""
    for _ in range(warmup):
        fn()
    samples = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3 / batch)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)
