"""Target (Qwen3 / LLaMA-3.x) and DFlash drafter modules, and their HF checkpoint loaders."""
from .loading import load_drafter, load_pair, load_target, load_tokenizer, stop_ids_for  # noqa: F401

__all__ = ["load_target", "load_drafter", "load_pair", "load_tokenizer", "stop_ids_for"]
