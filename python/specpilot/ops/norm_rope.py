"""The norm / rope family (and the SwiGLU gate): the elementwise work around the decoder's GEMMs, as
fused ops with their eager torch references beside them.

  add_rms_norm(x, delta, weight, eps) -> (x + delta, RMSNorm(x + delta))  residual add + the next norm
  qk_norm_rope_cache(q, k, v, ...)    -> q_out    q/k head norm + RoPE + the K/V cache write
  silu_mul(gate_up)                   -> silu(gate) * up
  rms_normalize, rotate_half, apply_rope: the reference formulas (HF Qwen3/LLaMA arithmetic).

Dispatch: the CUDA kernels (torch.ops.specpilot.*, csrc/cuda/{fused_norm,rope_cache,silu_mul}.cu) run
when every tensor is CUDA bf16 in a layout they take, the extension has them, the running
EngineConfig.fused_kernels is on (the default) and no torch.compile trace is running (the compiled layers
fuse the reference themselves). Otherwise the eager reference runs. Like the attention backend, the
choice is read when a step runs eagerly or is captured into a CUDA graph: captured graphs keep theirs.

Exactness: the eager reference is the models' arithmetic op for op (fp32 statistics, bf16 rounding
after each op as HF), so CPU and fp32 results are unchanged bit for bit. The CUDA kernels keep every
bf16 rounding step of the reference and differ from it only by the fp32 sum-of-squares order of the
RMSNorms (normed values within 1 bf16 ulp; residual sums, LLaMA's RoPE and the V writes are
bit-identical) and possibly expf rounding inside SiLU. bf16 engines with the kernels on are held to
token forcing against stock (verify/forcing.py), not to bit identity with the kernels off.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specpilot import _ext, config
from specpilot.kernels import decode_attention, registry

OPS = ("add_rms_norm", "qk_norm_rope_cache", "silu_mul")
ROPE_HEAD_DIMS = (64, 128, 256)        # what csrc/cuda/rope_cache.cu instantiates
MAX_NORM_HIDDEN = 32768                # csrc/include/specpilot/fused_ops.h kMaxHidden

def fused_kernels_enabled() -> bool:
    return config.current().fused_kernels


@functools.lru_cache(maxsize=None)
def _cuda_ops():
    """torch.ops.specpilot when the extension was built with the fused CUDA ops, else None."""
    try:
        if not _ext.has_cuda_kernels():
            return None
        ops = _ext.ops()
    except RuntimeError:                 # extension not built: the references still work
        return None
    return ops if all(hasattr(ops, name) for name in OPS) else None


def _kernels_for(*tensors):
    """The ops namespace if the CUDA kernels may run on these tensors (None entries ignored)."""
    if not fused_kernels_enabled() or torch.compiler.is_compiling():
        return None
    for t in tensors:
        if t is not None and (not t.is_cuda or t.dtype != torch.bfloat16):
            return None
    return _cuda_ops()


def _aligned(t: torch.Tensor, nbytes: int) -> bool:
    return t.data_ptr() % nbytes == 0


# -- references ------------------------------------------------------------------------------------
def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) computed in fp32 and rounded to x's dtype (HF's order: the weight is
    applied after this rounding, by the caller)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D] (already gathered at the tokens' positions)."""
    return x * cos + rotate_half(x) * sin


# -- fused ops -------------------------------------------------------------------------------------
def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(sum, normed): sum = x + delta (x itself when delta is None), normed = rms_normalize(sum) * weight.
    One kernel on CUDA bf16 instead of an add and the norm's kernels."""
    ops = _kernels_for(x, delta, weight)
    h = x.shape[-1]
    if (ops is not None and h % 8 == 0 and h <= MAX_NORM_HIDDEN and x.is_contiguous() and _aligned(x, 16)
            and _aligned(weight, 16) and weight.is_contiguous()
            and (delta is None or (delta.shape == x.shape and delta.is_contiguous() and _aligned(delta, 16)))):
        normed = torch.empty_like(x)
        total = None if delta is None else torch.empty_like(x)
        ops.add_rms_norm(x, delta, weight, eps, total, normed)
        return (x if total is None else total), normed
    total = x if delta is None else x + delta
    return total, rms_normalize(total, eps) * weight


def _head_rows_ok(t: torch.Tensor) -> bool:
    """[B, T, H, D] with contiguous heads and elements (any batch / token stride), as the kernel reads."""
    d = t.shape[-1]
    return (t.dim() == 4 and t.stride(3) == 1 and (t.stride(2) == d or t.shape[2] == 1)
            and t.stride(0) % (d // 64) == 0 and t.stride(1) % (d // 64) == 0 and _aligned(t, 8))


def rope_kernel_takes(q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache) -> bool:
    """Whether qk_norm_rope_cache runs these arguments through the CUDA kernel (else torch ops)."""
    return (_kernels_for(q, k, v, q_weight, k_weight, cos, sin, k_cache, v_cache) is not None
            and k.shape[-1] in ROPE_HEAD_DIMS and positions.is_cuda and positions.dtype == torch.long
            and all(_head_rows_ok(t) for t in (q, k, v) if t is not None)
            and all(t.is_contiguous() for t in (q_weight, k_weight, cos, sin, positions, k_cache, v_cache)
                    if t is not None))


def qk_norm_rope_cache(q, k, v, q_weight, k_weight, cos, sin, positions, eps: float, k_cache, v_cache):
    """Attention's elementwise prologue. q [B, T, Hq, D] (or None: context K/V only), k and v
    [B, T, Hkv, D] (views of the projections' outputs are fine); q_weight / k_weight [D] the per-head
    RMSNorm weights (None: no q/k norm, as LLaMA); cos/sin [T, D] at the tokens' positions;
    positions [T] int64, the cache slots. Writes rope(norm(k)) and v into k_cache / v_cache
    [B, Hkv, S, D] at `positions`; returns rope(norm(q)) [B, Hq, T, D] (None without q)."""
    d = k.shape[-1]
    if rope_kernel_takes(q, k, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache):
        q_out = None if q is None else q.new_empty(q.shape[0], q.shape[2], q.shape[1], d)
        decode_attention.sync_pdl()                       # the attention path's PDL flag
        _cuda_ops().qk_norm_rope_cache(q, k, v, q_weight, k_weight, cos, sin, positions, eps, k_cache, v_cache, q_out)
        return q_out
    if q is not None:
        if q_weight is not None:
            q = rms_normalize(q, eps) * q_weight
        q = apply_rope(q.transpose(1, 2), cos, sin)
    if k_weight is not None:
        k = rms_normalize(k, eps) * k_weight
    k_cache.index_copy_(2, positions, apply_rope(k.transpose(1, 2), cos, sin))
    v_cache.index_copy_(2, positions, v.transpose(1, 2))
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] = [gate | up] -> silu(gate) * up [..., I] (each op rounded to the dtype, as eager)."""
    ops = _kernels_for(gate_up)
    inter = gate_up.shape[-1] // 2
    if ops is not None and gate_up.is_contiguous():
        out = gate_up.new_empty(*gate_up.shape[:-1], inter)
        ops.silu_mul(gate_up, out)
        return out
    gate, up = gate_up.split(inter, dim=-1)
    return F.silu(gate) * up


def _cuda_live() -> bool:
    return _cuda_ops() is not None and torch.cuda.is_available()


for _op in OPS:
    registry.register(_op, "cuda-sm90a", _cuda_live)
    registry.register(_op, "torch-eager", lambda: True)
