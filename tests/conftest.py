import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="needs a CUDA GPU: runs on the H200 through bench/gpu_check.sh")


@pytest.fixture
def fresh_generator():
    """A random generator seeded differently on every run: checks must hold for any input."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    g.seed_value = seed  # printed by failing tests so a failure can be reproduced
    return g


def pytest_collection_modifyitems(config, items):
    # Every test skipped for want of a GPU also carries the `gpu` marker, so the H200 check can
    # select exactly the GPU tests with `pytest -m gpu`.
    for item in items:
        for mark in item.iter_markers("skipif"):
            if "GPU" in str(mark.kwargs.get("reason", "")):
                item.add_marker(pytest.mark.gpu)
                break
