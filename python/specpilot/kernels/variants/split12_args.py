"""The split12 format v1 tensors as the GEMV launch contract passes them (docs/CONTRACTS.md).

`pack` runs on the weight's own device (the gate packs fresh random 24576x4096 weights several
times per candidate on the GPU, where the CPU-only reference packer would dominate); its planes are
tested identical to `specpilot.formats.split12.reference.pack`. Lossless: unpack(pack(W)) == W bits.
"""
import torch

from specpilot.formats.split12.reference import Split12Tensor


def contract_args(a: Split12Tensor) -> tuple:
    """The planes as the launch contract's leading arguments (the format's plane order)."""
    return tuple(a.planes().values())


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def pack(w: torch.Tensor) -> Split12Tensor:
    """W bf16 [N, K] -> split12 planes on W's device (bit-exact, same planes as the reference)."""
    if w.dtype != torch.bfloat16 or w.dim() != 2 or w.shape[1] < 1:
        raise ValueError(f"split12 packs a 2-D bf16 weight with K >= 1, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    kpad = round_up(k, 32)
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF             # [N, K]
    sign, ep = bits >> 15, (bits >> 8) & 0x7F                                   # ep = e >> 1
    lo = torch.zeros(n, kpad, dtype=torch.uint8, device=w.device)
    lo[:, :k] = (bits & 0xFF).to(torch.uint8)
    # base = the start of the 8-wide ep window holding most of the row's weights
    hist = torch.zeros(n, 129, dtype=torch.int32, device=w.device)
    hist[:, 1:].scatter_add_(1, ep.long(), torch.ones_like(ep))
    cum = hist.cumsum(1)                                                        # [N, 129]
    base = (cum[:, 8:] - cum[:, :-8]).argmax(1).to(torch.int32)                 # [N] in 0..120
    cls = ep - base[:, None]
    escaped = (cls < 0) | (cls > 7)
    code = torch.where(escaped, sign << 3, (sign << 3) | cls.clamp(0, 7))
    codes4 = torch.zeros(n, kpad, dtype=torch.int32, device=w.device)
    codes4[:, :k] = code
    grouped = codes4.view(n, kpad // 8, 2, 4)          # [N, groups, nibble half, byte]
    codes = (grouped[:, :, 0, :] | (grouped[:, :, 1, :] << 4)).to(torch.uint8).reshape(n, kpad // 2)
    rows, cols = escaped.nonzero(as_tuple=True)        # row-major, so sorted within a row
    counts = torch.bincount(rows, minlength=n)
    rowptr = torch.zeros(n + 1, dtype=torch.int32, device=w.device)
    rowptr[1:] = counts.cumsum(0).to(torch.int32)
    esc_val = bits[rows, cols].to(torch.int16) if rows.numel() else torch.zeros(0, dtype=torch.int16, device=w.device)
    return Split12Tensor(lo, codes, base.to(torch.uint8), rowptr, cols.to(torch.int32), esc_val, N=n, K=k)


def unpack(a: Split12Tensor) -> torch.Tensor:
    """split12 tensors -> W bf16 [N, K], bit-exact (decodes straight from the contract)."""
    n, k, kpad = a.N, a.K, a.kpad
    byte = a.codes.to(torch.int32).view(n, kpad // 8, 1, 4)
    code = torch.cat([byte & 0xF, byte >> 4], dim=2).reshape(n, kpad)[:, :k]    # [N, K]
    hi = ((code >> 3) << 7) | ((code & 7) + a.base.to(torch.int32)[:, None])
    bits = (hi << 8) | a.lo[:, :k].to(torch.int32)
    rowptr = a.esc_rowptr.long()
    if a.esc_col.numel():
        rows = torch.repeat_interleave(torch.arange(n, device=bits.device), rowptr[1:] - rowptr[:-1])
        bits[rows, a.esc_col.long()] = a.esc_val.to(torch.int32) & 0xFFFF
    return torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.bfloat16)

