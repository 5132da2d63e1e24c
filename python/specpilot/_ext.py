"""Loads the native extension once; every op goes through torch.ops.specpilot."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def load():
    """Imports specpilot._C (which registers torch.ops.specpilot.*) and returns it."""
    try:
        from specpilot import _C
    except ImportError as e:  # the package was installed without building the extension
        raise RuntimeError(
            "specpilot's native extension (specpilot._C) is not built: run "
            "`pip install --no-build-isolation -e .` from the repository root") from e
    return _C


def ops():
    load()
    return torch.ops.specpilot


def build_info() -> dict:
    return dict(load().build_info())


def has_cuda_kernels() -> bool:
    return bool(build_info()["with_cuda"])


def has_cuda_op(name: str) -> bool:
    """Whether this build registers the CUDA op torch.ops.specpilot.<name> (False on CPU builds and
    when the extension is not built at all)."""
    try:
        return has_cuda_kernels() and hasattr(ops(), name)
    except RuntimeError:                 # extension not built
        return False
