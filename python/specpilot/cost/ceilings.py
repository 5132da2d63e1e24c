"""Ceilings measured on the device at hand: copy bandwidth, matrix rate, launch floor.

The GPU's numbers and the CPU's are measured the same way (a device copy, a large matmul, a
tiny op) so a CPU report is labelled "cpu" and compares CPU times with CPU ceilings.
"""
from dataclasses import asdict, dataclass

import torch

from specpilot.cost.timer import time_call


@dataclass(frozen=True)
class Ceilings:
    device: str               # cuda | cpu
    device_name: str
    copy_bandwidth: float     # bytes/s (read + write)
    matmul_flops: float       # flop/s of the measured dtype
    launch_s: float           # seconds per tiny op, in a CUDA graph on the GPU (the floor of any component)
    dtype: str

    def to_dict(self) -> dict:
        return asdict(self)


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    import platform

    return platform.processor() or platform.machine() or "cpu"


def measure_ceilings(device: str, quick: bool = False) -> Ceilings:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    copy_bytes = (256 << 20) if device == "cuda" else ((16 << 20) if quick else (64 << 20))
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    t_copy = time_call(lambda: dst.copy_(src), device, reps=10 if device == "cuda" else 3)
    n = 8192 if device == "cuda" else (256 if quick else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t_mm = time_call(lambda: a @ b, device, reps=10 if device == "cuda" else 3)
    tiny = torch.zeros(1, device=device)
    t_launch = time_call(lambda: tiny.add_(1), device, reps=200 if device == "cuda" else 50, batch=50)
    return Ceilings(device, device_name(device), 2 * copy_bytes / t_copy, 2 * n ** 3 / t_mm, t_launch,
                    str(dtype).replace("torch.", ""))
