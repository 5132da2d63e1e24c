"""Pure-torch ground truth of split12 format v1 (docs/CONTRACTS.md, csrc/include/specpilot/split12_format.h).

`pack` / `unpack` are bit-exact for every bf16 bit pattern (±0, subnormals, ±inf, NaN payloads);
the C++ packer must produce the very same planes. `gemv_reference` is y = x @ W.T in fp64, the
tolerance reference for the fp32 kernels.
"""
from dataclasses import dataclass

import torch

FORMAT_NAME = "split12"
FORMAT_VERSION = 1
KPAD_MULTIPLE = 32
MAX_BASE = 120  # base + 7 <= 127, the largest (e >> 1)
PLANES = ("lo", "codes", "base", "esc_rowptr", "esc_col", "esc_val")
PLANE_DTYPES = {"lo": torch.uint8, "codes": torch.uint8, "base": torch.uint8,
                "esc_rowptr": torch.int32, "esc_col": torch.int32, "esc_val": torch.int16}


def round_up_kpad(k: int) -> int:
    return (k + KPAD_MULTIPLE - 1) // KPAD_MULTIPLE * KPAD_MULTIPLE


@dataclass
class Split12Tensor:
    """The planes of one [N, K] bf16 matrix (see the format header for their meaning)."""
    lo: torch.Tensor          # uint8 [N, kpad]
    codes: torch.Tensor       # uint8 [N, kpad/2]
    base: torch.Tensor        # uint8 [N]
    esc_rowptr: torch.Tensor  # int32 [N+1]
    esc_col: torch.Tensor     # int32 [E]
    esc_val: torch.Tensor     # int16 [E], bf16 bit patterns
    N: int
    K: int

    @property
    def kpad(self) -> int:
        return round_up_kpad(self.K)

    @property
    def escapes(self) -> int:
        return int(self.esc_col.numel())

    def planes(self) -> dict:
        return {name: getattr(self, name) for name in PLANES}

    def nbytes(self) -> int:
        """Every stored byte: both planes (padding included), bases and the escape table."""
        return sum(t.numel() * t.element_size() for t in self.planes().values())

    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes() / max(1, self.N * self.K)

    def to(self, device) -> "Split12Tensor":
        return Split12Tensor(**{k: v.to(device) for k, v in self.planes().items()}, N=self.N, K=self.K)

    def validate(self) -> "Split12Tensor":
        """Shapes, dtypes, devices and the escape table; ValueError naming what is wrong."""
        N, K, kpad = self.N, self.K, self.kpad
        if N < 0 or K < 1:
            raise ValueError(f"split12: need N >= 0 and K >= 1, got N={N}, K={K}")
        E = self.escapes
        want = {"lo": (N, kpad), "codes": (N, kpad // 2), "base": (N,), "esc_rowptr": (N + 1,),
                "esc_col": (E,), "esc_val": (E,)}
        device = self.lo.device
        for name, shape in want.items():
            t = getattr(self, name)
            if t.dtype != PLANE_DTYPES[name] or tuple(t.shape) != shape or t.device != device:
                raise ValueError(f"split12: plane {name} must be {PLANE_DTYPES[name]} {list(shape)} on {device}, "
                                 f"got {t.dtype} {list(t.shape)} on {t.device}")
        rp = self.esc_rowptr.cpu().long()
        if int(rp[0]) != 0 or int(rp[-1]) != E or bool((rp[1:] < rp[:-1]).any()):
            raise ValueError(f"split12: esc_rowptr must rise from 0 to E={E}, got {rp[0].item()}..{rp[-1].item()}")
        if E and (int(self.esc_col.min()) < 0 or int(self.esc_col.max()) >= K):
            raise ValueError(f"split12: esc_col outside [0, K={K}): min {int(self.esc_col.min())}, "
                             f"max {int(self.esc_col.max())}")
        if N and int(self.base.max()) > MAX_BASE:
            raise ValueError(f"split12: base must be <= {MAX_BASE}, got max {int(self.base.max())}")
        return self


def _bits(w: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K] -> its bit patterns as int32 in 0..65535."""
    if w.dtype != torch.bfloat16 or w.dim() != 2:
        raise ValueError(f"split12: expected a 2-D bfloat16 matrix, got {w.dtype} {list(w.shape)}")
    return w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def choose_bases(half_exp: torch.Tensor) -> torch.Tensor:
    """half_exp (e >> 1) [N, K] -> base [N]: the window of 8 classes holding the most weights,
    the smallest such base on ties."""
    N = half_exp.shape[0]
    hist = torch.zeros(N, 128, dtype=torch.int64)
    hist.scatter_add_(1, half_exp.long(), torch.ones_like(half_exp, dtype=torch.int64))
    cum = torch.nn.functional.pad(hist.cumsum(1), (1, 0))  # [N, 129]
    window = cum[:, 8:8 + MAX_BASE + 1] - cum[:, :MAX_BASE + 1]  # [N, 121]: count in [b, b+7]
    return window.argmax(1)  # first maximum = smallest base


def pack(w: torch.Tensor) -> Split12Tensor:
    """bf16 [N, K] (any device; computed on the CPU) -> Split12Tensor. Bit-exact."""
    bits = _bits(w.cpu())  # [N, K]
    N, K = bits.shape
    if K < 1:
        raise ValueError(f"split12: K must be >= 1, got shape {list(w.shape)}")
    kpad = round_up_kpad(K)
    half_exp = (bits >> 8) & 0x7F
    base = choose_bases(half_exp) if N else torch.zeros(0, dtype=torch.int64)
    cls = half_exp - base[:, None]
    inside = (cls >= 0) & (cls <= 7)
    code = ((bits >> 15) << 3) | torch.where(inside, cls, torch.zeros_like(cls))  # [N, K]
    code = torch.nn.functional.pad(code, (0, kpad - K)).view(N, kpad // 8, 2, 4)  # j<4 low nibble, j>=4 high
    codes = (code[:, :, 0, :] | (code[:, :, 1, :] << 4)).reshape(N, kpad // 2)
    lo = torch.nn.functional.pad(bits & 0xFF, (0, kpad - K))
    rows, cols = torch.nonzero(~inside, as_tuple=True)  # row-major: sorted within a row
    counts = torch.bincount(rows, minlength=N)
    rowptr = torch.zeros(N + 1, dtype=torch.int64)
    rowptr[1:] = counts.cumsum(0)
    return Split12Tensor(
        lo=lo.to(torch.uint8), codes=codes.to(torch.uint8), base=base.to(torch.uint8),
        esc_rowptr=rowptr.to(torch.int32), esc_col=cols.to(torch.int32),
        esc_val=bits[rows, cols].to(torch.int16), N=N, K=K)


def unpack(p: Split12Tensor) -> torch.Tensor:
    """Split12Tensor -> bf16 [N, K] on the planes' device. Bit-exact."""
    p.validate()
    N, K, kpad = p.N, p.K, p.kpad
    c = p.codes.to(torch.int32).view(N, kpad // 8, 1, 4)
    code = torch.cat([c & 0xF, c >> 4], dim=2).reshape(N, kpad)[:, :K]  # [N, K]
    hi = ((code & 8) << 4) | ((code & 7) + p.base.to(torch.int32)[:, None])
    bits = (hi << 8) | p.lo[:, :K].to(torch.int32)
    rows = torch.repeat_interleave(torch.arange(N, device=bits.device),
                                   (p.esc_rowptr[1:] - p.esc_rowptr[:-1]).long())
    bits[rows, p.esc_col.long()] = p.esc_val.to(torch.int32) & 0xFFFF
    return bits.to(torch.int16).view(torch.bfloat16)  # int32 -> int16 keeps the low 16 bits


def gemv_reference(x: torch.Tensor, p: "Split12Tensor | torch.Tensor") -> torch.Tensor:
    """y = x @ W.T in fp64: x [..., K], W = unpack(p) (or a bf16 [N, K] matrix) -> fp64 [..., N]."""
    w = unpack(p) if isinstance(p, Split12Tensor) else p
    return x.double() @ w.double().T
