"""Which implementation of each op is live.

An op family registers its implementations in priority order with a predicate that says whether
it can run here (`register`). `live_implementations()` reports, per op, the first that can; the
`specpilot env` command prints it. Variants integrated by the agent loop are written to a manifest
(`integrate_variant`; the agents' default file is `variants_file()`) and dispatched only by an
engine whose EngineConfig.variants_manifest names that file (kernels/dispatch.py).
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

    for module in ("specpilot.formats.split12.ops", "specpilot.ops.norm_rope", "specpilot.ops.zero_centred",
                   "specpilot.ops.linear",
                   "specpilot.kernels.decode_attention", "specpilot.kernels.paged_attention"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def variants_file():
    """The manifest the agent loop writes its integrated variants to."""
    return settings.get().kernel_cache.parent / "integrated_variants.json"


def integrated_variant(gpu: str, op: str, shape: tuple, path=None) -> dict | None:
    """The agent-validated variant for this GPU, op and shape in the manifest `path` (default
    variants_file()), or None."""
    path = variants_file() if path is None else path
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return table.get(f"{gpu}|{op}|{'x'.join(map(str, shape))}")


def variant_key(gpu: str, op: str, shape: tuple) -> str:
    return f"{gpu}|{op}|{'x'.join(map(str, shape))}"


def _write_table(table: dict) -> None:
    """Atomic replace: a reader sees the old table or the new one, never half a file."""
    import os
    import tempfile

    path = variants_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def integrate_variant(gpu: str, op: str, shape: tuple, record: dict) -> dict | None:
    """Make `record` the integrated variant for (gpu, op, shape); returns the one it replaced.
    The record names the variant (cand_id, label, params) and where its source is (source_path)."""
    path = variants_file()
    table = json.loads(path.read_text()) if path.exists() else {}
    key = variant_key(gpu, op, shape)
    previous = table.get(key)
    table[key] = record
    _write_table(table)
    return previous


def restore_variant(gpu: str, op: str, shape: tuple, previous: dict | None) -> None:
    """Undo integrate_variant (token forcing failed): put back what was there, or nothing."""
    path = variants_file()
    table = json.loads(path.read_text()) if path.exists() else {}
    key = variant_key(gpu, op, shape)
    if previous is None:
        table.pop(key, None)
    else:
        table[key] = previous
    _write_table(table)
