"""Builds specpilot and its one extension, `specpilot._C`.

CPU-only torch (CI): the torch-free C++ references in csrc/cpu plus the CPU bindings.
CUDA torch (the H200): also csrc/cuda/*.cu and the *_cuda.cpp bindings, for sm_90a.

SPECPILOT_CUDA=auto|0|1 (default auto: build CUDA when torch was built with CUDA).
SPECPILOT_CUDA_ARCH (default 90a): the one GPU architecture the kernels are written for.
"""
import glob
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
SUPPORTED_ARCHS = {"90a"}  # Hopper (H100/H200): the kernels use sm_90a-only features


def fail(msg):
    sys.exit(f"specpilot build error: {msg}")


def want_cuda(torch):
    mode = os.environ.get("SPECPILOT_CUDA", "auto").lower()
    if mode not in ("auto", "0", "1"):
        fail(f"SPECPILOT_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return False
    if torch.version.cuda is None:
        if mode == "1":
            fail("SPECPILOT_CUDA=1 but this torch has no CUDA support "
                 f"(torch {torch.__version__}); install a CUDA build of torch or unset SPECPILOT_CUDA")
        return False
    return True


def check_cuda_toolchain(torch):
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    if not nvcc or not os.path.exists(nvcc):
        fail(f"torch {torch.__version__} has CUDA {torch.version.cuda} but nvcc was not found "
             "(looked on PATH and in CUDA_HOME). Install the CUDA toolkit that matches, set "
             "CUDA_HOME, or build the CPU path only with SPECPILOT_CUDA=0.")
    arch = os.environ.get("SPECPILOT_CUDA_ARCH", "90a")
    if arch not in SUPPORTED_ARCHS:
        fail(f"SPECPILOT_CUDA_ARCH={arch} is not supported; the CUDA kernels target "
             f"{sorted(SUPPORTED_ARCHS)} (H100/H200). Build the CPU path with SPECPILOT_CUDA=0.")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        if (major, minor) != (9, 0):
            fail(f"GPU 0 ({torch.cuda.get_device_name(0)}) is sm_{major}{minor}; the CUDA kernels "
                 "need sm_90 (H100/H200). Build the CPU path only with SPECPILOT_CUDA=0.")
    return arch


def extensions():
    import torch
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    rel = lambda pattern: sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    bindings = rel("csrc/bindings/*.cpp")
    cpu_sources = rel("csrc/cpu/*.cpp") + [b for b in bindings if not b.endswith("_cuda.cpp")]
    cxx_flags = ["-O3", "-std=c++17"]
    include_dirs = [os.path.join(ROOT, "csrc", "include")]

    if not want_cuda(torch):
        return [CppExtension("specpilot._C", cpu_sources, include_dirs=include_dirs,
                             extra_compile_args={"cxx": cxx_flags})]

    arch = check_cuda_toolchain(torch)
    cuda_sources = rel("csrc/cuda/*.cu") + [b for b in bindings if b.endswith("_cuda.cpp")]
    nvcc_flags = ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                  "--expt-relaxed-constexpr", "-lineinfo"]
    return [CUDAExtension("specpilot._C", cpu_sources + cuda_sources, include_dirs=include_dirs,
                          define_macros=[("SPECPILOT_WITH_CUDA", "1")],
                          extra_compile_args={"cxx": cxx_flags + ["-DSPECPILOT_WITH_CUDA=1"],
                                              "nvcc": nvcc_flags})]


PACKAGE_DIRS = {"specpilot": "python/specpilot", "specpilot.agents": "agents", "specpilot.bench": "bench"}


def packages():
    """Every folder with an __init__.py under the three package roots."""
    found = []
    for name, folder in PACKAGE_DIRS.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files:
                sub = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.append(name if sub == "." else name + "." + sub.replace(os.sep, "."))
    return sorted(set(found))


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=True)


setup(
    name="specpilot",
    version="0.1.0",
    description="Lossless speculative decoding with parallel drafters, split12 weights and an agent loop",
    python_requires=">=3.10",
    package_dir=PACKAGE_DIRS,
    packages=packages(),
    ext_modules=extensions(),
    cmdclass={"build_ext": build_ext_class()},
    entry_points={"console_scripts": ["specpilot=specpilot.cli:main"]},
)
