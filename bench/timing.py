"""Wall-clock timing that is honest on a GPU: synchronize the device before reading the clock."""
import time
from contextlib import contextmanager

import torch


def sync(device) -> None:
    """Wait for queued GPU work on `device` (no-op on CPU) so a clock read covers it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device) -> float:
    """perf_counter after a device sync (the same clock dflash's `_cuda_time` reads)."""
    sync(device)
    return time.perf_counter()


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
