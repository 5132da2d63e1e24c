"""Every setting in one place: environment variables with their defaults and what they do."""
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # valid for the editable (source) install
CSRC_DIR = REPO_ROOT / "csrc"


def _env(name, default):
    return os.environ.get(name, default)


@dataclass(frozen=True)
class Settings:
    # The small real model pair (target + DFlash drafter); relative paths are taken from the CWD.
    zoo: Path = field(default_factory=lambda: Path(_env("SPECPILOT_ZOO", "../shared/zoo")))
    # The five benchmark prompt sets.
    datasets: Path = field(default_factory=lambda: Path(_env("SPECPILOT_DATASETS", "../shared/datasets")))
    # NVRTC kernel cache, keyed by source hash (outside the package so installs stay read-only).
    kernel_cache: Path = field(default_factory=lambda: Path(
        _env("SPECPILOT_KERNEL_CACHE", str(Path.home() / ".cache" / "specpilot" / "kernels"))))
    # Agent memory: a SQLite path or sqlite:/// URL.
    memory_url: str = field(default_factory=lambda: _env(
        "SPECPILOT_MEMORY", str(Path.home() / ".cache" / "specpilot" / "memory.sqlite")))
    # OpenAI-compatible endpoint for the LLM proposer (optional).
    llm_base_url: str = field(default_factory=lambda: _env("SPECPILOT_LLM_BASE_URL", ""))
    llm_model: str = field(default_factory=lambda: _env("SPECPILOT_LLM_MODEL", ""))
    llm_api_key: str = field(default_factory=lambda: _env("SPECPILOT_LLM_API_KEY", _env("OPENAI_API_KEY", "")))
    # CUDA graphs for the engine's step functions (1 = on where a GPU is used).
    cuda_graphs: bool = field(default_factory=lambda: _env("SPECPILOT_CUDA_GRAPHS", "1") == "1")
    # One-token steps through our GEMV with the norm / SwiGLU gate fused in (models/gemv_fusion.py);
    # 0 = cuBLAS and the separate kernels, as before it was measured faster.
    fused_gemv: bool = field(default_factory=lambda: _env("SPECPILOT_FUSED_GEMV", "1") == "1")
    # Steps of 2..16 token rows (verify, draft) through our skinny tensor-core GEMM
    # (models/skinny_linear.py): verify 4.74 vs 5.10 ms with cuBLAS on the Qwen3-8B shape (H200).
    skinny_gemm: bool = field(default_factory=lambda: _env("SPECPILOT_SKINNY_GEMM", "1") == "1")


def get() -> Settings:
    return Settings()


def zoo_pair(settings: Settings | None = None):
    """(target_dir, drafter_dir) of the zoo pair, or None when it is absent."""
    zoo = (settings or get()).zoo
    target, drafter = zoo / "code-tiny", zoo / "code-tiny-dflash-b16"
    if (target / "config.json").exists() and (drafter / "config.json").exists():
        return target, drafter
    return None
