"""The engine: static KV caches, (CUDA-graphed) step functions, the AR and speculative loops."""
from .engine import Engine  # noqa: F401
from .result import GenerationResult  # noqa: F401

__all__ = ["Engine", "GenerationResult"]
