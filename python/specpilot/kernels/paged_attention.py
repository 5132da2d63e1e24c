"""Decode / verify attention for many requests at once over a paged KV pool.

`paged_decode_attention(q, k_pool, v_pool, page_table, page_size, last, scale, out, workspace)`:
q [R, Hq, T, D] (request r's T query rows), k/v_pool [1, Hkv, slots, D] (one pool shared by all
requests), page_table int32 [R, P], last int64 [R, T], out [R, T, Hq * D] and workspace fp32
[splits, R * T * Hq, D + 1] written in place (so the call allocates nothing under CUDA-graph capture).
Query row t of request r sees logical key j iff j <= last[r, t] and j < P * page_size; logical key j
of request r lives at slot page_table[r, j // page_size] * page_size + j % page_size of the pool; head
h reads KV head h // (Hq // Hkv); a row with last < 0 (padding) sees nothing and gets zeros. Only the
page entries of visible keys are read (the others may hold anything, e.g. -1).

On CUDA in bf16 (D 64 / 128, T <= 32, Hq / Hkv <= 8, page_size a power of two) this is the split-KV
kernel (csrc/cuda/decode_attention.cu, PagedKV): each request's keys are cut by its own visible end,
computed on the device, so a captured graph keeps its grid while contexts grow. Elsewhere (CPU, fp32,
fp64) it is `reference`, exact softmax in fp32 or better. The kernel is within bf16 rounding of the
fp64 reference (tests/test_paged_attention_gpu.py), not bit-identical to it.

The kernel cannot check the table's contents without a device sync: a visible key on a page outside
the pool reads as zeros there. `check_page_table` raises a clear error for that (it syncs; the
reference always calls it).
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext
from specpilot.kernels import decode_attention as _decode

MAX_PAGE_SIZE = 1 << 20          # csrc/bindings/attention_cuda.cpp


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not define it)."""
    return _ext.has_cuda_op("paged_decode_attention")


