"""SpecPilot: lossless speculative decoding with parallel (block) drafters.

The public API, four names::

    from specpilot import Engine, EngineConfig, embedded_pair, load_pair

    target, drafter, tokenizer = load_pair(*embedded_pair(), device="cpu", dtype="fp32")
    engine = Engine(target, drafter, max_seq_len=512, config=EngineConfig())
    result = engine.generate_spec(tokenizer.encode("def add(a, b):"), max_new_tokens=64)

- `load_pair(target_dir, drafter_dir, device, dtype, weights=None) -> (target, drafter, tokenizer)`:
  a Qwen3 / LLaMA-3.x target from a Hugging Face folder (bf16 or split12-packed) or a Hugging Face
  id already in the local HF cache (never downloaded), and its DFlash drafter; `weights` "bf16" /
  "split12" converts at load, None runs the weights as stored.
- `embedded_pair() -> (target_dir, drafter_dir)`: the small trained code model and its DFlash drafter
  shipped inside the package (what `specpilot demo` runs without a zoo).
- `Engine(target, drafter=None, max_seq_len=4096, config=EngineConfig())`: static caches and the
  decode loops. `generate_ar` (target alone) and `generate_spec` (speculative) return a
  `GenerationResult` (tokens, acceptance lengths, tau, prefill and decode seconds); greedy
  `generate_spec` gives exactly `generate_ar`'s tokens.
- `EngineConfig`: a frozen dataclass holding every kernel / mechanism choice (README: the
  configuration table). The defaults are the fastest measured; fallbacks stay automatic.

The names load on first use, so `import specpilot` stays cheap (no torch import).
"""

__version__ = "0.1.0"

# name -> module that defines it, imported on first access (PEP 562).
_LAZY = {"Engine": "specpilot.engine",
         "EngineConfig": "specpilot.config",
         "load_pair": "specpilot.models.loading",
         "embedded_pair": "specpilot.settings"}

__all__ = ["Engine", "EngineConfig", "embedded_pair", "load_pair", "__version__"]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'specpilot' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value          # later accesses skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
