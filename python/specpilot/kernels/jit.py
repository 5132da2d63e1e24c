"""JIT for agent kernel variants: NVRTC through CuPy, an on-disk cubin cache keyed by source hash.

The cache lives in `specpilot.settings.get().kernel_cache` (outside the package). A cubin's name is
the SHA-256 of (source, options, arch), so a variant compiled once is reused by every process and a
changed source can never pick up a stale binary. Compilers, in order: NVRTC through CuPy's bindings,
then `nvcc -cubin` (the CPU machine has nvcc but no CuPy: the cache logic is tested there).
CuPy is imported lazily: importing this module never needs a GPU.
"""
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpilot import settings

DEFAULT_OPTIONS = ("-std=c++17",)


@dataclass
class CompiledKernel:
    path: Path        # the cached cubin
    key: str          # sha256 of (source, options, arch)
    cached: bool      # True when it came from the cache
    compiler: str     # "nvrtc", "nvcc" or "cache"


def cache_key(source: str, options=DEFAULT_OPTIONS, arch: str = "sm_90a") -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch):
        h.update(part.encode())
        h.update(b"\x00|")
    return h.hexdigest()


def cache_dir() -> Path:
    path = settings.get().kernel_cache
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_cubin(source: str, options=DEFAULT_OPTIONS, arch: str = "sm_90a", prefer: str = "nvrtc") -> CompiledKernel:
    """Source -> cached cubin. Raises RuntimeError with the compiler log on a build error."""
    key = cache_key(source, options, arch)
    path = cache_dir() / f"{key}.cubin"
    if path.exists() and path.stat().st_size > 0:
        return CompiledKernel(path, key, True, "cache")
    compilers = [("nvrtc", _nvrtc_cubin), ("nvcc", _nvcc_cubin)]
    if prefer == "nvcc":
        compilers.reverse()
    errors = []
    for name, compile_fn in compilers:
        try:
            cubin = compile_fn(source, options, arch)
        except (ImportError, AttributeError) as e:  # no CuPy / an older NVRTC binding
            errors.append(f"{name}: unavailable ({e})")
            continue
        _atomic_write(path, cubin)
        return CompiledKernel(path, key, False, name)
    raise RuntimeError("no CUDA compiler available for agent variants: " + "; ".join(errors))


def _nvrtc_cubin(source: str, options, arch: str) -> bytes:
    from cupy_backends.cuda.libs import nvrtc  # ImportError without CuPy

    prog = nvrtc.createProgram(source, "variant.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*options, f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC build failed ({e}):\n{nvrtc.getProgramLog(prog)}") from None
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


def _nvcc_cubin(source: str, options, arch: str) -> bytes:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ImportError("nvcc not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "variant.cu", Path(tmp) / "variant.cubin"
        src.write_text(source)
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", *options, str(src), "-o", str(out)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"nvcc build failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")
        return out.read_bytes()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def device_arch() -> str:
    """sm_XY of CUDA device 0 (sm_90a on Hopper, whose kernels may use arch-specific features)."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


class JitKernel:
    """A loaded kernel launched on torch's current stream; tensors go in as raw device pointers."""

    def __init__(self, source: str, name: str = "split12_gemv", options=DEFAULT_OPTIONS):
        import cupy

        self.compiled = compile_cubin(source, options, device_arch())
        self.module = cupy.RawModule(path=str(self.compiled.path))
        self.function = self.module.get_function(name)
        self.name = name

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        import cupy
        import numpy as np
        import torch

        raw = []
        for a in args:
            if isinstance(a, torch.Tensor):
                if not a.is_cuda:
                    raise ValueError(f"{self.name}: argument tensor on {a.device}, expected cuda")
                raw.append(np.uintp(a.data_ptr()))
            elif isinstance(a, int):
                raw.append(np.int32(a))
            else:
                raise ValueError(f"{self.name}: unsupported kernel argument type {type(a).__name__}")
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            self.function(tuple(grid), tuple(block), tuple(raw), shared_mem=shared_mem)