def default_splits(q_shape, kv_heads: int, span: int, device) -> int:
    """Key splits for a call over R requests of up to `span` keys each (decode_attention's rule: enough
    CTAs for every SM). Depends on the span (P * page_size), not on `last`, so a graph keeps its grid."""
    r, hq, t, _ = q_shape
    return _decode.default_splits(r, kv_heads, (hq // kv_heads) * t, span, _decode._sm_count(device))


def new_workspace(splits: int, q_shape, device) -> torch.Tensor:
    """The fp32 workspace [splits, R * T * Hq, D + 1] for q of `q_shape` [R, Hq, T, D]."""
    r, hq, t, d = q_shape
    return torch.empty((splits, r * t * hq, d + 1), dtype=torch.float32, device=device)


def check_arguments(q, k_pool, v_pool, page_table, page_size, last, out=None, workspace=None) -> None:
    """Shapes, dtypes and devices of a call; raises ValueError naming the bad argument."""
    if q.dim() != 4:
        raise ValueError(f"q must be [R, Hq, T, D], got shape {tuple(q.shape)}")
    r, hq, t, d = q.shape
    if k_pool.dim() != 4 or k_pool.shape[0] != 1 or k_pool.shape[3] != d:
        raise ValueError(f"k_pool must be [1, Hkv, slots, D={d}], got shape {tuple(k_pool.shape)}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool shape {tuple(v_pool.shape)} != k_pool shape {tuple(k_pool.shape)}")
    hkv, slots = k_pool.shape[1], k_pool.shape[2]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    for name, x in (("k_pool", k_pool), ("v_pool", v_pool)):
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"{name} is {x.dtype} on {x.device} but q is {q.dtype} on {q.device}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE \
            or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two in 1..{MAX_PAGE_SIZE}, got {page_size!r}")
    if slots < page_size or slots % page_size:
        raise ValueError(f"the pool's {slots} slots must be a positive multiple of page_size={page_size}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != r \
            or page_table.shape[1] < 1 or page_table.device != q.device:
        raise ValueError(f"page_table must be an int32 [R={r}, pages >= 1] on {q.device}, got "
                         f"{page_table.dtype} {tuple(page_table.shape)} on {page_table.device}")
    if last.dtype != torch.int64 or tuple(last.shape) != (r, t) or last.device != q.device:
        raise ValueError(f"last must be an int64 [R={r}, T={t}] on {q.device}, got {last.dtype} "
                         f"{tuple(last.shape)} on {last.device}")
    if out is not None and (tuple(out.shape) != (r, t, hq * d) or out.device != q.device or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous [R={r}, T={t}, Hq*D={hq * d}] on {q.device}, got "
                         f"{tuple(out.shape)} on {out.device}")
    if workspace is not None and (workspace.dtype != torch.float32 or workspace.dim() != 3
                                  or tuple(workspace.shape[1:]) != (r * t * hq, d + 1)
                                  or not 1 <= workspace.shape[0] <= _decode.MAX_SPLITS):
        raise ValueError(f"workspace must be float32 [splits in 1..{_decode.MAX_SPLITS}, {r * t * hq}, {d + 1}], "
                         f"got {workspace.dtype} {tuple(workspace.shape)}")


def _visible_ends(page_table, page_size, last) -> torch.Tensor:
    """kv_end per request: max_t min(last[r, t], P * page_size - 1) + 1, at least 0 (int64 [R])."""
    span = page_table.shape[1] * page_size
    return (last.clamp(-1, span - 1).max(dim=1).values + 1) if last.shape[0] else last.new_zeros(0)


def check_page_table(page_table, page_size: int, last, pool_slots: int) -> None:
    """Every page a visible key lives on is inside the pool (syncs with the device); ValueError else."""
    ends = _visible_ends(page_table, page_size, last)
    pages = page_table.shape[1]
    used = torch.arange(pages, device=page_table.device)[None, :] * page_size < ends[:, None]     # [R, P]
    bad = used & ((page_table < 0) | (page_table >= pool_slots // page_size))
    if bool(bad.any()):
        r, p = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"page_table[{r}, {p}] = {int(page_table[r, p])} is outside the pool of "
                         f"{pool_slots // page_size} pages, and request {r} sees keys on it")


def reference(q, k_pool, v_pool, page_table, page_size: int, last, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v per request over its visible keys, in fp32 (fp64 for fp64 q) ->
    [R, T, Hq * D] in that dtype; rows with last < 0 are zeros."""
    check_arguments(q, k_pool, v_pool, page_table, page_size, last)
    check_page_table(page_table, page_size, last, k_pool.shape[2])
    r, hq, t, d = q.shape
    hkv = k_pool.shape[1]
    g = hq // hkv
    dtype = torch.promote_types(q.dtype, torch.float32)
    ends = _visible_ends(page_table, page_size, last)
    keys = int(ends.max()) if r else 0
    if keys == 0:
        return torch.zeros((r, t, hq * d), dtype=dtype, device=q.device)
    j = torch.arange(keys, device=q.device)
    own = j[None, :] < ends[:, None]                                                   # [R, K]: page entry read
    slots = page_table[:, j // page_size].long() * page_size + j % page_size
    slots = torch.where(own, slots, 0)
    k = k_pool[0][:, slots].to(dtype).transpose(0, 1)                                  # [R, Hkv, K, D]
    v = v_pool[0][:, slots].to(dtype).transpose(0, 1)
    v = torch.where(own[:, None, :, None], v, 0)                                       # slot 0 stands in: unread
    qg = q.to(dtype).reshape(r, hkv, g * t, d)                                         # rows j*T + t of head kv*g + j
    visible = j[None, None, :] <= last.clamp(-1, keys - 1)[:, :, None]                 # [R, T, K]
    visible = visible.repeat(1, g, 1)[:, None]                                         # [R, 1, g*T, K]
    scores = (qg @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    seen = visible.any(dim=-1, keepdim=True)                                           # padding rows see none
    probs = torch.softmax(scores.masked_fill(~seen, 0.0), dim=-1) * seen
    out = probs @ v                                                                     # [R, Hkv, g*T, D]
    return out.reshape(r, hq, t, d).transpose(1, 2).reshape(r, t, hq * d)


def uses_kernel(q, k_pool) -> bool:
    """Whether a call with these tensors runs the CUDA kernel (else the reference)."""
    r, hq, t, d = q.shape
    hkv = k_pool.shape[1]
    return (q.is_cuda and q.dtype == torch.bfloat16 and d in _decode.HEAD_DIMS and 1 <= t <= _decode.MAX_TOKENS
            and hq // hkv <= _decode.MAX_GROUPS and available())


def paged_decode_attention(q, k_pool, v_pool, page_table, page_size: int, last, scale: float, out, workspace,
                           writes_at_last: bool = False) -> None:
    """Writes the attention of every request's rows into `out` (module docstring). writes_at_last:
    the kernels before this one wrote exactly the slots `last` names (a causal target step), so keys
    below each request's min(last) are loaded before the PDL wait (as decode_attention's flag)."""
    check_arguments(q, k_pool, v_pool, page_table, page_size, last, out, workspace)
    if not uses_kernel(q, k_pool):
        out.copy_(reference(q, k_pool, v_pool, page_table, page_size, last, scale).to(out.dtype))
        return
    if q.stride(-1) != 1 or any(s % 8 for s in q.stride()[:3]):
        q = q.contiguous()
    _decode.sync_pdl()
    _ext.ops().paged_decode_attention(q, k_pool, v_pool, page_table, page_size, last.contiguous(), float(scale),
                                      out, workspace, bool(writes_at_last))


def _register() -> None:
    from specpilot.kernels import registry

    registry.register("paged_decode_attention", "cuda-sm90a", available)
    registry.register("paged_decode_attention", "torch-reference", lambda: True)


_register()
