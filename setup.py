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


class BuildConfigError(SystemExit):
    """A build that cannot work here: the message says what to do."""


def fail(msg):
    raise BuildConfigError(f"specpilot build error: {msg}")


def want_cuda(torch_version, torch_cuda, mode):
    """Whether to build the CUDA kernels, from torch's build and SPECPILOT_CUDA (auto|0|1)."""
    mode = mode.lower()
    if mode not in ("auto", "0", "1"):
        fail(f"SPECPILOT_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return False
    if torch_cuda is None:
        if mode == "1":
            fail(f"SPECPILOT_CUDA=1 but torch {torch_version} has no CUDA support; install a CUDA "
                 "build of torch or unset SPECPILOT_CUDA")
        return False
    return True


def cxx_standard(torch_version):
    """-std flag for the C++ sources (they include torch): torch's headers need C++20 from torch 2.14
    on (torch/all.h refuses older standards); older torch keeps C++17. The .cu kernels are torch-free
    and stay C++17."""
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


def check_cuda_toolchain(torch_version, torch_cuda, nvcc, arch, capability, gpu_name):
    """Refuses a CUDA build that cannot work: no nvcc, an arch the kernels are not written for,
    or a GPU that is not Hopper. `capability` is None when no GPU is visible (compile only)."""
    if not nvcc or not os.path.exists(nvcc):
        fail(f"torch {torch_version} has CUDA {torch_cuda} but nvcc was not found (looked on PATH "
             "and in CUDA_HOME). Install the CUDA toolkit that matches, set CUDA_HOME, or build "
             "the CPU path only with SPECPILOT_CUDA=0.")
    if arch not in SUPPORTED_ARCHS:
        fail(f"SPECPILOT_CUDA_ARCH={arch} is not supported; the CUDA kernels target "
             f"{sorted(SUPPORTED_ARCHS)} (H100/H200). Build the CPU path with SPECPILOT_CUDA=0.")
    if capability is not None and tuple(capability) != (9, 0):
        major, minor = capability
        fail(f"GPU 0 ({gpu_name}) is sm_{major}{minor}; the CUDA kernels need sm_90 (H100/H200). "
             "Build the CPU path only with SPECPILOT_CUDA=0.")


def extensions():
    import torch
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    rel = lambda pattern: sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    bindings = rel("csrc/bindings/*.cpp")
    cpu_sources = rel("csrc/cpu/*.cpp") + [b for b in bindings if not b.endswith("_cuda.cpp")]
    std = cxx_standard(torch.__version__)
    cxx_flags = ["-O3", std]
    include_dirs = [os.path.join(ROOT, "csrc", "include")]

    if not want_cuda(torch.__version__, torch.version.cuda, os.environ.get("SPECPILOT_CUDA", "auto")):
        return [CppExtension("specpilot._C", cpu_sources, include_dirs=include_dirs,
                             extra_compile_args={"cxx": cxx_flags})]

    from torch.utils.cpp_extension import CUDA_HOME

    arch = os.environ.get("SPECPILOT_CUDA_ARCH", "90a")
    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    gpu = torch.cuda.is_available()
    check_cuda_toolchain(torch.__version__, torch.version.cuda, nvcc, arch,
                         torch.cuda.get_device_capability(0) if gpu else None,
                         torch.cuda.get_device_name(0) if gpu else None)
    cuda_sources = rel("csrc/cuda/*.cu") + [b for b in bindings if b.endswith("_cuda.cpp")]
    nvcc_flags = ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                  "--expt-relaxed-constexpr", "-lineinfo"]
    return [CUDAExtension("specpilot._C", cpu_sources + cuda_sources, include_dirs=include_dirs,
                          define_macros=[("SPECPILOT_WITH_CUDA", "1")],
                          extra_compile_args={"cxx": cxx_flags,
                                              "nvcc": nvcc_flags})]


PACKAGE_DIRS = {"specpilot": "python/specpilot", "specpilot.agents": "agents", "specpilot.bench": "bench"}
# The small trained model pair `specpilot demo` runs without a zoo (python/specpilot/data/pair, ~5 MB).
PACKAGE_DATA = {"specpilot": ["data/pair/*.md", "data/pair/*.json", "data/pair/*.jsonl",
                              "data/pair/target/*", "data/pair/drafter/*"]}


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


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(
        name="specpilot",
        version="0.1.0",
        description="Lossless speculative decoding with parallel drafters, split12 weights and an agent loop",
        python_requires=">=3.10",
        package_dir=PACKAGE_DIRS,
        packages=packages(),
        package_data=PACKAGE_DATA,
        ext_modules=extensions(),
        cmdclass={"build_ext": build_ext_class()},
        entry_points={"console_scripts": ["specpilot=specpilot.cli:main"]},
        extras_require={"ray": ["ray>=2.9"]},  # the agent loop's --backend ray (optional)
    )
