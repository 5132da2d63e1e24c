"""Which tensors get packed, and what packing them costs (bits/weight counts every stored byte:
both planes with their padding, the per-row bases and the escape table)."""
from dataclasses import asdict, dataclass

import torch

from . import ops
from .reference import Split12Tensor

DEFAULT_MAX_BITS = 14.0  # a matrix that would cost more than this stays bf16 (tiny K pays 40 bits/row)


@dataclass
class TensorStats:
    name: str
    shape: list
    weights: int
    escapes: int
    escape_rate: float
    bits_per_weight: float
    stored_bytes: int
    distinct_exponents: int   # of the 256 bf16 exponents, how many occur
    window_coverage: float    # share of weights inside their row's 16-exponent window
    packed: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def is_packable(t: torch.Tensor) -> bool:
    """2-D bf16 matrices are packed; everything else (norms, biases, ints) is copied as is."""
    return t.dim() == 2 and t.dtype == torch.bfloat16 and t.shape[1] >= 1 and t.shape[0] >= 1


def stats_of(name: str, p: Split12Tensor, w: torch.Tensor | None = None) -> TensorStats:
    """Stats of a packed matrix; w (its bf16 source) only speeds up the exponent count."""
    if w is None:
        w = ops.unpack(p)
    exps = (w.contiguous().view(torch.int16).to(torch.int32) >> 7) & 0xFF
    weights = p.N * p.K
    return TensorStats(
        name=name, shape=[p.N, p.K], weights=weights, escapes=p.escapes,
        escape_rate=p.escapes / max(1, weights), bits_per_weight=p.bits_per_weight(), stored_bytes=p.nbytes(),
        distinct_exponents=int(torch.unique(exps).numel()),
        window_coverage=1.0 - p.escapes / max(1, weights))


def pack_tensor(name: str, w: torch.Tensor, max_bits_per_weight: float = DEFAULT_MAX_BITS):
    """-> (Split12Tensor or None when it stays bf16, TensorStats)."""
    if not is_packable(w):
        raise ValueError(f"{name}: only 2-D bfloat16 matrices are packed, got {w.dtype} {list(w.shape)}")
    p = ops.pack(w)
    st = stats_of(name, p, w)
    if st.bits_per_weight > max_bits_per_weight:
        st.packed = False
        return None, st
    return p, st


def summarize(stats: list) -> dict:
    """Totals over the packed tensors: the numbers `specpilot stats` prints last."""
    packed = [s for s in stats if s.packed]
    weights = sum(s.weights for s in packed)
    stored = sum(s.stored_bytes for s in packed)
    escapes = sum(s.escapes for s in packed)
    return {
        "bits_per_weight": 8.0 * stored / max(1, weights),
        "escapes": escapes,
        "escape_rate": escapes / max(1, weights),
        "tensors": len(packed),
        "kept_bf16": [s.name for s in stats if not s.packed],
        "weights": weights,
        "stored_bytes": stored,
    }
