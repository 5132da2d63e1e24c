// Launchers of the fused elementwise kernels around the decoder's GEMMs (csrc/cuda/fused_norm.cu,
// rope_cache.cu, silu_mul.cu). Torch-free: bf16 tensors travel as uint16 bit patterns, the stream
// as a cudaStream_t in a void*. Each returns a cudaError_t as int (0 = success); the bindings
// (csrc/bindings/fused_ops_cuda.cpp) check shapes, dtypes and alignment before calling.
//
// Exactness (each op against its eager torch formula, python/specpilot/models/fused_ops.py):
// every bf16 rounding step of the eager formula is kept; only the fp32 sum-of-squares order of the
// RMSNorms (and the fp32 expf of SiLU, torch's own formula) may differ from torch's kernels.
#pragma once

#include <cstdint>

namespace specpilot {
namespace fused {

constexpr int kMaxHidden = 32768;  // add_rms_norm row length limit (8 bf16 per 16-byte vector)

// rows x hidden, contiguous rows. sum = bf16(x + delta); normed = bf16(bf16(sum * rstd) * weight),
// rstd = rsqrt(mean(float(sum)^2) + eps) in fp32. delta == nullptr: plain RMSNorm of x (sum is not
// written and may be nullptr). sum == nullptr with a delta: the sum is computed but not stored.
// hidden % 8 == 0 and every pointer 16-byte aligned.
int cuda_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* weight, int64_t rows, int hidden,
                      float eps, uint16_t* sum, uint16_t* normed, void* stream);

// The same with the zero-centred norm of hybrid targets (Qwen3.5 / Qwen3-Next): normed =
// bf16((sum * rstd) * (1 + weight)), all in fp32 with one rounding (transformers' Qwen3NextRMSNorm).
int cuda_zero_centred_add_rms_norm(const uint16_t* x, const uint16_t* delta, const uint16_t* weight, int64_t rows,
                                   int hidden, float eps, uint16_t* sum, uint16_t* normed, void* stream);

// Per-token rows of heads: element (b, t, h, d) at ptr[b * batch_stride + t * token_stride + h * D + d].
struct HeadRows {
  const uint16_t* ptr;
  int64_t batch_stride;
  int64_t token_stride;
  int heads;
};

// q (optional: q.ptr == nullptr, q.heads == 0), k, v: [B, T, heads, D] rows as above.
// q_weight / k_weight [D] (optional, nullptr: no per-head RMSNorm, as LLaMA). cos, sin [T, D]
// (gathered at the tokens' positions), positions [T] (cache slots).
// Writes q_out [B, Hq, T, D] (normed + RoPE), k_cache[b, h, positions[t], :] (normed + RoPE) and
// v_cache[b, h, positions[t], :] (copied); caches are [B, Hkv, slots, D], contiguous. A position
// outside [0, slots) is not written. D in {64, 128, 256}; pointers 2 * D / 64 bytes aligned.
// pdl: launch with programmatic dependent launch (the kernel waits before its first read).
int cuda_qk_norm_rope_cache(HeadRows q, HeadRows k, HeadRows v, const uint16_t* q_weight,
                            const uint16_t* k_weight, const uint16_t* cos, const uint16_t* sin,
                            const int64_t* positions, int batch, int tokens, int head_dim, float eps,
                            uint16_t* q_out, uint16_t* k_cache, uint16_t* v_cache, int64_t slots, bool pdl,
                            void* stream);

// gate_up [rows, 2I] = [gate | up] -> out [rows, I] = bf16(bf16(silu(gate)) * up), silu in fp32 as
// torch: x / (1 + expf(-x)). Contiguous; 16-byte loads when I % 8 == 0 and the pointers allow.
int cuda_silu_mul(const uint16_t* gate_up, int64_t rows, int64_t inter, uint16_t* out, void* stream);

}  // namespace fused
}  // namespace specpilot
