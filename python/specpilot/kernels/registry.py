"""Which implementation of each op is live.

An op family registers its implementations in priority order with a predicate that says whether
it can run here (`register`). `live_implementations()` reports, per op, the first that can; the
`specpilot env` command prints it. Variants integrated by the agent loop are looked up per
(GPU, op, shape) with `integrated_variant` and take precedence in the op's own dispatch.
"""
import json
from collections import OrderedDict
from typing import Callable

from specpilot import settings

_IMPLS: "OrderedDict[str, list[tuple[str, Callable[[], bool]]]]" = OrderedDict()


def register(op: str, impl: str, available: Callable[[], bool]) -> None:
    impls = _IMPLS.setdefault(op, [])
    if impl not in [name for name, _ in impls]:
        impls.append((impl, available))


def _safe(pred) -> bool:
    try:
        return bool(pred())
    except Exception:  # an unavailable backend (no GPU, no extension) simply is not live
        return False


def live_implementations() -> dict:
    _import_op_families()
    return {op: next((name for name, pred in impls if _safe(pred)), "none") for op, impls in _IMPLS.items()}


def _import_op_families() -> None:
    # Importing an op family's Python module registers its implementations.
    import importlib

    for module in ("specpilot.formats.split12.ops",):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def variants_file():
    return settings.get().kernel_cache.parent / "integrated_variants.json"


def integrated_variant(gpu: str, op: str, shape: tuple) -> dict | None:
    """The agent-validated variant for this GPU, op and shape, or None."""
    path = variants_file()
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return table.get(f"{gpu}|{op}|{'x'.join(map(str, shape))}")
