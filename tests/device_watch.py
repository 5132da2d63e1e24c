"""A CPU check for device bugs that only show on a GPU: code that builds a tensor without naming a
device (torch.eye(n), torch.zeros(n), ...) gets the default device, which is the CPU, so on the CPU
such a bug is invisible. Under `tensors_stay_on(device)` the default device is `meta`, so every such
tensor lands on `meta` instead, and every op's output is checked to be on `device`."""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class _DeviceWatch(TorchFunctionMode):
    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.strays = device, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device != self.device:
                self.strays.append(f"{getattr(func, '__name__', func)} -> {leaf.device}")
        return out


@contextlib.contextmanager
def tensors_stay_on(device="cpu"):
    """Fails (AssertionError naming the ops) when the block makes a tensor off `device`; a mixed-device
    op raising inside the block propagates as is."""
    watch = _DeviceWatch(torch.device(device))
    with torch.device("meta"), watch:        # the watch is inner: it sees outputs after meta is applied
        yield
    assert not watch.strays, f"tensors built off {device} (no device named?): {watch.strays[:5]}"
