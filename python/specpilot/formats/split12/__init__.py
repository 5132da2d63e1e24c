"""split12: lossless 12-bit bf16 weights (format v1, docs/CONTRACTS.md).

reference.py  pure-torch ground truth (pack / unpack / fp64 gemv)
ops.py        the C++ / CUDA ops (pack, unpack, split12_linear, bf16_linear)
pack.py       which tensors are packed and what they cost (bits/weight, escapes)
linear.py     Split12Linear / Bf16Linear modules and swap_linears
io.py         split12 checkpoint folders (pack / unpack / stats commands)
"""
from .reference import FORMAT_NAME, FORMAT_VERSION, Split12Tensor, gemv_reference

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Split12Tensor", "gemv_reference"]
