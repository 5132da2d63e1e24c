import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="needs a CUDA GPU: runs on the H200 through bench/gpu_check.sh")


@pytest.fixture
def fresh_seed():
    """A seed drawn anew on every run (checks must hold for any input); failing tests print it."""
    return int.from_bytes(os.urandom(4), "little")


def pytest_collection_modifyitems(config, items):
    # Every test skipped for want of a GPU also carries the `gpu` marker, so the H200 check can
    # select exactly the GPU tests with `pytest -m gpu`.
    for item in items:
        for mark in item.iter_markers("skipif"):
            if "GPU" in str(mark.kwargs.get("reason", "")):
                item.add_marker(pytest.mark.gpu)
                break


@pytest.fixture
def cuda_build():
    """On a GPU machine, a CPU-only build of specpilot._C is an error, not a skip."""
    from specpilot import _ext

    if not _ext.has_cuda_kernels():
        pytest.fail("a GPU is present but specpilot._C was built without CUDA kernels (SPECPILOT_CUDA=1 rebuild)")


@pytest.fixture
def cuda_gen(fresh_seed):
    """A CUDA generator seeded anew on every run; the seed is printed for a failing test."""
    print(f"seed {fresh_seed}")
    return torch.Generator(device="cuda").manual_seed(fresh_seed)
