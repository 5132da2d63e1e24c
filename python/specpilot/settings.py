"""Paths and credentials from environment variables, with their defaults and what they do.
Kernel and mechanism choices are not here: they live in specpilot.config.EngineConfig."""
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # valid for the editable (source) install
EMBEDDED_PAIR = Path(__file__).resolve().parent / "data" / "pair"  # shipped in the package (package_data)
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


def get() -> Settings:
    return Settings()


def zoo_pair(settings: Settings | None = None):
    """(target_dir, drafter_dir) of the zoo pair, or None when it is absent."""
    zoo = (settings or get()).zoo
    target, drafter = zoo / "code-tiny", zoo / "code-tiny-dflash-b16"
    if (target / "config.json").exists() and (drafter / "config.json").exists():
        return target, drafter
    return None


def zoo_is_explicit() -> bool:
    """Whether the user set SPECPILOT_ZOO (then a missing pair there is an error, not a fallback)."""
    return bool(os.environ.get("SPECPILOT_ZOO"))


def embedded_pair():
    """(target_dir, drafter_dir) of the small trained pair shipped inside the package: a Qwen3-layout
    code model and its DFlash drafter (data/pair/README.md says how it was trained and what it accepts)."""
    target, drafter = EMBEDDED_PAIR / "target", EMBEDDED_PAIR / "drafter"
    if not ((target / "config.json").exists() and (drafter / "config.json").exists()):
        raise FileNotFoundError(f"the embedded model pair is missing from {EMBEDDED_PAIR} (a broken install: "
                                "reinstall specpilot)")
    return target, drafter
