"""Where a step's time goes: torch.profiler over a few back-to-back calls of each named step, the top
ops by device time and by host time written as text tables (GPU benches' `--profile FILE`).

A graph replay shows as one host launch (cudaGraphLaunch) and its kernels on the device; an eager
step shows each op's Python / dispatch cost on the host: the two tables side by side tell a
host-bound step from a device-bound one.
"""
from __future__ import annotations


def _table(averages, key: str, rows: int) -> str:
    try:
        return averages.table(sort_by=key, row_limit=rows)
    except (AttributeError, KeyError):                      # torch before the device_* names
        return averages.table(sort_by=key.replace("device", "cuda"), row_limit=rows)


def profile_steps(steps: dict, path: str, iters: int = 5, rows: int = 25) -> None:
    """steps: name -> function of no arguments (one step, run `iters` times after one untimed call);
    writes, per step, its top `rows` ops by self device time and by self host time to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sections = []
    for name, fn in steps.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        sections.append(f"== {name}: {iters} calls, top ops by self device time ==\n"
                        f"{_table(averages, 'self_device_time_total', rows)}\n"
                        f"== {name}: {iters} calls, top ops by self host time ==\n"
                        f"{_table(averages, 'self_cpu_time_total', rows)}\n")
    with open(path, "w") as f:
        f.write("\n".join(sections))
