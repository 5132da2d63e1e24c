"""What a device can do, measured, for step floors: its copy bandwidth and its matmul rate, and a timer
that works on a GPU (CUDA events, back to back) and on a CPU (wall clock; such timings only exercise
the code path).
"""
from __future__ import annotations

import time

import torch


def time_ms(fn, iters: int, device) -> float:
    """ms per call of fn() run back to back (3 untimed calls first)."""
    if iters < 1:
        raise ValueError(f"iters={iters} must be >= 1")
    if torch.device(device).type == "cuda":
        from .step_times import _event_ms

        return _event_ms(fn, iters)
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def copy_bandwidth(device, nbytes: int | None = None, iters: int = 20) -> float:
    """Bytes per second of a device-to-device copy, read and write both counted (1 GiB on a GPU)."""
    nbytes = nbytes or (1 << 30 if torch.device(device).type == "cuda" else 1 << 24)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), iters, device)
    return 2 * nbytes / (ms * 1e-3)


def matmul_rate(device, dtype, n: int | None = None, iters: int = 10) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (n = 8192 on a GPU, small on a CPU)."""
    n = n or (8192 if torch.device(device).type == "cuda" else 256)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    ms = time_ms(lambda: a @ b, iters, device)
    return 2 * n ** 3 / (ms * 1e-3)
