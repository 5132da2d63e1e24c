import contextlib
import os
import subprocess
import sys
import textwrap

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


# Prelude of refused_in_subprocess: what every case may use.
_REFUSAL_PRELUDE = """
import re, sys, torch
from specpilot import _ext
ops = _ext.ops()
bf = lambda *shape: torch.zeros(*shape, device="cuda", dtype=torch.bfloat16)
"""


def refused_in_subprocess(setup: str, cases) -> None:
    """Asserts that each (statement, pattern) in `cases` raises a RuntimeError whose message matches
    `pattern`, after `setup` (Python; the prelude above is in scope). The cases run in one fresh
    interpreter so that a crash in an op's error path (the H200 segfaulted there until the bindings
    moved to SP_CHECK, csrc/bindings/check.h) fails this test with the case that crashed, instead of
    killing the test run."""
    lines = [_REFUSAL_PRELUDE, textwrap.dedent(setup)]
    for i, (statement, pattern) in enumerate(cases):
        lines.append(f"print('case {i}', flush=True)\n"
                     f"try:\n    {statement}\n"
                     f"except RuntimeError as e:\n"
                     f"    print('raised' if re.search({pattern!r}, str(e)) else 'wrong message: ' + str(e)[:200],"
                     f" flush=True)\n"
                     f"else:\n    print('no error', flush=True)\n")
    run = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, timeout=300)
    out = run.stdout.split("\n")
    for i, (statement, pattern) in enumerate(cases):
        if f"case {i}" not in out:
            break
        verdict = out[out.index(f"case {i}") + 1] if out.index(f"case {i}") + 1 < len(out) else ""
        assert verdict == "raised", (f"case {i} `{statement}`: "
                                     + (verdict or f"the process died (exit {run.returncode}) instead of raising")
                                     + f" (wanted a RuntimeError matching {pattern!r})\n{run.stderr[-1500:]}")
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-1500:]}"


@contextlib.contextmanager
def configured(**fields):
    """Within the block, op dispatch outside an engine reads the running EngineConfig with `fields`
    changed (what an Engine built with that config hands its models)."""
    import dataclasses

    from specpilot import config

    with config.use(dataclasses.replace(config.current(), **fields)):
        yield


def run_on_host(exe, sources, include_dirs, timeout=300) -> str:
    """g++ builds `sources` (C++17, pthreads) into `exe` and runs it with a fresh seed as its one
    argument; the build and the run must succeed (the seed is in the message). Returns stdout.
    For the host emulations of our CUDA kernels."""
    cmd = ["g++", "-std=c++17", "-O1", "-pthread"] + [f"-I{d}" for d in include_dirs] + [str(s) for s in sources]
    built = subprocess.run(cmd + ["-o", str(exe)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    seed = str(int.from_bytes(os.urandom(4), "little"))
    result = subprocess.run([str(exe), seed], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"seed {seed}\n{result.stdout}{result.stderr}"
    return result.stdout
