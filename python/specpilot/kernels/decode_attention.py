"""The split-KV decode / verify attention kernel (torch.ops.specpilot.decode_attention, CUDA builds).

`decode_attention(q, k, v, last, scale)`: q [B, Hq, T, D] bf16, k/v [B, Hkv, span, D] bf16 (a view
of the cache slots [0, span)), last int64 [T]: key slot j is visible to query row t iff
j <= last[t]. Returns [B, T, Hq * D] bf16 (the layout `ops.attention.attend` returns).
Exactness: softmax(q k^T * scale) v with fp32 scores and accumulation, P rounded to bf16 for the
P.V tensor-core product (as flash attention); within bf16 rounding of an fp64 reference, not
bit-identical to SDPA (tests/test_decode_attention_gpu.py). Outputs and workspace come from
torch.empty (under CUDA-graph capture: the graph's pool), so the op itself allocates nothing.
"""
from __future__ import annotations

import functools

import torch

from specpilot import _ext, config

HEAD_DIMS = (64, 128)
MAX_TOKENS = 32          # csrc/include/specpilot/decode_attention.h kMaxTokens
MAX_GROUPS = 8           # kMaxGroups
MAX_SPLITS = 128         # kMaxSplits
ROWS_PER_CTA = 64        # query rows (g * T) one CTA handles
MIN_KEYS_PER_SPLIT = 32  # fewer keys per CTA than this costs more in partials than it saves


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this build has the CUDA op (CPU builds do not define it)."""
    return _ext.has_cuda_op("decode_attention")


def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the kernel takes this call (else the caller uses SDPA). Cheap checks first: on CPU
    or in fp32 this never touches the extension."""
    if not (q.is_cuda and q.dtype == torch.bfloat16 and k.dtype == torch.bfloat16 and q.dim() == 4):
        return False
    hq, t, d = q.shape[1], q.shape[2], q.shape[3]
    hkv = k.shape[1]
    return (d in HEAD_DIMS and 1 <= t <= MAX_TOKENS and hkv >= 1 and hq % hkv == 0
            and hq // hkv <= MAX_GROUPS and available())


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_splits(batch: int, kv_heads: int, rows_per_kv_head: int, span: int, sm_count: int,
                   max_splits: int = MAX_SPLITS) -> int:
    """Key splits for a call: enough CTAs to give every SM one, each with >= MIN_KEYS_PER_SPLIT
    keys at a full span, at most max_splits. Depends on the span, not on `last`, so a
    captured graph keeps its grid; splits beyond the visible keys do no work on the device."""
    row_blocks = -(-rows_per_kv_head // ROWS_PER_CTA)
    want = -(-sm_count // (batch * kv_heads * row_blocks))
    return max(1, min(want, span // MIN_KEYS_PER_SPLIT, max_splits))


def decode_attention(q, k, v, last, scale: float, splits: int | None = None,
                     writes_at_last: bool = False) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, span, D] (d contiguous), last int64 [T] -> [B, T, Hq * D].
    writes_at_last: the cache slots this step wrote are exactly `last` (a causal target step), so
    every key below min(last) is older than the kernels before this one and is loaded before the
    PDL wait. Wrong where that is false (the drafter writes context slots below its rows' last)."""
    b, hq, t, d = q.shape
    hkv, span = k.shape[1], k.shape[2]
    if q.stride(-1) != 1 or any(s % 8 for s in q.stride()[:3]):
        q = q.contiguous()
    if splits is None:
        splits = default_splits(b, hkv, (hq // hkv) * t, span, _sm_count(q.device))
    last = last.to(dtype=torch.int64).contiguous()
    sync_pdl()
    out = torch.empty((b, t, hq * d), dtype=q.dtype, device=q.device)
    workspace = torch.empty((splits, b * t * hq, d + 1), dtype=torch.float32, device=q.device)
    _ext.ops().decode_attention(q, k, v, last, span, float(scale), out, workspace, bool(writes_at_last))
    return out


def decode_attention_rope(qkv, q_weight, k_weight, cos, sin, positions, eps: float, k_cache, v_cache,
                          kv_len: int, scale: float, num_q_heads: int) -> torch.Tensor:
    """A one-token causal step's qk_norm_rope_cache + decode_attention as one kernel, bit for bit the
    same: qkv [B, 1, (Hq + 2 Hkv) * D] (the QKV projection's output), q_weight / k_weight [D] or None,
    cos / sin [1, D] at the token's position, positions int64 [1] (the slot written and the query's
    position), k/v_cache [B, Hkv, S, D] (slot positions[0] written) -> [B, 1, Hq * D] over slots
    [0, kv_len). The same key splits as decode_attention over the kv_len view, so the same sums."""
    b, hkv, d = qkv.shape[0], k_cache.shape[1], k_cache.shape[3]
    splits = default_splits(b, hkv, num_q_heads // hkv, kv_len, _sm_count(qkv.device))
    sync_pdl()
    out = torch.empty((b, 1, num_q_heads * d), dtype=qkv.dtype, device=qkv.device)
    workspace = torch.empty((splits, b * num_q_heads, d + 1), dtype=torch.float32, device=qkv.device)
    _ext.ops().decode_attention_rope(qkv, q_weight, k_weight, cos, sin, positions, float(eps), k_cache, v_cache,
                                     kv_len, float(scale), out, workspace)
    return out


def fused_rope_enabled() -> bool:
    """Whether a one-token target step runs its rope / cache write inside the attention kernel
    (EngineConfig.attention_fused_rope, measured faster) rather than as its own kernel before it."""
    return config.current().attention_fused_rope and _rope_op_available()


@functools.lru_cache(maxsize=None)
def _rope_op_available() -> bool:
    return _ext.has_cuda_op("decode_attention_rope")


_pdl_applied = [True]    # the op's own default (csrc/bindings/attention_pdl.h)


def sync_pdl() -> None:
    """Makes the attention path (qk_norm_rope_cache, split and combine kernels) launch with
    programmatic dependent launch or not, as the running EngineConfig.attention_pdl says. The op
    reads a process-wide flag at launch, so every launcher of the path calls this first; a CUDA
    graph keeps the value it was captured with."""
    enable = config.current().attention_pdl
    if enable != _pdl_applied[0] and _ext.has_cuda_op("decode_attention_pdl"):
        _ext.ops().decode_attention_pdl(int(enable))
        _pdl_applied[0] = enable


def _register() -> None:
    from specpilot.kernels import registry

    registry.register("decode_attention", "cuda-sm90a", available)
    registry.register("decode_attention", "torch-sdpa", lambda: True)


_register()
