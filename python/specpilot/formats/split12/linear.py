"""nn.Linear replacements over the split12 kernels, and the swap the engine calls for
weights="split12".

Exactness: Split12Linear(W)(x) == Bf16Linear(W)(x) bit for bit (same kernel order); both differ
from torch's nn.Linear only by fp32 summation order (see ops.py for the tolerance).
"""
from dataclasses import dataclass, field

import torch
from torch import nn

from . import ops
from .pack import DEFAULT_MAX_BITS, pack_tensor, summarize
from .reference import PLANES, Split12Tensor


def _flatten(x: torch.Tensor, K: int, who: str) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        raise ValueError(f"{who}: x must be bfloat16 (the kernels read bf16 activations), got {x.dtype}")
    if x.shape[-1] != K:
        raise ValueError(f"{who}: x must end in K={K}, got shape {list(x.shape)}")
    return x.reshape(-1, K).contiguous()  # [M, K], M = product of the leading dims


class Split12Linear(nn.Module):
    """y = x @ W.T with W stored as split12 planes (buffers: they move with .to() and state_dict)."""

    def __init__(self, packed: Split12Tensor, kernel: str = "simt"):
        super().__init__()
        packed.validate()
        self.kernel = kernel  # ops.KERNELS: "simt" (CPU-identical order), "tc" / "skinny" (CUDA), "dense"
        self.in_features, self.out_features = packed.K, packed.N
        for name, t in packed.planes().items():
            self.register_buffer(name, t)

    @classmethod
    def from_weight(cls, w: torch.Tensor, kernel: str = "simt") -> "Split12Linear":
        return cls(ops.pack(w), kernel)

    def packed(self) -> Split12Tensor:
        return Split12Tensor(**{name: getattr(self, name) for name in PLANES}, N=self.out_features, K=self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        y = ops.split12_linear(_flatten(x, self.in_features, "Split12Linear"), self.packed(), kernel=self.kernel)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"escapes={self.esc_col.numel()}, kernel={self.kernel}")


class Bf16Linear(nn.Module):
    """The bf16 twin: plain bf16 weight, the same kernel order as Split12Linear."""

    def __init__(self, weight: torch.Tensor, kernel: str = "simt"):
        super().__init__()
        self.kernel = kernel
        if weight.dim() != 2 or weight.dtype != torch.bfloat16:
            raise ValueError(f"Bf16Linear: weight must be 2-D bfloat16, got {weight.dtype} {list(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.detach().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        y = ops.bf16_linear(_flatten(x, self.in_features, "Bf16Linear"), self.weight, kernel=self.kernel)
        return y.view(*x.shape[:-1], self.out_features)


@dataclass
class SwapReport:
    swapped: list = field(default_factory=list)  # module names now Split12Linear / Bf16Linear
    kept: dict = field(default_factory=dict)     # module name -> why it stayed an nn.Linear
    stats: list = field(default_factory=list)    # TensorStats of every packed candidate

    def summary(self) -> dict:
        return {**summarize(self.stats), "swapped": len(self.swapped), "kept": self.kept}


def swap_linears(module: nn.Module, names_predicate=None, kind: str = "split12",
                 max_bits_per_weight: float = DEFAULT_MAX_BITS, kernel: str = "simt") -> SwapReport:
    """Replace every bf16, bias-free nn.Linear in `module` (whose name passes names_predicate) by
    Split12Linear (kind="split12") or Bf16Linear (kind="bf16"), in place. Matrices that would cost
    more than max_bits_per_weight stay nn.Linear and are listed in report.kept. Tied weights are
    packed once per module that uses them (the LM head gets its own planes). kernel: "simt"
    (CUDA cores, the CPU's order), "tc" or "skinny" (tensor cores; CUDA only) or "dense" (see ops.py)."""
    if kind not in ("split12", "bf16"):
        raise ValueError(f"swap_linears: kind must be 'split12' or 'bf16', got {kind!r}")
    if kernel not in ops.KERNELS:
        raise ValueError(f"swap_linears: kernel must be one of {ops.KERNELS}, got {kernel!r}")
    report = SwapReport()
    targets = [(name, m) for name, m in module.named_modules() if type(m) is nn.Linear]
    for name, lin in targets:
        if names_predicate is not None and not names_predicate(name):
            continue
        if lin.bias is not None:
            report.kept[name] = "has a bias"
            continue
        if lin.weight.dtype != torch.bfloat16:
            report.kept[name] = f"weight is {lin.weight.dtype}, not bfloat16"
            continue
        if kind == "bf16":
            new = Bf16Linear(lin.weight.data, kernel)
        else:
            packed, st = pack_tensor(name, lin.weight.data, max_bits_per_weight)
            report.stats.append(st)
            if packed is None:
                report.kept[name] = f"{st.bits_per_weight:.3f} bits/weight > budget {max_bits_per_weight}"
                continue
            new = Split12Linear(packed, kernel)
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, child, new)
        report.swapped.append(name)
    return report
